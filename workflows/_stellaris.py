"""What the two Stellaris workflows share: the shipped workload configs, per-algorithm overrides,
the per-run numbers read from HDF5 (hpcrl.bench.stellaris_runs, shared with the benches), and the figures."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from hpcrl.bench.stellaris_runs import artifact_logs, run_numbers  # noqa: F401 (the workflows import them from here)
from hpcrl.config import RunConfig, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / "stellaris"
WORKLOADS = ("hopper", "humanoid", "walker2d", "spaceinvaders", "qbert", "gravitar")
RUN_COLUMNS = ("final_return", "best_return", "eval_return", "wall_seconds", "env_steps", "episodes", "updates", "cost",
               "staleness_mean")
"""The columns of :func:`run_numbers` (one run's numbers; hpcrl/bench/stellaris_runs.py, shared with the benches)."""


def workload_config(workload: str, algo: str, overrides: list[str], extra: list[str] = ()) -> RunConfig:
    """hpcrl/configs/stellaris/WORKLOAD_ALGO.yaml with ``overrides`` then ``extra``; an ``algo.X=...``
    override is applied only where the algorithm has a field X (e.g. train_batch_size: PPO only)."""
    path = CONFIGS / f"{workload}_{algo}.yaml"
    fields = type(load_config(path).algo).model_fields
    kept = [o for o in overrides if not o.startswith("algo.") or o.split("=", 1)[0].split(".")[1] in fields]
    return load_config(path, [*kept, *extra])


def mean_std(values: list[float]) -> tuple[float, float]:
    import numpy as np

    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    return (float(v.mean()), float(v.std())) if v.size else (math.nan, math.nan)


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    return path


def curves(run_dirs: list[str], x: str = "time", points: int = 100, window: int = 20) -> dict:
    """Mean, min and max smoothed return of repeats on a common grid of x ('time' s or 'env_steps')."""
    from hpcrl.commands.analyze import load_analysis

    ha = load_analysis()
    return ha.metrics.curves_on_grid([ha.load_run(d) for d in run_dirs], x, points, window)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def run_grid(parsl_cfg, apps: list, summarise, out: Path, what: str):
    """Run every prepared app (``(meta, AppRun)`` pairs) as a Parsl MPI app, then the dependent ``summarise``
    app on their metadata; its rows, or None (with one line saying where the logs are) when a run failed."""
    import parsl

    from _common import parsl_scripts_on_path
    from hpcrl.parsl_runs import mpi_run

    parsl_scripts_on_path()
    with parsl.load(parsl_cfg):
        futures = [mpi_run(run.command, stdout=str(run.job_dir / "app.out"), stderr=str(run.job_dir / "app.err"),
                           parsl_resource_specification=run.resources) for _, run in apps]
        summary = summarise([meta for meta, _ in apps], str(out), inputs=futures)
        try:
            return summary.result()
        except Exception as exc:  # a run failed, so the summary never ran
            print(f"{what} failed: {exc}; see the app.out/app.err files under {out}")
            return None
