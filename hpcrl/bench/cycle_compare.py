"""Old vs new runtime on one job: env steps/s of a reference git revision and of this tree, alternating.

The reference revision (default ``main``) is unpacked with ``git archive`` into a temporary
folder; each repetition runs the same ``hpcrl run`` (one config file for both trees, default:
this tree's default CartPole job, to a fixed number of env steps, no return target) once under
the reference and once under this tree, each as a fresh MPI job (PYTHONPATH picks the tree),
so machine load hits both alike. Compare against the revision this tree branched from
(``--ref $(git merge-base HEAD main)``) to see this tree's changes alone.
The table gives env steps/s and gradients/s per run (training wall time, from the run
summary) and the CPU seconds of all ranks per 1,000 env steps (start-up included: a measure of
the work that does not depend on how much of a shared machine the job got), the ratios new/old
per repetition and their geometric means, and, for this tree, the
learner cycle per gradient by phase (run.h5 ``learner_cycles``) and the parameter rank's
absorption rate (``parameter_load``).

    hpcrl bench cycle-compare [--ref main | --ref-tree DIR] [--config FILE] [--reps 2] [--steps 100000]
                              [-o KEY=VALUE ...]

``--ref-tree`` takes a reference tree already unpacked (``git archive REF | tar -x -C DIR``), for a
machine that has the working tree but not its git history.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def unpack(ref: str, into: Path) -> Path:
    """The tree of git revision ``ref`` of this checkout, in ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_job(tree: Path, config: Path, run_dir: Path, steps: int, extra: list[str]) -> dict:
    overrides = ["stop.target_return=null", f"stop.total_env_steps={steps}", f"io.run_dir={run_dir}",
                 "io.log_seconds=600", *extra]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "hpcrl", "run", str(config), *[a for o in overrides for a in ("-o", o)]]
    start, cpu0 = time.perf_counter(), _children_cpu()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tree))
    total, cpu = time.perf_counter() - start, _children_cpu() - cpu0
    if res.returncode != 0:
        raise RuntimeError(f"{tree}: hpcrl run failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    wall = float(re.search(r"wall time\s+([\d.]+) s", res.stdout).group(1))
    env_steps = int(re.search(r"environment steps\s+(\d+)", res.stdout).group(1))
    grads = int(re.search(r"gradients received / admitted\s+(\d+)", res.stdout).group(1))
    return {"wall": wall, "total": total, "cpu": cpu, "env_steps": env_steps, "gradients": grads, "run_dir": run_dir}


def _children_cpu() -> float:
    """CPU seconds (user + system) of every finished child process tree so far (mpiexec waits for its ranks)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cycle_table(run_dir: Path) -> list[str]:
    """This tree's learner cycle (ms per gradient by phase) and the parameter rank's absorption rate."""
    from hpcrl.io import read_table
    from hpcrl.runtime.record.cycle_profile import LEARNER_PHASES

    h5 = run_dir / "run.h5"
    cy = read_table(h5, "learner_cycles")
    lines = [f"learner cycle, {len(cy['seq'])} gradients: {1e3 * cy['cycle_seconds'].mean():.3f} ms per gradient"]
    lines += [f"  {p:10s} {1e3 * cy[f'{p}_seconds'].mean():8.3f} ms" for p in LEARNER_PHASES]
    ld = read_table(h5, "parameter_load")
    n = ld["gradients"].sum()
    work = sum(ld[f"{p}_seconds"].sum() for p in ("receive", "admit", "apply", "publish"))
    lines.append(f"parameter rank: absorbs {n / work:.0f} gradients/s of work, received {n / ld['interval_seconds'].sum():.0f}/s, "
                 f"idle {100 * ld['idle_seconds'].sum() / ld['interval_seconds'].sum():.0f} %")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench cycle-compare", description=__doc__.splitlines()[0])
    p.add_argument("--ref", default="main", help="git revision to compare against (default main)")
    p.add_argument("--ref-tree", help="an unpacked reference tree to compare against instead of --ref")
    p.add_argument("--reps", type=int, default=2, help="runs per tree, alternating (default 2)")
    p.add_argument("--steps", type=int, default=100_000, help="env steps per run (default 100000)")
    p.add_argument("--new", default=str(ROOT), help="source tree to measure (default: this one)")
    p.add_argument("--config", default=str(ROOT / "hpcrl" / "configs" / "cartpole.yaml"),
                   help="config file both trees run (default: this tree's default job)")
    p.add_argument("--out", help="keep the run directories here (default: a temporary directory)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for both trees (repeatable)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hpcrl-cycle-compare-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        old = Path(args.ref_tree).resolve() if args.ref_tree else unpack(args.ref, Path(tmp) / "ref")
        if not (old / "hpcrl" / "__init__.py").is_file():
            p.error(f"--ref-tree {args.ref_tree}: no hpcrl package in it (expected DIR/hpcrl/__init__.py)")
        trees = {"old": old, "new": Path(args.new)}
        ref_name = args.ref_tree or args.ref
        rows, ratios, cpu_ratios = [], [], []
        for rep in range(args.reps):
            got = {}
            for name in (("old", "new") if rep % 2 == 0 else ("new", "old")):
                got[name] = r = run_job(trees[name], Path(args.config).resolve(), out / f"{name}-{rep}", args.steps,
                                        args.overrides)
                rows.append((name, rep, r))
            ratios.append((got["new"]["env_steps"] / got["new"]["wall"]) / (got["old"]["env_steps"] / got["old"]["wall"]))
            cpu_ratios.append((got["new"]["cpu"] / got["new"]["env_steps"]) / (got["old"]["cpu"] / got["old"]["env_steps"]))
        print(f"{'tree':5s} {'rep':>3s} {'env steps':>10s} {'wall s':>7s} {'steps/s':>8s} {'grads/s':>8s} {'cpu s/1k':>9s}")
        for name, rep, r in rows:
            print(f"{name:5s} {rep:3d} {r['env_steps']:10d} {r['wall']:7.1f} {r['env_steps'] / r['wall']:8.0f} "
                  f"{r['gradients'] / r['wall']:8.1f} {1e3 * r['cpu'] / r['env_steps']:9.3f}")
        gm = lambda x: float(np.exp(np.mean(np.log(x))))  # noqa: E731
        print(f"ratio new/old env steps/s per rep: {', '.join(f'{x:.2f}' for x in ratios)}; geometric mean "
              f"{gm(ratios):.2f} (old = {ref_name})")
        print(f"ratio new/old CPU seconds per env step: {', '.join(f'{x:.2f}' for x in cpu_ratios)}; geometric mean "
              f"{gm(cpu_ratios):.2f}")
        last_new = [r for name, _, r in rows if name == "new"][-1]
        print("\n".join(cycle_table(last_new["run_dir"])))
    return 0
