"""Waiting without spinning: the one back-off every hpcrl wait loop uses.

MPICH's blocking calls poll the network at full speed, which on an oversubscribed node takes
the core from the rank that has work; threads of the serial runner share one interpreter.
So every wait here is a test-and-sleep loop with a sleep that doubles up to a cap.
"""
from __future__ import annotations

from hpcrl.runtime.clock import WALL, Clock


class Backoff:
    """Sleep ``first`` seconds, doubling up to ``cap``; ``reset`` after useful work; ``waited`` sums the sleeps.
    A role's back-off sleeps on its job's ``clock`` (virtual under launch.runner=sim)."""

    def __init__(self, first: float = 1e-5, cap: float = 1e-3, clock: Clock = WALL):
        self.first, self.cap, self.clock = first, cap, clock
        self.delay, self.waited = first, 0.0

    def sleep(self) -> None:
        self.clock.sleep(self.delay)
        self.waited += self.delay
        self.delay = min(self.delay * 2, self.cap)

    def reset(self) -> None:
        self.delay = self.first
