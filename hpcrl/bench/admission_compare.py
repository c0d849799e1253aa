"""Admission policies on one CartPole-v1 budget: stellaris (all groups, and elastic) vs pure_async vs sync, return and wall-clock.

Each policy trains the same config for the same number of environment steps (no early stop)
through ``hpcrl run`` (a fresh MPI job each), with two learner groups so that staleness
exists to be managed. The table gives, per policy: the mean return of the last 20 episodes,
the wall-clock of the job, its ratio to the ``sync`` baseline measured in the same run,
the updates applied, the mean / max staleness of the admitted gradients, the mean number of
active groups over the updates and the elastic activations / parks (read back from each
run's run.h5). A name ending in ``+elastic`` (default: ``stellaris+elastic``) runs that policy
with ``learners.min_active=1``, so the elastic rule activates and parks groups as it measures.

    hpcrl bench admission-compare [--steps 150000] [--groups 2] [--seeds 1]
                                  [--policies stellaris,stellaris+elastic,pure_async,sync]

With ``--seeds K`` every policy runs K times (env.seed 0..K-1, policies interleaved so machine
load hits them alike) and the table shows mean +- std over the seeds.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

POLICIES = ("stellaris", "stellaris+elastic", "pure_async", "sync")
ELASTIC = "+elastic"


def run_one(name: str, steps: int, groups: int, out: Path, extra: list[str], seed: int = 0) -> dict:
    policy, elastic = name.removesuffix(ELASTIC), name.endswith(ELASTIC)
    run_dir = out / f"{name.replace('+', '-')}-seed{seed}"
    overrides = [f"aggregation.policy={policy}", f"env.seed={seed}", f"stop.total_env_steps={steps}", "stop.target_return=null",
                 f"learners.groups={groups}", f"learners.min_active={1 if elastic else groups}", f"io.run_dir={run_dir}",
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
    updates = read_table(h5, "updates", ["version", "active_groups"])
    events = read_table(h5, "elastic_events", ["action"])["action"]
    return {"policy": name, "return": float(np.mean(ret[-20:])) if ret.size else float("nan"),
            "active_mean": float(updates["active_groups"].mean()) if updates["version"].size else float("nan"),
            "activations": int((events == 0).sum()), "parks": int((events == 1).sum()),
            "wall": wall, "updates": int(updates["version"].size), "episodes": int(ret.size),
            "staleness_mean": float(st.mean()) if st.size else float("nan"),
            "staleness_max": int(st.max()) if st.size else -1}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench admission-compare", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150_000, help="environment steps per policy (default 150000)")
    p.add_argument("--groups", type=int, default=2, help="learner groups (default 2; 1 parameter + G + 2 actor ranks)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--seeds", type=int, default=1, help="runs per policy with env.seed 0..K-1 (default 1)")
    p.add_argument("--out", help="keep the run directories here (default: a temporary directory)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-admission-"))
    out.mkdir(parents=True, exist_ok=True)
    policies = [x.strip() for x in args.policies.split(",")]
    runs: dict[str, list[dict]] = {pol: [] for pol in policies}
    for seed in range(args.seeds):
        for policy in policies:
            print(f"running {policy} (seed {seed}) for {args.steps} steps ...", flush=True)
            runs[policy].append(run_one(policy, args.steps, args.groups, out, args.overrides, seed))

    def stat(policy: str, key: str) -> tuple[float, float]:
        v = np.array([r[key] for r in runs[policy]], dtype=float)
        return float(v.mean()), float(v.std())

    base = stat("sync", "wall")[0] if "sync" in runs else stat(policies[0], "wall")[0]
    print(f"\nCartPole-v1, {args.steps} env steps, {args.groups} learner groups, {args.seeds} seed(s); "
          f"run directories in {out}")
    print(f"{'policy':<18} {'return(last20)':>16} {'wall s':>14} {'vs sync':>8} {'updates':>8} {'episodes':>9} "
          f"{'stale mean':>10} {'stale max':>9} {'active':>6} {'act/park':>9}")
    for policy in policies:
        (ret, ret_sd), (wall, wall_sd) = stat(policy, "return"), stat(policy, "wall")
        print(f"{policy:<18} {ret:>8.1f} +- {ret_sd:<5.1f} {wall:>6.1f} +- {wall_sd:<5.1f} {wall / base:>8.2f} "
              f"{stat(policy, 'updates')[0]:>8.0f} {stat(policy, 'episodes')[0]:>9.0f} "
              f"{stat(policy, 'staleness_mean')[0]:>10.2f} {max(r['staleness_max'] for r in runs[policy]):>9d} "
              f"{stat(policy, 'active_mean')[0]:>6.2f} "
              f"{sum(r['activations'] for r in runs[policy]):>4d}/{sum(r['parks'] for r in runs[policy]):<4d}")
    return 0
