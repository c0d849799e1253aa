"""A round's statistics as the record keeps them while the round runs, and the ``rounds`` row they make.

:class:`~hpcrl.runtime.record.run_record.RunRecord` adds to :func:`new_round`'s dict as gradients, steps, fragment
reports (or a node's summary) and the fused loop's windows come, and at the round's end writes :func:`round_row` of
it; what ``algo.end_round`` reads of it is :func:`mean_kl` and the episodes' columns.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def new_round() -> dict[str, Any]:
    """An empty round."""
    return {"env_steps": 0, "episodes": 0, "updates": 0, "staleness": [], "loss": [], "grad_stats": [],
            "returns": [], "lengths": [], "learner_seconds": 0.0, "actor_seconds": 0.0, "actors": set(),
            "active_max": 0, "episode_columns": {"actor": [], "env_index": [], "return": []}, "reports": [],
            "admitted": 0, "dropped": 0,
            "algo_stats": {}, "cycles": {}, "cycle_count": 0}


def _agg(a: np.ndarray, fn) -> float:
    return float(fn(a)) if a.size else math.nan


def round_row(r: dict[str, Any], round_index: int, start: float, now: float, consumed: int,
              threshold: float | None, active: int | None) -> dict[str, Any]:
    """The ``rounds`` row of round ``r`` (``start``, ``now``: on the run's clock). ``active``: the active learner
    groups; None for the fused loop, whose row leaves empty what only the roles measure (threshold, staleness,
    learner and actor seconds, active actors and groups)."""
    # the values as they were told (the roles' Python floats; the fused loop's float32 arrays: float32 means)
    ret = np.asarray(r["returns"])
    row = {"round": round_index, "start": start, "duration": now - start,
           "env_steps": r["env_steps"], "env_steps_total": consumed, "episodes": r["episodes"],
           "updates": r["updates"], "loss": _agg(np.asarray(r["loss"]), np.nanmean),
           "reward_mean": _agg(ret, np.mean), "reward_max": _agg(ret, np.max), "reward_min": _agg(ret, np.min),
           "reward_std": _agg(ret, np.std)}
    if active is not None:
        st = np.asarray(r["staleness"], dtype=np.float64)
        row.update({
            "threshold": math.nan if threshold is None else threshold,
            "staleness_mean": _agg(st, np.mean), "staleness_max": _agg(st, np.max),
            "staleness_min": _agg(st, np.min), "staleness_std": _agg(st, np.std),
            "learner_seconds": r["learner_seconds"], "actor_seconds": r["actor_seconds"],
            "active_actors": len(r["actors"]), "active_groups": max(r["active_max"], active)})
    return row


def mean_kl(r: dict[str, Any]) -> float:
    """The mean of the round's gradients' finite ``kl`` (NaN without one)."""
    kl = np.fromiter((g.get("kl", math.nan) for g in r["grad_stats"]), float, len(r["grad_stats"]))
    return _agg(kl[np.isfinite(kl)], np.mean)
