"""What the workflows share: --site and scheduler flags, the Parsl config, the MPI bash app."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from hpcrl.config import load_config
from hpcrl.errors import ConfigError
from hpcrl.sites.parsl_configs import SITES, make_config


def add_site_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--site", required=True, choices=sorted(SITES), help="where the runs go (local: this machine)")
    parser.add_argument("config", nargs="?", help="YAML config (default: the embedded CartPole-v1 job)")
    parser.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value for every run (repeatable)")
    parser.add_argument("--account", help="project to charge (cluster sites)")
    parser.add_argument("--queue", help="PBS queue, Perlmutter QOS, or local-cluster partition")
    parser.add_argument("--walltime", help="walltime of each Parsl block, HH:MM:SS")
    parser.add_argument("--address", help="address of this machine that the compute nodes reach (cluster sites)")


def site_settings(args: argparse.Namespace, nodes_per_block: int, parallel_runs: int, parsl_dir: Path) -> dict:
    """The factory keywords for args.site (each site takes only the ones it knows)."""
    kw: dict = {"run_dir": str(parsl_dir)}
    if args.site == "local":
        kw["parallel_runs"] = parallel_runs
        return kw
    if args.walltime:
        kw["walltime"] = args.walltime
    if args.site in ("local-slurm", "local-cluster"):
        if args.queue:
            kw["partition"] = args.queue
        if args.address:
            kw["address"] = args.address
        if args.site == "local-cluster":
            kw["nodes_per_block"] = nodes_per_block
        return kw
    kw.update(nodes_per_block=nodes_per_block, parallel_runs=parallel_runs)
    if args.account:
        kw["account"] = args.account
    if args.queue:
        kw["qos" if args.site == "perlmutter" else "queue"] = args.queue
    if args.address:
        kw["address"] = args.address
    return kw


def parsl_scripts_on_path() -> None:
    """Parsl starts its interchange and worker pool by script name; a venv used without `activate` lacks them."""
    if shutil.which("interchange.py") is None:
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def base_config(args: argparse.Namespace, extra: list[str] = ()):
    return load_config(args.config, [*args.overrides, *extra])


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def fail(message: str) -> int:
    print(f"error: {message}")
    return 2


__all__ = ["add_site_arguments", "site_settings", "base_config", "stamp", "parsl_scripts_on_path", "make_config", "ConfigError", "fail"]
