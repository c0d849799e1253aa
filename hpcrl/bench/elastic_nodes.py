"""Static learner groups (or actors) against ones that join and leave, on a Slurm cluster: final return,
wall-clock and the node-seconds the scheduler bills (issue 26 items 2 and 4).

The same config, budget and seed in each arm, one job after another through ``hpcrl submit``. Not a sweep (as
the seed benches are, hpcrl/bench/sweep_runs.py): a sweep's runs are ``hpcrl run``s of one node each, while each
arm here is a batch job of its own shape (its nodes, elastic mode and joining jobs). With ``--role learners`` (the
default):

- ``static``: G learner groups of ``--ranks-per-group`` ranks, all active for the whole job
  (``learners.elastic=park``, ``min_active=G``); the job holds every group's ranks on ``--static-nodes`` nodes.
- ``jobs``: the same G groups, ``min_active=1``: the elastic rule activates and parks them, and an active
  group's other ranks join as a one-node batch job of their own (``learners.elastic=jobs``); the run's job
  holds the parameter rank, the groups' roots and the actors on one node.
- ``steps``: likewise as job steps inside one allocation that keeps a spare node per group
  (``learners.elastic=steps``).

With ``--role actors`` the arms set ``actors.elastic`` (park, jobs, steps) and leave the learners as the config
has them: the config should park actors (MARL ``algo.actor_scaling``, or ``debug.active_actors``). ``static``
holds every actor's rank (and environments) on ``--static-nodes`` nodes; ``jobs`` runs each active actor's
sampler as a one-node job of its own beside a one-node job for the ranks.

Per arm: the return (mean of the last 20 episodes), the time of the last update since the run's start, joins,
and the node-seconds and
charge ``hpcrl analyze`` reads from ``sacct`` for every job the run recorded (its own and its joining ones).

    hpcrl bench elastic-nodes --site local-cluster [--role learners] [--groups 2] [--steps 30000] [--seeds 1]
        [--arms static,jobs] [--out DIR] [CONFIG] [-o KEY=VALUE ...]

The default job (256 steps a batch) needs ``-o algo.minibatch_size=64`` for two groups (128 steps each).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hpcrl.bench.scale_model import wait_job

ARMS = ("static", "jobs", "steps")


def arm_overrides(arm: str, groups: int, ranks_per_group: int, role: str = "learners") -> list[str]:
    if role == "actors":
        return [f"actors.elastic={'park' if arm == 'static' else arm}"]
    common = [f"learners.groups={groups}", f"learners.ranks_per_group={ranks_per_group}"]
    if arm == "static":
        return [*common, "learners.elastic=park", f"learners.min_active={groups}"]
    return [*common, f"learners.elastic={arm}", "learners.min_active=1"]


def run_arm(arm: str, seed: int, args, out: Path) -> Path:
    run_dir = out / f"{arm}-seed{seed}"
    nodes = args.static_nodes if arm == "static" else 1
    sets = [*arm_overrides(arm, args.groups, args.ranks_per_group, args.role), f"env.seed={seed}",
            f"stop.total_env_steps={args.steps}", "stop.target_return=null", *args.set]
    cmd = [sys.executable, "-m", "hpcrl", "submit", "--site", args.site, "--nodes", str(nodes), "--run-dir",
           str(run_dir), *([args.config] if args.config else []), *[w for s in sets for w in ("-o", s)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise SystemExit(f"elastic-nodes: hpcrl submit failed for {arm}: {done.stderr.strip()}")
    job_id = done.stdout.split()[-1]
    state = wait_job(job_id, args.timeout)  # cancels the job past the timeout
    if state != "COMPLETED":
        raise SystemExit(f"elastic-nodes: job {job_id} ({arm}) ended {state}; see {run_dir}.job/")
    return run_dir


def measure(run_dir: Path) -> dict:
    from hpcrl.commands.analyze import load_analysis
    from hpcrl.io import read_table

    ha = load_analysis()
    run = ha.load_run(run_dir)
    bill = None
    for _ in range(30):  # sacct may lag the job's end by a few seconds
        run.cache.pop("bill", None)
        bill = ha.billing.billed(run)
        if not bill["note"]:
            break
        time.sleep(2)
    returns = read_table(run_dir / "run.h5", "episodes")["return"]
    joined = 0
    for table in ("elastic_events", "actor_joins"):  # groups' and actors' joins: io.schema ELASTIC_ACTIONS 3
        events = read_table(run_dir / "run.h5", table)
        joined += int((events["action"] == 3).sum()) if len(events["action"]) else 0
    updates = read_table(run_dir / "run.h5", "updates")
    return {"return": float(np.mean(returns[-20:])) if len(returns) else float("nan"),
            "last_update": float(updates["time"][-1]) if len(updates["time"]) else float("nan"),
            "joins": joined, "jobs": len(bill["jobs"]), "node_seconds": bill["node_seconds"],
            "charge": bill["charge"], "unit": bill["unit"], "note": bill["note"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hpcrl bench elastic-nodes", description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", help="config file (default: the default job)")
    parser.add_argument("--site", required=True, help="a Slurm site of hpcrl submit, e.g. local-cluster")
    parser.add_argument("--role", choices=("learners", "actors"), default="learners",
                        help="whose ranks join and leave in the elastic arms")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--ranks-per-group", type=int, default=2)
    parser.add_argument("--static-nodes", type=int, default=3, help="nodes of the static arm's job")
    parser.add_argument("--steps", type=int, default=30_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--arms", default="static,jobs", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a job may take")
    parser.add_argument("--out", help="keep the runs here (default: a new temporary directory)")
    parser.add_argument("-o", "--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        parser.error(f"--arms: {bad[0]!r}; allowed: {', '.join(ARMS)}")
    out = Path(args.out or tempfile.mkdtemp(prefix="hpcrl-elastic-nodes-"))
    out.mkdir(parents=True, exist_ok=True)
    who = (f"{args.groups} groups of {args.ranks_per_group} ranks" if args.role == "learners"
           else "joining actors' samplers")
    print(f"elastic-nodes: arms {', '.join(arms)} x {args.seeds} seed(s), {args.steps:,} env steps, "
          f"{who} on {args.site}; runs in {out}", flush=True)
    rows = []
    for seed in range(args.seeds):
        for arm in arms:
            started = time.monotonic()
            got = measure(run_arm(arm, seed, args, out))
            got.update(arm=arm, seed=seed, job_wall=time.monotonic() - started)
            rows.append(got)
            print(f"  {arm} seed {seed}: return {got['return']:.1f}, last update {got['last_update']:.1f} s, "
                  f"{got['joins']} joins, {got['jobs']} job(s) billed {got['node_seconds']:,} node-seconds"
                  + (f" ({got['note']})" if got["note"] else ""), flush=True)
    print()
    print("| arm | seed | return (last 20) | last update (s) | joins | jobs | billed node-seconds | charge |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['arm']} | {r['seed']} | {r['return']:.1f} | {r['last_update']:.1f} | {r['joins']} | {r['jobs']} "
              f"| {r['node_seconds']:,} | {r['charge']:.5f} {r['unit']} |")
    for arm in arms[1:]:
        mine = [r["node_seconds"] for r in rows if r["arm"] == arm]
        base = [r["node_seconds"] for r in rows if r["arm"] == arms[0]]
        if mine and base and sum(base):
            print(f"{arm} / {arms[0]} billed node-seconds: {sum(mine) / sum(base):.2f}x")
    return 0
