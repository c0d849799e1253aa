"""One training run as one Parsl MPI app.

    python workflows/train.py --site local -o stop.total_env_steps=2000
    python workflows/train.py --site polaris --account MyProject --queue debug my.yaml

The run directory (default runs/NAME-TIME) gets the HDF5 record; RUN_DIR.job/ holds the resolved
config, the app's output and Parsl's logs. Exit code 0 when the run finished.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import parsl

from _common import (ConfigError, add_site_arguments, base_config, fail, make_config, parsl_scripts_on_path,
                     site_settings, stamp)
from hpcrl.parsl_runs import mpi_run, prepare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_site_arguments(parser)
    parser.add_argument("--run-dir", help="run directory (default: runs/NAME-TIME)")
    parser.add_argument("--nodes", type=int, help="nodes for the run (default: one rank per core)")
    args = parser.parse_args(argv)
    try:
        cfg = base_config(args)
        run = prepare(cfg, args.site, Path(args.run_dir or f"runs/{cfg.name}-{stamp()}"), nodes=args.nodes)
        parsl_cfg = make_config(args.site, **site_settings(args, run.resources["num_nodes"], 1, run.job_dir / "parsl"))
    except ConfigError as exc:
        return fail(str(exc))
    print(f"run {run.run_dir} on {args.site}: {run.resources['num_ranks']} ranks on {run.resources['num_nodes']} node(s)")
    parsl_scripts_on_path()
    with parsl.load(parsl_cfg):
        future = mpi_run(run.command, stdout=str(run.job_dir / "app.out"), stderr=str(run.job_dir / "app.err"),
                         parsl_resource_specification=run.resources)
        try:
            future.result()
        except Exception as exc:  # BashExitFailure and friends: the app's output says why
            print(f"run failed: {exc}; see {run.job_dir}/app.out and app.err")
            return 1
    print(f"done: {run.run_dir}/run.h5")
    return 0


if __name__ == "__main__":
    sys.exit(main())
