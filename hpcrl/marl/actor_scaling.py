"""Cost-aware actor scaling (MARLess section 4.4, Eq. 2).

For each policy j the convexity ratios C^j of the last W rounds are kept (the tolerant window
of section 4.3.1, reused). The scaling ratio is their min-max normalisation at round t:

    S_t^j = (C_max^j - C_t^j) / (C_max^j - C_min^j)

(a low ratio: a flat, poorly explored region: more data helps). hpcrl takes S = 1 while the
window holds no spread (fewer than two distinct values): no evidence yet, so ask for the most
data. The policy's actor demand is I_t^j = clip(S_t^j * I_max, I_min, I_max), and the total for
the next round (Eq. 2):

    I_threshold = beta (I_max - I_min),   I_average = sum_j I_t^j / |N'|
    I_t = max_j I_t^j  if I_average >= I_threshold,  else I_average

Seed settings (section 6.1): W = 10, beta = 0.5, I_max = 50, I_min = I_max / N with N the
number of agents. Actor counts are whole: I_min and I_t are rounded up.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np


def min_actors(max_actors: int, num_agents: int) -> int:
    """I_min = I_max / N, rounded up (at least 1)."""
    return max(1, math.ceil(max_actors / num_agents))


def scaling_bounds(max_actors: int | None, min_actors_asked: int | None, count: int,
                   num_agents: int) -> tuple[int, int]:
    """(I_min, I_max) for ``count`` actor ranks: I_max = ``max_actors`` capped at ``count`` (default ``count``),
    I_min = ``min_actors_asked`` or I_max / N rounded up (section 6.1)."""
    hi = min(max_actors or count, count)
    return (min_actors_asked or min_actors(hi, num_agents)), hi


def scaling_ratio(window) -> float:
    """S_t = (C_max - C_t) / (C_max - C_min) over the window (last entry = C_t); 1 without spread."""
    c = np.asarray(window, dtype=np.float64)
    if c.size == 0:
        return 1.0
    top, low = c.max(), c.min()
    if not top > low:
        return 1.0
    return float((top - c[-1]) / (top - low))


def policy_demand(ratio: float, max_actors: int, min_actors: int) -> float:
    """I^j = clip(S^j * I_max, I_min, I_max)."""
    return float(np.clip(ratio * max_actors, min_actors, max_actors))


def total_actors(demands, max_actors: int, min_actors: int, beta: float = 0.5) -> int:
    """I_t from the per-policy demands (Eq. 2), rounded up."""
    d = np.asarray(demands, dtype=np.float64)
    if d.size == 0:
        raise ValueError("total_actors: no policies")
    average = float(d.mean())
    threshold = beta * (max_actors - min_actors)
    return int(math.ceil(d.max() if average >= threshold else average - 1e-9))


class ActorScaler:
    """Per-policy windows of convexity ratios and the actor count they ask for."""

    def __init__(self, max_actors: int = 50, num_agents: int = 1, beta: float = 0.5, window: int = 10,
                 min_actors_override: int | None = None) -> None:
        self.max_actors = max_actors
        self.min_actors = min_actors_override or min_actors(max_actors, num_agents)
        if self.min_actors > max_actors:
            raise ValueError(f"I_min={self.min_actors} exceeds I_max={max_actors}")
        self.beta = beta
        self.size = window
        self.windows: dict[int, deque[float]] = {}
        self.demands: dict[int, float] = {}
        """The newest I^j of each policy (set by :meth:`observe`)."""

    def observe(self, ratios: dict[int, float]) -> int:
        """Add this round's convexity ratio of each current policy; the actors for the next round."""
        for j in list(self.windows):
            if j not in ratios:  # a merged (parked) policy leaves the scaler
                del self.windows[j]
        self.demands = {}
        for j, c in ratios.items():
            w = self.windows.setdefault(j, deque(maxlen=self.size))
            w.append(float(c))
            self.demands[j] = policy_demand(scaling_ratio(w), self.max_actors, self.min_actors)
        return total_actors(list(self.demands.values()), self.max_actors, self.min_actors, self.beta)

    @property
    def threshold(self) -> float:
        """I_threshold = beta (I_max - I_min)."""
        return self.beta * (self.max_actors - self.min_actors)
