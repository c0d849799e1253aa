"""Learning curves from a run's record, read the same way by every learning benchmark.

The return at a mark M is the mean return of the last ``last`` episodes that ended at or before M
environment steps of the run (the episodes table's ``env_steps``), so runs that log episodes at
different rates are compared at the same budget.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

LAST = 20
"""Episodes averaged at each mark."""


def return_at(steps: np.ndarray, returns: np.ndarray, mark: int, last: int = LAST) -> float:
    """Mean return of the ``last`` episodes that ended at or before ``mark`` env steps (NaN if none)."""
    sel = np.asarray(returns)[np.asarray(steps) <= mark]
    return float(np.mean(sel[-last:])) if sel.size else float("nan")


def episodes(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(env steps of the run when each episode ended, its return), in the order recorded."""
    from hpcrl.io import read_table

    ep = read_table(Path(run_dir) / "run.h5", "episodes", ["env_steps", "return"])
    return ep["env_steps"], ep["return"]


def run_hpcrl(config: str | Path, run_dir: Path, runner: str, overrides: list[str], log: Path) -> float:
    """``hpcrl run`` in a subprocess on one core (OMP_NUM_THREADS=1); returns its wall seconds.
    Raises RuntimeError with the last line of its output when it fails."""
    import time

    cmd = [sys.executable, "-m", "hpcrl", "run", str(config), "--runner", runner,
           *[a for o in [*overrides, f"io.run_dir={run_dir}", "io.log_seconds=60"] for a in ("-o", o)]]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"hpcrl run {Path(config).name} failed with exit code {done.returncode}: {tail[0]} ({log})")
    return wall


def welch(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of Welch's t-test (NaN with fewer than two finite values a side)."""
    from scipy import stats

    a, b = [x for x in a if math.isfinite(x)], [x for x in b if math.isfinite(x)]
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)
