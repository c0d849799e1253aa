"""Losses, estimators and the algorithm objects the runtime holds (no MPI here).

:func:`make_algorithm` maps ``algo.name`` to an :class:`~hpcrl.algos.base.Algorithm` through the registry;
the runtime calls it and never imports an algorithm module itself.
"""
from __future__ import annotations

from typing import Any


def make_algorithm(algo_cfg: Any, model_cfg: Any, aggregation_cfg: Any):
    """The algorithm object for ``algo_cfg.name`` (one per role), from the registry (:mod:`hpcrl.algos.registry`)."""
    from importlib import import_module

    from hpcrl.algos.registry import ALGORITHMS

    entry = ALGORITHMS.get(algo_cfg.name)
    if entry is None:
        raise ValueError(f"algo.name={algo_cfg.name!r}; allowed: {', '.join(ALGORITHMS)}")
    module, cls = entry.algorithm.split(":")
    algorithm = getattr(import_module(module), cls)
    if entry.takes_aggregation:
        return algorithm(algo_cfg, model_cfg, aggregation_cfg)
    return algorithm(algo_cfg, model_cfg)
