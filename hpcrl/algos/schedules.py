"""Learning-rate schedules an algorithm's config declares (``lr_schedule``); rank 0 applies them before each step."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearAnneal:
    """lr (1 - consumed / horizon), floored at 0: CleanRL's linear annealing over the env steps consumed."""

    lr: float
    horizon: int

    def at(self, consumed: int) -> float:
        return self.lr * max(0.0, 1.0 - consumed / self.horizon)
