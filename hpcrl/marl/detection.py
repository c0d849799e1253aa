"""Performance-decrease detection for dynamic learner sharing (MARLess section 4.3.1).

Each round t every agent i has a reward r_i,t (here: its mean episodic return in the round).
It is normalised per agent, the normalised rewards are aggregated into one global reward R_t,
and R_t enters a tolerant window of the last W rounds. A least-squares line is fitted through
the window; sharing is toggled (on -> off, off -> on) only when the window is full and the
slope k < gamma, and the window is cleared after each toggle so training can settle.

The seed's formula for the per-agent normalisation is illegible in the print (section 4.3.1,
"r_i' := ..."). hpcrl reads it as min-max normalisation of each agent's rewards over the
window, r'_i,s = (r_i,s - min_w r_i) / (max_w r_i - min_w r_i) (0 for an agent whose rewards
did not change), and R_s = mean_i r'_i,s. Every agent then weighs the same whatever the scale
of its rewards, and R is in [0, 1], so k is "the share of the window's range gained per
round": a perfectly linear rise over W = 10 rounds has k = 1/9, the largest a window can show
is 0.15 (a step), and the seed's gamma = 0.1 for MPE toggles unless the reward is clearly
rising. (gamma <= -0.15 never toggles on this scale.)
"""
from __future__ import annotations

from collections import deque

import numpy as np


def least_squares_slope(values) -> float:
    """Slope k of the least-squares line through (0, v_0), (1, v_1), ... (NaN for fewer than 2 points)."""
    y = np.asarray(values, dtype=np.float64)
    if y.size < 2:
        return float("nan")
    x = np.arange(y.size, dtype=np.float64)
    x -= x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


def global_rewards(agent_rewards) -> np.ndarray:
    """[W] global rewards R_s from a window of per-agent rewards [W, A] (per-agent min-max, then mean)."""
    r = np.asarray(agent_rewards, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"expected per-agent rewards [rounds, agents], got shape {r.shape}")
    low, span = r.min(axis=0), r.max(axis=0) - r.min(axis=0)
    scaled = np.where(span > 1e-12, (r - low) / np.where(span > 1e-12, span, 1.0), 0.0)
    return scaled.mean(axis=1)


class SharingToggle:
    """The tolerant window (W rounds of per-agent rewards) and the toggle rule; ``sharing`` is the current strategy."""

    def __init__(self, window: int = 10, gamma: float = 0.1, sharing: bool = False) -> None:
        if window < 2:
            raise ValueError(f"window={window}: a slope needs at least 2 rounds")
        self.window: deque[np.ndarray] = deque(maxlen=window)
        self.gamma = gamma
        self.sharing = sharing
        self.last_slope = float("nan")

    def observe(self, agent_rewards) -> bool:
        """Add one round's rewards [A]; True when this round toggled the strategy (window full, k < gamma)."""
        r = np.asarray(agent_rewards, dtype=np.float64).reshape(-1)
        if self.window and r.shape != self.window[0].shape:
            raise ValueError(f"expected {self.window[0].size} agent rewards, got {r.size}")
        self.window.append(r)
        self.last_slope = least_squares_slope(global_rewards(np.stack(self.window)))
        if len(self.window) < self.window.maxlen or not self.last_slope < self.gamma:
            return False
        self.sharing = not self.sharing
        self.window.clear()
        return True
