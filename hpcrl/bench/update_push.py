"""Gradient push vs update push on one config: env steps/s, rank 0's pushes/s and busy share, return at the budget.

Each repetition runs the same ``hpcrl run`` twice, ``learners.push=gradient`` and ``learners.push=update``
(a fresh job each, modes alternating so machine load hits both alike), to a fixed number of env steps
with no return target. Per run, from its run.h5: env steps/s over the training time (the last round's
end), pushes per second taken out of rank 0's mailbox (gradients, or updates), rank 0's busy share (its
``parameter_load`` seconds that are not idle, over the interval seconds), its busy milliseconds per 1,000
env steps (its work per env step) and the part of them spent on pushes (receive, admit, apply, publish;
the rest is the record: actors' fragment reports and episodes, which do not depend on the mode), the mean return of the last 20 episodes, and the env steps at which the
20-episode mean first reached ``--target`` (if given). The last lines give update / gradient ratios of
the means: env steps/s, and rank 0's work per env step (the update mode should cut it by about the
number of minibatch steps per update on the work on pushes).

    hpcrl bench update-push [--config FILE] [--steps 50000] [--seeds 1] [--target 475]
                            [--modes gradient,update] [--runner mpi|serial] [--out DIR] [-o KEY=VALUE ...]

Default config: the default job (CartPole-v1, 2 actors, one learner group).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

MODES = ("gradient", "update")
RANK0_PUSHES = ("receive_seconds", "admit_seconds", "apply_seconds", "publish_seconds")
"""Rank 0's work on pushes (the parameter_load columns that scale with them)."""
RANK0_BUSY = (*RANK0_PUSHES, "record_seconds", "other_seconds")
"""All of rank 0's work: its pushes, and the record (actors' fragment reports, episodes) and the rest."""


def run_one(config: str | None, mode: str, seed: int, steps: int, runner: str, run_dir: Path,
            extra: list[str]) -> dict:
    overrides = [f"learners.push={mode}", f"env.seed={seed}", f"stop.total_env_steps={steps}",
                 "stop.target_return=null", f"io.run_dir={run_dir}", "io.log_seconds=600", *extra]
    cmd = [sys.executable, "-m", "hpcrl", "run", *([config] if config else []), "--runner", runner,
           *[a for o in overrides for a in ("-o", o)]]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
    if res.returncode != 0:
        raise RuntimeError(f"{mode} seed {seed}: hpcrl run failed ({res.returncode}):\n"
                           f"{res.stdout[-1500:]}{res.stderr[-1500:]}")
    return measure(run_dir)


