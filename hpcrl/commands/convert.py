"""`hpcrl convert RUN_DIR [RUN_DIR ...]`: rewrite runs' HDF5 files in HDF5 1.10's format for older readers.

For runs an older hpcrl wrote with ``libver="latest"`` (HDF5 2.0's format under the h5py 3.16
wheel), which HDF5 1.10-1.14 tools (a site's h5dump, h5ls, HDFView, an older h5py) cannot open.
Rewrites run.h5 and every traj/actor-*.h5 in place (:mod:`hpcrl.io.convert`), under the run lock.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (each holds run.h5)")


def main(args: argparse.Namespace) -> int:
    from hpcrl.io.convert import convert_run

    for run_dir in args.run_dirs:
        files = convert_run(run_dir)
        print(f"hpcrl convert: {run_dir}: rewrote {len(files)} files in HDF5 1.10's format")
    return 0
