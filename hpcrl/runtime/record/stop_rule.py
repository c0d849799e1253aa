"""When a run stops (``stop.*``): one rule for every runner and for the in-process batched loop."""
from __future__ import annotations

import math
from collections import deque
from typing import Iterable


class StopRule:
    """Total env steps, the mean return of the last ``return_window`` episodes, wall-clock seconds, rounds."""

    def __init__(self, stop_cfg) -> None:
        self.cfg = stop_cfg
        self.returns: deque[float] = deque(maxlen=stop_cfg.return_window)

    def add_returns(self, returns: Iterable[float]) -> None:
        self.returns.extend(map(float, returns))

    def mean_return(self) -> float:
        return float(sum(self.returns) / len(self.returns)) if self.returns else math.nan

    def reason(self, env_steps: int, wall_seconds: float, rounds: int | None = None) -> str | None:
        """Why the run should stop now, or None (``rounds``: rounds ended, where the caller counts them)."""
        s = self.cfg
        if env_steps >= s.total_env_steps:
            return f"stop.total_env_steps={s.total_env_steps} reached"
        if s.target_return is not None and len(self.returns) >= s.return_window \
                and self.mean_return() >= s.target_return:
            return f"stop.target_return={s.target_return} reached (last {s.return_window} episodes)"
        if s.max_wall_seconds is not None and wall_seconds >= s.max_wall_seconds:
            return f"stop.max_wall_seconds={s.max_wall_seconds} reached"
        if s.max_rounds is not None and rounds is not None and rounds >= s.max_rounds:
            return f"stop.max_rounds={s.max_rounds} reached"
        return None
