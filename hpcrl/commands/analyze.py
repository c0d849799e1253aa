"""`hpcrl analyze RUN_DIR [RUN_DIR ...]`: figures, per-round CSV, Markdown summary, HTML report.

The code lives in the standalone ``analysis/`` folder (h5py, numpy, matplotlib only, so a
user can copy it to a laptop). It is imported as the ``hpcrl_analysis`` package when the
wheel ships it, else from ``analysis/`` next to this source tree.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from hpcrl.errors import ConfigError


def load_analysis():
    """The hpcrl_analysis package: installed, or from the source tree's analysis/ folder."""
    try:
        return importlib.import_module("hpcrl_analysis")
    except ImportError:
        pass
    folder = Path(__file__).resolve().parents[2] / "analysis"
    if not (folder / "hpcrl_analysis" / "__init__.py").is_file():
        raise ConfigError("hpcrl analyze: the hpcrl_analysis package is not installed and no analysis/ folder "
                          f"was found at {folder}")
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("hpcrl_analysis")
    finally:
        sys.path.remove(str(folder))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        load_analysis().cli.add_arguments(parser)
    except ImportError as exc:  # matplotlib missing: say so when the command runs
        parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        parser.set_defaults(_import_error=str(exc))


def main(args: argparse.Namespace) -> int:
    if getattr(args, "_import_error", None):
        raise ConfigError(f"analysis needs h5py, numpy and matplotlib ({args._import_error}); "
                          "pip install 'hpcrl[analysis]'")
    return load_analysis().cli.run_cli(args)
