"""Batched classic control: wall-clock to solve CartPole (>= 475), Acrobot (>= -100), Pendulum (>= -200).

Each task runs its shipped config (``hpcrl/configs/cartpole_ha2c.yaml``, ``acrobot_ha2c.yaml``,
``pendulum_hddpg.yaml``: 10K instances, seed 003's count) through the same single-process runner
as ``hpcrl run``, once per seed, until the mean return of the last ``stop.return_window``
episodes reaches the target (solved) or ``--max-minutes`` pass (not solved). The table gives
the seeds solved, the mean and spread (standard deviation, min, max) of the wall-clock to solve
and the env steps and updates it took. Wall-clock counts the training loop only (not start-up).

    hpcrl bench classic-control-learning [--tasks cartpole,acrobot,pendulum] [--seeds 3]
        [--instances 10000] [--max-minutes 20] [--device auto] [--threads 1] [--keep DIR]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from hpcrl.config import load_config
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import fused
from hpcrl.envs.classic.base import resolve_device

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
TASKS = {"cartpole": "cartpole_ha2c.yaml", "acrobot": "acrobot_ha2c.yaml", "pendulum": "pendulum_hddpg.yaml"}


def solve(task: str, seed: int, instances: int | None, max_minutes: float, device: str, run_dir: Path) -> dict:
    overrides = [f"env.seed={seed}", f"stop.max_wall_seconds={max_minutes * 60}", f"learners.device={device}",
                 f"name={task}-seed{seed}"]
    if instances:
        overrides.append(f"env.num_envs={instances}")
    cfg = load_config(CONFIGS / TASKS[task], overrides)
    summary = dict(fused.run(make_plan(cfg), run_dir / f"{task}-seed{seed}").summary)
    summary["solved"] = summary["stop_reason"].startswith("stop.target_return")
    summary["target"] = cfg.stop.target_return
    summary["algo"] = cfg.algo.name
    return summary


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):8.1f} {sd:7.1f} {min(values):8.1f} {max(values):8.1f}"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench classic-control-learning", description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated subset of {', '.join(TASKS)}")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--instances", type=int, help="override env.num_envs (default: the config's 10000)")
    p.add_argument("--max-minutes", type=float, default=20.0, help="give up on a seed after this long")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--keep", help="keep the run directories here (default: a temporary directory)")
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if any(t not in TASKS for t in tasks):
        p.error(f"--tasks: allowed {', '.join(TASKS)}")

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} torch thread(s)"
    print(f"# wall-clock to solve on {device} ({where}); {args.seeds} seeds; give up after {args.max_minutes} min")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(args.keep) if args.keep else Path(tmp)
        for task in tasks:
            results = []
            for seed in range(args.seeds):
                s = solve(task, seed, args.instances, args.max_minutes, str(device), run_dir)
                results.append(s)
                print(f"{task} seed {seed}: {'solved' if s['solved'] else 'not solved'} after {s['elapsed']:.1f} s, "
                      f"{s['env_steps']} env steps, {s['gradients']} updates, mean return {s['mean_return']:.1f}",
                      flush=True)
            rows.append((task, results))
    print(f"\n{'task':10} {'algo':6} {'N':>7} {'target':>7} {'solved':>7} {'seconds: mean':>14} {'std':>7} {'min':>8} "
          f"{'max':>8} {'env steps (mean)':>17} {'updates':>8}")
    for task, results in rows:
        ok = [r for r in results if r["solved"]]
        steps = f"{statistics.mean(r['env_steps'] for r in ok):.3g}" if ok else "-"
        updates = f"{statistics.mean(r['gradients'] for r in ok):.0f}" if ok else "-"
        r0 = results[0]
        print(f"{task:10} {r0['algo']:6} {r0['num_envs']:>7} {r0['target']:>7g} {len(ok):>3}/{len(results):<3} "
              f"{spread([r['elapsed'] for r in ok]):>39} {steps:>17} {updates:>8}")
    print("seed 003 (one A100, 10K instances): CartPole about 30 min, Acrobot about 5 min, Pendulum about 8 min "
          "to the optimum (Figs. 3-4)")
    return 0
