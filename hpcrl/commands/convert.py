"""`hpcrl convert PATH [PATH ...]`: rewrite runs' HDF5 files in HDF5 1.10's format for older readers.

For runs an older hpcrl wrote with ``libver="latest"`` (HDF5 2.0's format under the h5py 3.16
wheel), which HDF5 1.10-1.14 tools (a site's h5dump, h5ls, HDFView, an older h5py) cannot open.
A PATH that is a run directory: run.h5 and every traj/actor-*.h5 are rewritten in place under the run
lock (:mod:`hpcrl.io.convert`); a PATH that is a file (e.g. a ClusterEnv AAPS record): that file.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="run directories (each holds run.h5) or .h5 files")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpcrl.io.convert import convert_file, convert_run

    for path in map(Path, args.paths):
        if path.is_file():
            convert_file(path)
            files = [path]
        else:
            files = convert_run(path)
        print(f"hpcrl convert: {path}: rewrote {len(files)} file{'s' if len(files) > 1 else ''} in HDF5 1.10's format")
    return 0
