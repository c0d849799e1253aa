#!/usr/bin/env python3
"""Analyse hpcrl run directories: `python analyze.py RUN_DIR [RUN_DIR ...] [--out DIR] [--prices prices.json]`.

Needs h5py, numpy and matplotlib only; copy this folder next to your runs and run it.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hpcrl_analysis import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
