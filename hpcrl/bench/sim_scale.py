"""Large jobs in virtual time on one core: a Perlmutter-like layout of N nodes, simulated (launch.runner=sim).

Half the nodes GPU nodes of 4 learner groups (one rank, one GPU each), the other half CPU nodes of
``--actors-per-node`` actor ranks (the perlmutter profile with its CPU nodes cut to that many cores); the config's
per-group batch is kept (``algo.train_batch_size`` x groups), every group active, and the job runs for
``--virtual-seconds`` of virtual time, with no periodic checkpoint. A node's actor ranks run as one role
(``launch.sim_actors=node``, docs/sim.md) unless ``--sim-actors rank``. Prints, per job: ranks, virtual env
steps/s sampled and trained on (they differ where ``actors.sync_frac`` drops late fragments) and pushes/s (steady
part), the mean staleness of admitted gradients, the real seconds per virtual
second (after building the roles), the seconds building them took, and the peak memory (run.h5's ``sim_*``
attributes).

    hpcrl bench sim-scale [--nodes 64] [--config CONFIG] [--virtual-seconds 2] [--actors-per-node 64]
                          [--sim-actors node|rank] [--json FILE] [--out DIR] [-o KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

LEARNERS_PER_GPU_NODE = 4
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def profile_for(actors_per_node: int, out: Path, stragglers: dict | None = None) -> Path:
    """The perlmutter profile with CPU nodes of ``actors_per_node`` cores (one actor each), written under ``out``;
    ``stragglers``: the profile's stragglers (slow_share, slow_factor, sigma: docs/sim.md) instead of none."""
    from hpcrl.cluster_profiles import HERE

    data = yaml.safe_load((HERE / "perlmutter.yaml").read_text())
    data["name"] = f"perlmutter-{actors_per_node}-actors-per-cpu-node"
    for kind in data["nodes"]:
        if not kind.get("gpus"):
            kind["cores"] = actors_per_node
    if stragglers:
        data["stragglers"] = stragglers
        data["name"] += "-stragglers-" + "-".join(f"{v:g}" for v in stragglers.values())
    data["description"] = f"perlmutter, {actors_per_node} actor ranks per CPU node ({data['description']})"
    path = out / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _as_recorded(config: str) -> str:
    """A shipped config as ``hpcrl/configs/NAME`` (no machine path in a row kept in docs/results), any other as given."""
    path = Path(config).resolve()
    return f"hpcrl/configs/{path.name}" if path.parent == CONFIGS else config


