"""Start-up: seconds from the `hpcrl run` command to the first environment step, per runner.

Each variant starts the default CartPole job (or CONFIG) as a fresh ``hpcrl run`` with a tiny
step budget; the first step is read back from the run's run.h5 (the earliest fragment's start,
:mod:`hpcrl.runtime.runners.startup`) and timed from just before the command was started. Variants:

- ``mpi``: the MPI runner as shipped (ranks forked from the prestart server, ``launch.prestart``);
- ``mpi-no-prestart``: the MPI runner with ``-o launch.prestart=false`` (every rank imports its libraries);
- ``serial``: all roles in the launcher process.

The floor is ``python -c "import torch"`` timed the same way: no rank can step before one torch
import. Variants and the floor run round-robin, so machine load hits them alike; the table gives
median and min over the repeats, the median's ratio to the floor's median, and the CPU seconds all
processes of the run used (on a shared machine the wall-clock depends on the other load, the CPU
seconds much less).

    hpcrl bench startup [--repeats 3] [--variants mpi,mpi-no-prestart,serial] [CONFIG] [-o KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "mpi": ["--runner", "mpi"],
    "mpi-no-prestart": ["--runner", "mpi", "-o", "launch.prestart=false"],
    "serial": ["--runner", "serial"],
}
FLOOR = "import torch (floor)"


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's ended children and their descendants so far."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def time_floor() -> dict:
    """Wall and CPU seconds of ``python -c "import torch"`` (interpreter start included)."""
    cpu, start = children_cpu(), time.time()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return {"first_step": time.time() - start, "exit": float("nan"), "recorded": float("nan"),
            "cpu": children_cpu() - cpu}


def time_variant(name: str, config: str | None, overrides: list[str], run_dir: Path, timeout: float) -> dict:
    """Start one ``hpcrl run``; the seconds to its first env step and to its exit, and the recorded startup."""
    from hpcrl.io import read_attrs
    from hpcrl.runtime.runners.startup import first_step_unix

    cmd = [sys.executable, "-m", "hpcrl", "run", *([config] if config else []), *VARIANTS[name],
           *[a for o in ["stop.target_return=null", "io.log_seconds=60", f"io.run_dir={run_dir}", *overrides]
             for a in ("-o", o)]]
    cpu, start = children_cpu(), time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    end = time.time()
    cpu = children_cpu() - cpu
    if res.returncode != 0:
        raise RuntimeError(f"{name}: hpcrl run failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    first = first_step_unix(run_dir / "run.h5", after=start)
    if first is None:
        raise RuntimeError(f"{name}: no fragment in {run_dir / 'run.h5'}")
    recorded = read_attrs(run_dir / "run.h5").get("startup_seconds")
    return {"first_step": first - start, "exit": end - start, "cpu": cpu,
            "recorded": float(recorded) if recorded is not None else float("nan")}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench startup", description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="YAML config (default: the default job, CartPole-v1 on 4 ranks)")
    p.add_argument("--repeats", type=int, default=3, help="runs per variant (default 3)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--steps", type=int, default=512, help="stop.total_env_steps of each run (default 512)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take (default 300)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    overrides = [f"stop.total_env_steps={args.steps}", *args.overrides]
    out = Path(tempfile.mkdtemp(prefix="hpcrl-startup-"))
    rows: dict[str, list[dict]] = {FLOOR: [], **{v: [] for v in variants}}
    try:
        for i in range(args.repeats):
            rows[FLOOR].append(time_floor())
            for v in variants:
                print(f"repeat {i + 1}/{args.repeats}: {v} ...", file=sys.stderr, flush=True)
                rows[v].append(time_variant(v, args.config, overrides, out / f"{v}-{i}", args.timeout))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print_table(rows, args)
    return 0


def print_table(rows: dict[str, list[dict]], args) -> None:
    floor = statistics.median(r["first_step"] for r in rows[FLOOR])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    print(f"\nstart-up: command -> first environment step; {args.config or 'default job (CartPole-v1, 4 ranks)'}, "
          f"{args.repeats} repeat(s), {cores} cores, load average {os.getloadavg()[0]:.1f}; "
          "floor = python -c 'import torch'")
    print(f"{'variant':<22} {'first step s (median)':>22} {'min':>7} {'x floor':>8} {'run.h5 startup_seconds':>23} "
          f"{'exit s':>7} {'CPU s to exit':>14}")
    for name, rs in rows.items():
        first = [r["first_step"] for r in rs]
        med = statistics.median(first)
        rec = statistics.median(r["recorded"] for r in rs)
        ext = statistics.median(r["exit"] for r in rs)
        cpu = statistics.median(r["cpu"] for r in rs)
        print(f"{name:<22} {med:>22.2f} {min(first):>7.2f} {med / floor:>8.2f} "
              f"{'-' if rec != rec else f'{rec:.2f}':>23} {'-' if ext != ext else f'{ext:.1f}':>7} {cpu:>14.1f}")
    print("CPU s to exit: user + system seconds of every process of the run (launcher, mpiexec, ranks, prestart "
          "server), start-up to shutdown; it depends far less on other load than the wall-clock does")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
