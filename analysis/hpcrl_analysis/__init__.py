"""Post-hoc analysis of hpcrl run directories with h5py, numpy and matplotlib only (never hpcrl).

Copy the ``analysis/`` folder anywhere and run ``python analyze.py RUN_DIR [RUN_DIR ...]``;
``hpcrl analyze`` calls the same code. From Python: ``hpcrl_analysis.analyze(run_dirs, out_dir)``.
"""
from . import cli, clusterenv, figures, marl, metrics, pricing, report, stellaris_csv, sweep
from .cli import analyze, main
from .h5read import AnalysisError, load_run

__all__ = ["AnalysisError", "analyze", "cli", "clusterenv", "figures", "load_run", "main", "marl", "metrics", "pricing", "report",
           "stellaris_csv", "sweep"]