def run_job(config: str, nodes: int, actors_per_node: int, virtual_seconds: float, out: Path,
            extra: list[str], stragglers: dict | None = None) -> dict:
    from hpcrl.bench.sim_vs_real import measures
    from hpcrl.config import load_config
    from hpcrl.io import read_attrs

    gpu_nodes = max(1, nodes // 2)
    cpu_nodes = max(1, nodes - gpu_nodes)
    groups, actors = gpu_nodes * LEARNERS_PER_GPU_NODE, cpu_nodes * actors_per_node
    per_group = load_config(config, []).algo.train_batch_size
    profile = profile_for(actors_per_node, out, stragglers)
    run_dir = out / f"{Path(config).stem}-{nodes}-nodes" if not stragglers else out / f"{profile.stem}-{nodes}-nodes"
    overrides = ["launch.runner=sim", f"launch.profile={profile}",
                 f"learners.groups={groups}", f"learners.min_active={groups}", f"actors.count={actors}",
                 f"algo.train_batch_size={per_group * groups}", f"stop.max_wall_seconds={virtual_seconds}",
                 "stop.target_return=null", "stop.total_env_steps=1000000000000", "io.tensorboard=false",
                 "io.log_seconds=60", "io.checkpoint_min_seconds=1000000000", f"io.run_dir={run_dir}", *extra]
    res = subprocess.run([sys.executable, "-m", "hpcrl", "-q", "run", config,
                          *[a for o in overrides for a in ("-o", o)]], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{config} on {nodes} nodes: hpcrl run failed ({res.returncode}):\n"
                           f"{res.stdout[-1500:]}{res.stderr[-1500:]}")
    attrs = read_attrs(run_dir / "run.h5")
    got = measures(run_dir, skip=0.2)
    virtual = float(attrs["sim_virtual_seconds"])
    running = float(attrs["sim_real_seconds"]) - float(attrs["sim_setup_seconds"])
    return {"config": _as_recorded(config), "overrides": extra, "stragglers": stragglers, "nodes": nodes,
            "groups": groups, "actors": actors, "ranks": 1 + groups + actors,
            "virtual_seconds": virtual, "env_steps_per_s": got["env_steps_per_s"],
            "trained_steps_per_s": got["trained_steps_per_s"], "pushes_per_s": got["pushes_per_s"],
            "staleness_mean": got["staleness_mean"], "real_per_virtual_second": running / virtual,
            "setup_seconds": float(attrs["sim_setup_seconds"]), "cpu_seconds": float(attrs["sim_cpu_seconds"]),
            "max_rss_gb": float(attrs["sim_max_rss_bytes"]) / 2**30}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench sim-scale", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="64", help="comma-separated node counts (default 64)")
    p.add_argument("--config", default=str(CONFIGS / "cartpole.yaml"), help="default: the shipped cartpole.yaml")
    p.add_argument("--virtual-seconds", type=float, default=2.0, help="virtual seconds each job runs (default 2)")
    p.add_argument("--actors-per-node", type=int, default=64)
    p.add_argument("--sim-actors", choices=("node", "rank"), default="node",
                   help="launch.sim_actors: a node's actor ranks as one role (default), or each rank its own")
    p.add_argument("--stragglers", metavar="SHARE,FACTOR[,SIGMA]",
                   help="a share of the actors slow by FACTOR throughout, and every fragment's time times "
                        "exp(N(0, SIGMA^2)) (the profile's stragglers: docs/sim.md; default none)")
    p.add_argument("--json", help="append each job's row here (JSON lines)")
    p.add_argument("--out", help="keep the run directories here (default: a temporary directory)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    stragglers = None
    if args.stragglers:
        try:
            values = [float(v) for v in args.stragglers.split(",")]
            if not 2 <= len(values) <= 3 or not 0 <= values[0] <= 1 or values[1] < 1 or values[2:3] and values[2] < 0:
                raise ValueError
        except ValueError:
            p.error(f"--stragglers {args.stragglers!r}: SHARE,FACTOR[,SIGMA] with 0 <= SHARE <= 1, FACTOR >= 1, "
                    "SIGMA >= 0")
        stragglers = dict(zip(("slow_share", "slow_factor", "sigma"), values))
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-sim-scale-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{'config':24s} {'nodes':>5s} {'ranks':>6s} {'env steps/s':>12s} {'trained/s':>12s} {'pushes/s':>9s} "
          f"{'stale':>6s} {'real s per virtual s':>20s} {'setup s':>8s} {'peak GB':>8s}", flush=True)
    for nodes in [int(n) for n in args.nodes.split(",")]:
        try:
            row = run_job(args.config, nodes, args.actors_per_node, args.virtual_seconds, out,
                          [f"launch.sim_actors={args.sim_actors}", *args.overrides], stragglers)
        except RuntimeError as failed:  # the run's own one-line error is its last line
            print(f"hpcrl bench sim-scale: {failed}".rstrip().splitlines()[0] + " "
                  + str(failed).rstrip().splitlines()[-1], file=sys.stderr)
            return 1
        name = f"{Path(args.config).name} ({args.sim_actors})"
        print(f"{name:24s} {nodes:5d} {row['ranks']:6d} {row['env_steps_per_s']:12,.0f} "
              f"{row['trained_steps_per_s']:12,.0f} "
              f"{row['pushes_per_s']:9,.0f} {row['staleness_mean']:6.2f} {row['real_per_virtual_second']:20.1f} "
              f"{row['setup_seconds']:8.1f} {row['max_rss_gb']:8.2f}", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
