"""Losses, estimators and the algorithm objects the runtime holds (no MPI here).

:func:`make_algorithm` is the one place that maps ``algo.name`` to an :class:`~hpcrl.algos.base.Algorithm`;
the runtime calls it and never imports an algorithm module itself.
"""
from __future__ import annotations

from typing import Any

ALGOS = ("ppo", "ha2c", "hddpg", "impact", "ippo", "mappo", "iql", "vdn")


def make_algorithm(algo_cfg: Any, model_cfg: Any, aggregation_cfg: Any):
    """The algorithm object for ``algo_cfg.name`` (one per role)."""
    if algo_cfg.name == "ppo":
        from hpcrl.algos.ppo import PPO

        return PPO(algo_cfg, model_cfg, aggregation_cfg)
    if algo_cfg.name == "impact":
        from hpcrl.algos.impact import IMPACT

        return IMPACT(algo_cfg, model_cfg, aggregation_cfg)
    if algo_cfg.name == "ha2c":
        from hpcrl.algos.ha2c import HA2C

        return HA2C(algo_cfg, model_cfg)
    if algo_cfg.name == "hddpg":
        from hpcrl.algos.hddpg import HDDPG

        return HDDPG(algo_cfg, model_cfg)
    if algo_cfg.name in ("ippo", "mappo", "iql", "vdn"):  # MARLess' algorithms (hpcrl.marl)
        from hpcrl.marl import dqn, ppo

        cls = {"ippo": ppo.IPPO, "mappo": ppo.MAPPO, "iql": dqn.IQL, "vdn": dqn.VDN}[algo_cfg.name]
        return cls(algo_cfg, model_cfg, aggregation_cfg)
    raise ValueError(f"algo.name={algo_cfg.name!r}; allowed: {', '.join(ALGOS)}")
