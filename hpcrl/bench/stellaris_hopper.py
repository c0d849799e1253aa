"""Stellaris on Hopper-v5 at equal env steps: sync, pure_async, ssp, softsync, stellaris (PPO) and PPO vs IMPACT.

The shipped Stellaris configs (hpcrl/configs/stellaris/hopper_{ppo,impact}.yaml: Table III
hyperparameters, 2x256 tanh) scaled down to this machine: 2 actors x 4 environments, 2 learner
groups (both active), PPO's round 1024 steps (512 per group), IMPACT's round one 128-step
fragment of each actor. Every setting samples the same number of environment steps (no early
stop), seeds interleaved so machine load hits all settings alike; each run is a fresh
``hpcrl run`` under the MPI runner (one process per role: the groups really run at once; under
the serial runner's threads the first group drains every fragment and the second one idles). Per setting, mean +- std over seeds: the mean return of
the last 20 episodes, the wall-clock and its ratio to ``ppo sync`` measured in the same bench,
the updates applied, the mean admitted staleness, and the Stellaris cost (sum of the per-round
cost at the paper's prices, Section VIII-A).

    hpcrl bench stellaris-hopper [--steps 20000] [--seeds 2] [--runner mpi|serial] [--out DIR] [-o KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "stellaris"
SETTINGS = (("ppo", "sync"), ("ppo", "pure_async"), ("ppo", "ssp"), ("ppo", "softsync"), ("ppo", "stellaris"),
            ("impact", "stellaris"))
SCALE = ["actors.count=2", "env.num_envs=4", "actors.fragment_length=128", "learners.groups=2", "learners.min_active=2",
         "io.log_seconds=600", "stop.target_return=null"]
PER_ALGO = {"ppo": ["algo.train_batch_size=1024", "algo.minibatch_size=256", "algo.num_sgd_iter=4"],
            "impact": ["algo.minibatch_size=256", "algo.num_sgd_iter=2"]}


def run_one(algo: str, policy: str, seed: int, steps: int, runner: str, out: Path, extra: list[str]) -> dict:
    run_dir = out / f"{algo}-{policy}-seed{seed}"
    overrides = [*SCALE, *PER_ALGO[algo], f"aggregation.policy={policy}", f"env.seed={seed}",
                 f"stop.total_env_steps={steps}", f"io.run_dir={run_dir}", *extra]
    cmd = [sys.executable, "-m", "hpcrl", "run", "--runner", runner, str(CONFIGS / f"hopper_{algo}.yaml"),
           *[a for o in overrides for a in ("-o", o)]]
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"{algo} {policy}: hpcrl run failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    from hpcrl.commands.analyze import load_analysis

    ha = load_analysis()
    run = ha.load_run(run_dir)
    ret = ha.metrics.episode_axes(run)["return"]
    st = ha.metrics.admitted_staleness(run)["staleness"]
    cost = ha.metrics.per_round(run, ha.metrics.load_prices(None))["cost"]
    return {"return": float(np.mean(ret[-20:])) if ret.size else float("nan"), "wall": wall,
            "updates": run.rows("updates"), "staleness": float(st.mean()) if st.size else float("nan"),
            "cost": float(np.nansum(cost)), "episodes": int(ret.size)}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench stellaris-hopper", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20_000, help="environment steps per run (default 20000)")
    p.add_argument("--seeds", type=int, default=2, help="runs per setting, env.seed 0..K-1 (default 2)")
    p.add_argument("--runner", choices=["mpi", "serial"], default="mpi")
    p.add_argument("--out", help="keep the run directories here (default: a temporary directory)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-stellaris-hopper-"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, str], list[dict]] = {s: [] for s in SETTINGS}
    for seed in range(args.seeds):
        for algo, policy in SETTINGS:
            print(f"running {algo} {policy} (seed {seed}) for {args.steps} steps ...", flush=True)
            results[(algo, policy)].append(run_one(algo, policy, seed, args.steps, args.runner, out, args.overrides))

    def stat(setting, key) -> tuple[float, float]:
        v = np.array([r[key] for r in results[setting]], dtype=float)
        return float(np.nanmean(v)), float(np.nanstd(v))

    base = stat(("ppo", "sync"), "wall")[0]
    print(f"\nHopper-v5, {args.steps} env steps per run, {args.seeds} seed(s), runner {args.runner}; "
          f"Table III hyperparameters, 2 actors x 4 envs, 2 learner groups; run directories in {out}")
    print(f"{'algo':<7} {'policy':<11} {'return (last 20)':>17} {'wall s':>14} {'vs sync':>8} {'updates':>8} "
          f"{'staleness':>9} {'cost $':>9}")
    for setting in SETTINGS:
        (ret, ret_sd), (wall, wall_sd) = stat(setting, "return"), stat(setting, "wall")
        print(f"{setting[0]:<7} {setting[1]:<11} {ret:>8.1f} +- {ret_sd:<6.1f} {wall:>6.1f} +- {wall_sd:<5.1f} "
              f"{wall / base:>8.2f} {stat(setting, 'updates')[0]:>8.0f} {stat(setting, 'staleness')[0]:>9.2f} "
              f"{stat(setting, 'cost')[0]:>9.4f}")
    return 0
