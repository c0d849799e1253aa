"""Admission policies on one CartPole-v1 budget: stellaris vs pure_async vs sync, return and wall-clock.

Each policy trains the same config for the same number of environment steps (no early stop)
through ``hpcrl run`` (a fresh MPI job each), with two learner groups so that staleness
exists to be managed. The table gives, per policy: the mean return of the last 20 episodes,
the wall-clock of the job, its ratio to the ``sync`` baseline measured in the same run,
the updates applied, and the mean / max staleness of the admitted gradients (read back
from each run's run.h5).

    hpcrl bench admission-compare [--steps 150000] [--groups 2] [--policies stellaris,pure_async,sync]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

POLICIES = ("stellaris", "pure_async", "sync")


def run_one(policy: str, steps: int, groups: int, out: Path, extra: list[str]) -> dict:
    run_dir = out / policy
    overrides = [f"aggregation.policy={policy}", f"stop.total_env_steps={steps}", "stop.target_return=null",
                 f"learners.groups={groups}", f"learners.min_active={groups}", f"io.run_dir={run_dir}",
                 "io.log_seconds=60", *extra]
    cmd = [sys.executable, "-m", "hpcrl", "run", *[a for o in overrides for a in ("-o", o)]]
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"{policy}: hpcrl run failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    from hpcrl.io import read_table

    h5 = run_dir / "run.h5"
    ret = read_table(h5, "episodes", ["return"])["return"]
    grads = read_table(h5, "gradients", ["staleness", "admitted"])
    st = grads["staleness"][grads["admitted"] == 1]
    updates = read_table(h5, "updates", ["version"])["version"]
    return {"policy": policy, "return": float(np.mean(ret[-20:])) if ret.size else float("nan"),
            "wall": wall, "updates": int(updates.size), "episodes": int(ret.size),
            "staleness_mean": float(st.mean()) if st.size else float("nan"),
            "staleness_max": int(st.max()) if st.size else -1}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench admission-compare", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150_000, help="environment steps per policy (default 150000)")
    p.add_argument("--groups", type=int, default=2, help="learner groups (default 2; 1 parameter + G + 2 actor ranks)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--out", help="keep the run directories here (default: a temporary directory)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-admission-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for policy in args.policies.split(","):
        print(f"running {policy} for {args.steps} steps ...", flush=True)
        rows.append(run_one(policy.strip(), args.steps, args.groups, out, args.overrides))
    base = next((r["wall"] for r in rows if r["policy"] == "sync"), rows[0]["wall"])
    print(f"\nCartPole-v1, {args.steps} env steps, {args.groups} learner groups; run directories in {out}")
    print(f"{'policy':<12} {'return(last20)':>14} {'wall s':>8} {'vs sync':>8} {'updates':>8} {'episodes':>9} "
          f"{'stale mean':>10} {'stale max':>9}")
    for r in rows:
        print(f"{r['policy']:<12} {r['return']:>14.1f} {r['wall']:>8.1f} {r['wall'] / base:>8.2f} {r['updates']:>8d} "
              f"{r['episodes']:>9d} {r['staleness_mean']:>10.2f} {r['staleness_max']:>9d}")
    return 0
