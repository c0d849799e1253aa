"""When a learner group may compute again (``plan.pacing``, declared by each admission policy).

- ``free``: as soon as it holds a batch (Stellaris, pure async, Softsync);
- ``lockstep`` (sync admission): its next gradient only on a version newer than its last base version,
  so every applied gradient has staleness 0;
- ``held`` (SSP, Ho et al. 2013): not while the parameter rank holds this group's word up (its gradient
  waits in the admission queue, too far ahead of the slowest group).

Every wait keeps the group alive: ``tick`` (heartbeat, fragments in) between naps, False as soon as the
run stops.
"""
from __future__ import annotations

from typing import Callable

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.transport import control

SHORT_WAIT_CAP = 1e-4
"""Longest nap while waiting for the parameter rank to apply this group's own push (sync admission's
lockstep, on-policy batches): the wait is a few hundred microseconds, so a nap doubling up to 1 ms would
add up to half of it again to every gradient."""


class Pacing:
    def __init__(self, pacing: str, counters, board, groups: int, group: int, tick: Callable[[], None],
                 lap: Callable[[str], float], clock: Clock = WALL) -> None:
        self.lockstep, self.held = pacing == "lockstep", pacing == "held"
        self.counters, self.board = counters, board
        self.held_word = control.held_word(groups, group)
        self.tick, self.lap = tick, lap  # lap: the group's cycle clock (learner_cycles phases)
        self.clock = clock
        self.last_base: int | None = None  # base version of this group's last push

    def before_pull(self) -> bool:
        """Wait until this group may take weights for its next gradient; False if the run stops."""
        if self.lockstep and self.last_base is not None:
            if not self.wait_while(lambda: self.board.latest_version() <= self.last_base, cap=SHORT_WAIT_CAP):
                return False
        return not self.held or self.wait_while(lambda: self.counters.read(self.held_word))

    def pushed(self, version: int) -> None:
        self.last_base = version

    def stopping(self) -> bool:
        return bool(self.counters.read(control.STOP))

    def wait_while(self, condition: Callable[[], bool], cap: float = 1e-3) -> bool:
        """Sleep (ticking) while ``condition()``, naps doubling from 50 us to ``cap``; False if the run stops."""
        backoff = Backoff(5e-5, cap, self.clock)
        while condition():
            if self.stopping():
                return False
            self.tick()
            backoff.sleep()
            self.lap("idle")
        return True
