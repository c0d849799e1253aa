"""`hpcrl profiles [NAME]`: the cluster profiles a simulated job (launch.runner: sim) can run on.

Without a name: one line per shipped profile (nodes, cores, GPUs). With a name (or a path to a profile YAML):
its nodes, network, costs and where each number comes from.
"""
from __future__ import annotations

import argparse

from hpcrl.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="a shipped profile's name or a profile YAML (default: list them)")


def _nodes(profile) -> str:
    return ", ".join(f"{k.count:,} x {k.name} ({k.cores} cores{f', {k.gpus} GPUs' if k.gpus else ''})"
                     for k in profile.nodes)


def main(args: argparse.Namespace) -> int:
    from hpcrl.cluster_profiles import ProfileError, load_profile, shipped

    try:
        if args.name is None:
            for name in shipped():
                profile = load_profile(name)
                print(f"{name:14s} {profile.total_nodes:>6,} nodes: {_nodes(profile)}")
            print("hpcrl profiles NAME: its costs and sources; run on one: hpcrl run CONFIG -o launch.runner=sim "
                  "-o launch.profile=NAME")
            return 0
        profile = load_profile(args.name)
    except ProfileError as exc:
        raise ConfigError(str(exc)) from None
    print(f"{profile.name}: {profile.description}")
    print(f"  nodes      {_nodes(profile)}")
    net = profile.network
    print(f"  network    {net.latency_seconds * 1e6:g} us latency, {net.bytes_per_second / 1e9:g} GB/s"
          " (rank 0's link shared)")
    for key, value in profile.costs.model_dump().items():
        print(f"  cost       {key:16s} {value}")
    print(f"  stragglers {profile.stragglers.model_dump()}; start {profile.start_seconds:g} s")
    for key, text in profile.sources.items():
        print(f"  source     {key}: {text}")
    return 0
