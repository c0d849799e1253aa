"""What the two Stellaris workflows share: the shipped workload configs, per-algorithm overrides,
the per-run numbers read from HDF5 (through the standalone analysis package), and the figures."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from hpcrl.config import RunConfig, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / "stellaris"
WORKLOADS = ("hopper", "humanoid", "walker2d", "spaceinvaders", "qbert", "gravitar")
RUN_COLUMNS = ("final_return", "best_return", "wall_seconds", "env_steps", "episodes", "cost", "staleness_mean")


def workload_config(workload: str, algo: str, overrides: list[str], extra: list[str] = ()) -> RunConfig:
    """hpcrl/configs/stellaris/WORKLOAD_ALGO.yaml with ``overrides`` then ``extra``; an ``algo.X=...``
    override is applied only where the algorithm has a field X (e.g. train_batch_size: PPO only)."""
    path = CONFIGS / f"{workload}_{algo}.yaml"
    fields = type(load_config(path).algo).model_fields
    kept = [o for o in overrides if not o.startswith("algo.") or o.split("=", 1)[0].split(".")[1] in fields]
    return load_config(path, [*kept, *extra])


def run_numbers(run_dir: str, window: int = 20) -> dict:
    """One run's headline numbers from its run.h5 (h5py through hpcrl_analysis): final and best return
    (mean of the last / best ``window`` episodes), wall-clock, env steps, episodes, the Stellaris cost
    (sum of the per-round cost, USD at the paper's AWS prices) and the mean admitted staleness."""
    import numpy as np

    from hpcrl.commands.analyze import load_analysis

    ha = load_analysis()
    M = ha.metrics
    run = ha.load_run(run_dir)
    prices = M.load_prices(None)
    ax = M.episode_axes(run)
    ret = ax["return"]
    smooth = M.smooth(ret, window) if len(ret) else ret
    st = M.admitted_staleness(run)["staleness"]
    cost = M.per_round(run, prices)["cost"]
    return {"final_return": float(ret[-window:].mean()) if len(ret) else math.nan,
            "best_return": float(smooth.max()) if len(smooth) else math.nan,
            "wall_seconds": M.wall_seconds(run), "env_steps": int(ax["env_steps"][-1]) if len(ret) else 0,
            "episodes": int(len(ret)), "cost": float(np.nansum(cost)) if len(cost) else 0.0,
            "staleness_mean": float(st.mean()) if len(st) else math.nan}


def artifact_logs(run_dir: str, logs_dir: Path) -> None:
    """The Stellaris artifact's info/timeline CSV files of one run (scheduler = its aggregation.policy)."""
    from hpcrl.commands.analyze import load_analysis

    ha = load_analysis()
    logs_dir.mkdir(parents=True, exist_ok=True)
    ha.stellaris_csv.write_stellaris_csv([ha.load_run(run_dir)], logs_dir, ha.metrics.load_prices(None), "policy")


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
