"""Hopper-v5 with the shipped config for 1M environment steps: the learning curve and the wall-clock.

Runs ``hpcrl run hpcrl/configs/hopper.yaml`` (3 ranks: parameter, one learner, one actor with
one MuJoCo environment) and prints, per 100k environment steps, the mean return of the
episodes that ended there and the wall-clock at which they ended; then the final mean return
over the last 20 episodes. ``--curve RUN_DIR`` prints the same table for a run that exists.

    hpcrl bench hopper [--steps 1000000] [--curve RUN_DIR] [-o KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "hopper.yaml"


def curve(run_dir: Path, bucket: int = 100_000) -> list[tuple[int, int, float, float, float]]:
    """(bucket end, episodes, mean return, max return, wall s) per ``bucket`` env steps."""
    from hpcrl.io import read_table

    ep = read_table(run_dir / "run.h5", "episodes", ["time", "return", "env_steps"])
    rows = []
    top = int(ep["env_steps"].max()) if ep["env_steps"].size else 0
    for end in range(bucket, top + bucket, bucket):
        sel = (ep["env_steps"] > end - bucket) & (ep["env_steps"] <= end)
        if sel.any():
            r = ep["return"][sel]
            rows.append((end, int(sel.sum()), float(r.mean()), float(r.max()), float(ep["time"][sel].max())))
    return rows


def print_curve(run_dir: Path, wall: float | None = None) -> float:
    from hpcrl.io import read_table

    print(f"Hopper-v5 learning curve, {run_dir}")
    print(f"{'env steps':>10} {'episodes':>9} {'mean return':>12} {'max return':>11} {'wall s':>8}")
    for end, n, mean, best, t in curve(run_dir):
        print(f"{end:>10d} {n:>9d} {mean:>12.1f} {best:>11.1f} {t:>8.0f}")
    ret = read_table(run_dir / "run.h5", "episodes", ["return"])["return"]
    final = float(np.mean(ret[-20:])) if ret.size else float("nan")
    print(f"final mean return (last 20 episodes): {final:.1f}" + (f"; wall-clock {wall:.0f} s" if wall else ""))
    return final


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench hopper", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--curve", metavar="RUN_DIR", help="only print the curve of an existing run")
    p.add_argument("--out", help="run directory (default: a new temporary one)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if args.curve:
        print_curve(Path(args.curve))
        return 0
    run_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-hopper-")) / "run"
    overrides = [f"stop.total_env_steps={args.steps}", f"io.run_dir={run_dir}", "io.log_seconds=60", *args.overrides]
    cmd = [sys.executable, "-m", "hpcrl", "run", str(CONFIG), *[a for o in overrides for a in ("-o", o)]]
    start = time.perf_counter()
    rc = subprocess.run(cmd).returncode
    wall = time.perf_counter() - start
    if rc != 0:
        print(f"hpcrl run failed with exit code {rc}", file=sys.stderr)
        return rc
    print_curve(run_dir, wall)
    return 0
