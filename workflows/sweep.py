"""The Stellaris sensitivity sweep: one run per threshold decay d, then a summary of all runs.

    python workflows/sweep.py --site local -o stop.total_env_steps=2000 --d 0.96 1.0
    python workflows/sweep.py --site polaris --account MyProject --queue debug-scaling --parallel-runs 2

Each value of aggregation.d (Stellaris Eq. 3; d = 1 is pure async) is one Parsl MPI app; a
dependent app reads every run's run.h5 with h5py when all have finished and writes
OUT/summary.csv. Runs go to OUT/d0.96, OUT/d1.0, ... (OUT default: runs/sweep-NAME-TIME).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import parsl
from parsl import python_app

from _common import (ConfigError, add_site_arguments, base_config, fail, make_config, parsl_scripts_on_path,
                     site_settings, stamp)
from hpcrl.parsl_runs import mpi_run, prepare

STELLARIS_GRID = (0.92, 0.94, 0.96, 0.98, 1.0)
COLUMNS = ("d", "episodes", "env_steps", "final_return", "best_return", "run_dir")


def summarise_run(run_dir: str, window: int = 20) -> dict:
    """Episodes, steps and returns of one run, from its HDF5 record (h5py only)."""
    import h5py
    import numpy as np

    with h5py.File(Path(run_dir) / "run.h5", "r", locking=False) as f:
        returns = np.asarray(f["episodes/return"][:], dtype=float)
        steps = int(f["episodes/env_steps"][-1]) if len(returns) and "env_steps" in f["episodes"] else 0
    rolling = np.convolve(returns, np.ones(window) / window, mode="valid") if len(returns) >= window else returns
    return {"episodes": len(returns), "env_steps": steps,
            "final_return": float(rolling[-1]) if len(rolling) else float("nan"),
            "best_return": float(rolling.max()) if len(rolling) else float("nan")}


@python_app(executors=["local"])
def summarise(runs: dict, csv_path: str, window: int = 20, inputs=()) -> list[dict]:
    """Runs once every run in ``inputs`` has finished: one row per run, written to ``csv_path``."""
    rows = [{"d": d, **summarise_run(run_dir, window), "run_dir": run_dir} for d, run_dir in sorted(runs.items())]
    with open(csv_path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_site_arguments(parser)
    parser.add_argument("--d", type=float, nargs="+", default=list(STELLARIS_GRID),
                        help=f"values of aggregation.d (default: {' '.join(map(str, STELLARIS_GRID))})")
    parser.add_argument("--out", help="sweep directory (default: runs/sweep-NAME-TIME)")
    parser.add_argument("--parallel-runs", type=int, default=1, help="runs at the same time in one Parsl block")
    args = parser.parse_args(argv)
    try:
        cfg = base_config(args)
        out = Path(args.out or f"runs/sweep-{cfg.name}-{stamp()}").absolute()
        apps = {d: prepare(base_config(args, [f"aggregation.d={d}"]), args.site, out / f"d{d}") for d in args.d}
        nodes = max(run.resources["num_nodes"] for run in apps.values()) * args.parallel_runs
        parsl_cfg = make_config(args.site, **site_settings(args, nodes, args.parallel_runs, out / "parsl"))
    except ConfigError as exc:
        return fail(str(exc))
    print(f"sweep {out} on {args.site}: d in {args.d}")
    parsl_scripts_on_path()
    with parsl.load(parsl_cfg):
        futures = [mpi_run(run.command, stdout=str(run.job_dir / "app.out"), stderr=str(run.job_dir / "app.err"),
                           parsl_resource_specification=run.resources) for run in apps.values()]
        summary = summarise({d: str(run.run_dir) for d, run in apps.items()}, str(out / "summary.csv"),
                            cfg.stop.return_window, inputs=futures)
        try:
            rows = summary.result()
        except Exception as exc:  # a run failed, so the summary never ran
            print(f"sweep failed: {exc}; see the app.out/app.err files under {out}")
            return 1
    print(f"{'d':>6} {'episodes':>9} {'env steps':>10} {'final return':>13} {'best return':>12}")
    for r in rows:
        print(f"{r['d']:>6} {r['episodes']:>9} {r['env_steps']:>10} {r['final_return']:>13.1f} {r['best_return']:>12.1f}")
    print(f"summary: {out / 'summary.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