def measure(run_dir: Path, target: float | None = None) -> dict:
    """The numbers of one finished run, from its run.h5."""
    from hpcrl.io import read_table

    h5 = run_dir / "run.h5"
    rounds = read_table(h5, "rounds", ["start", "duration", "env_steps_total"])
    train_seconds = float(rounds["start"][-1] + rounds["duration"][-1])
    env_steps = int(rounds["env_steps_total"][-1])
    load = read_table(h5, "parameter_load")
    busy = float(sum(load[c].sum() for c in RANK0_BUSY))
    on_pushes = float(sum(load[c].sum() for c in RANK0_PUSHES))
    pushes = read_table(h5, "gradients", ["inner_steps"])["inner_steps"]
    episodes = read_table(h5, "episodes", ["return", "env_steps"])
    returns = episodes["return"]
    out = {"env_steps": env_steps, "train_seconds": train_seconds, "steps_per_s": env_steps / train_seconds,
           "pushes_per_s": len(pushes) / train_seconds, "inner_steps": float(pushes.mean()) if len(pushes) else 0.0,
           "rank0_busy_share": busy / max(float(load["interval_seconds"].sum()), 1e-9),
           "rank0_ms_per_1k_steps": 1e6 * busy / max(env_steps, 1),
           "rank0_push_ms_per_1k_steps": 1e6 * on_pushes / max(env_steps, 1),
           "return": float(np.mean(returns[-20:])) if len(returns) else float("nan")}
    if target is not None:
        means = np.convolve(returns, np.ones(20) / 20, mode="valid") if len(returns) >= 20 else np.array([])
        hit = np.flatnonzero(means >= target)
        out["steps_to_target"] = int(episodes["env_steps"][hit[0] + 19]) if hit.size else None
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench update-push", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="config file (default: the default job)")
    p.add_argument("--steps", type=int, default=50_000, help="environment steps per run (default 50000)")
    p.add_argument("--seeds", type=int, default=1, help="repetitions with env.seed 0..K-1 (default 1)")
    p.add_argument("--target", type=float, help="also report the env steps at which the 20-episode mean reached this")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--runner", choices=["mpi", "serial"], default="mpi")
    p.add_argument("--out", help="keep the run directories here (default: a temporary directory)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    args = p.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",")]
    if not modes or any(m not in MODES for m in modes):
        print(f"hpcrl bench update-push: --modes {args.modes!r}; allowed: {', '.join(MODES)}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-update-push-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"# {args.config or 'default job'}, {args.steps} env steps, runner {args.runner}"
          + "".join(f" -o {o}" for o in args.overrides), flush=True)
    head = (f"{'mode':9} {'seed':>4} {'env steps/s':>11} {'pushes/s':>9} {'inner':>6} {'rank0 busy':>10} "
            f"{'rank0 ms/1k':>11} {'pushes ms/1k':>12} {'return':>7}" + (f" {'to target':>9}" if args.target is not None else ""))
    print(head, flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for seed in range(args.seeds):
        for mode in modes:
            run_dir = out / f"{mode}-seed{seed}"
            run_one(args.config, mode, seed, args.steps, args.runner, run_dir, args.overrides)
            r = measure(run_dir, args.target)
            runs[mode].append(r)
            line = (f"{mode:9} {seed:>4} {r['steps_per_s']:>11.0f} {r['pushes_per_s']:>9.1f} {r['inner_steps']:>6.1f} "
                    f"{r['rank0_busy_share']:>10.2f} {r['rank0_ms_per_1k_steps']:>11.1f} "
                    f"{r['rank0_push_ms_per_1k_steps']:>12.1f} {r['return']:>7.1f}")
            if args.target is not None:
                line += f" {r['steps_to_target'] if r['steps_to_target'] is not None else '-':>9}"
            print(line, flush=True)
    print()
    for mode in modes:
        rs = runs[mode]
        ret = [r["return"] for r in rs]
        sd = statistics.stdev(ret) if len(ret) > 1 else 0.0
        line = (f"{mode:9} mean: {statistics.mean(r['steps_per_s'] for r in rs):.0f} env steps/s, "
                f"{statistics.mean(r['pushes_per_s'] for r in rs):.1f} pushes/s, rank 0 "
                f"{statistics.mean(r['rank0_ms_per_1k_steps'] for r in rs):.1f} ms busy per 1k env steps, "
                f"return {statistics.mean(ret):.1f} +- {sd:.1f}")
        if args.target is not None:
            hit = [r["steps_to_target"] for r in rs if r["steps_to_target"] is not None]
            line += f", reached {args.target:g} on {len(hit)}/{len(rs)}"
            if hit:
                line += f" (median {statistics.median(hit):.0f} env steps)"
        print(line)
    if set(modes) == set(MODES):
        def mean(mode: str, key: str) -> float:
            return statistics.mean(r[key] for r in runs[mode])

        print(f"update / gradient: env steps/s {mean('update', 'steps_per_s') / mean('gradient', 'steps_per_s'):.2f}x, "
              f"rank 0 busy per env step {mean('update', 'rank0_ms_per_1k_steps') / mean('gradient', 'rank0_ms_per_1k_steps'):.3f}x, "
              f"its work on pushes per env step {mean('update', 'rank0_push_ms_per_1k_steps') / mean('gradient', 'rank0_push_ms_per_1k_steps'):.3f}x "
              f"(minibatch steps per update: {mean('update', 'inner_steps'):.0f})")
    print(f"run directories: {out}")
    return 0
