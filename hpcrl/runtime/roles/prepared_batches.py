"""Prepared batches between learner groups (MARL ``algo.postprocess_learner``, ``plan.postprocess_groups``).

Group 0 takes every fragment, runs ``algo.prepare`` once with the newest weights and sends the
prepared batch to every active policy/critic group behind it that has room (the first of them
counts its env steps); those groups train each prepared batch as it comes, without preparing it
again. A group holds at most ``BATCHES_HELD`` batches (the BACKLOG counter word): a full group
misses a batch rather than hold the others back, as actors do with fragments.
"""
from __future__ import annotations

from typing import Callable

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.transport import control

BATCHES_HELD = 2
"""Prepared batches a policy/critic group may hold (one training, one waiting) before the post-processing
group skips it."""


class PreparedBatches:
    """One group root's end of the hand-off: the sender (groups below ``postprocess_groups``) or a receiver."""

    def __init__(self, fragments, counters, group: int, groups: int, postprocess_groups: int, clock: Clock = WALL
                 ) -> None:
        self.counters, self.group, self.groups, self.first = counters, group, groups, postprocess_groups
        self.clock = clock
        self.sends = group < postprocess_groups
        self.sender = fragments.batch_sender() if self.sends else None
        self.receiver = None if self.sends else fragments.batch_receiver(group)
        self.waiting: list[dict] = []  # received, not yet trained

    def receive(self) -> None:
        if self.receiver is not None:
            self.waiting += self.receiver.poll()

    def take(self) -> dict:
        """The oldest waiting batch (``batch``, ``steps``, ``new_steps``); its place is free again."""
        self.counters.add(control.BACKLOG + self.group, -1)
        return self.waiting.pop(0)

    def send(self, batch: dict, steps: int, idle: Callable[[], None]) -> bool:
        """Send a host batch to every active receiving group with room, waiting while none has any (``idle()``
        after each nap); False when the run stopped first."""
        backoff = Backoff(5e-5, 2e-3, self.clock)
        while True:
            words = self.counters.read_all()
            targets = [g for g in range(self.first, max(int(words[control.ACTIVE]), self.first + 1))
                       if words[control.BACKLOG + g] < BATCHES_HELD]
            if targets:
                break
            if words[control.STOP]:
                return False
            backoff.sleep()
            idle()
        for i, g in enumerate(targets):
            self.counters.add(control.BACKLOG + g, 1)
            self.sender.send(g, {"batch": batch, "steps": steps, "new_steps": steps if i == 0 else 0})
        return True

    def finished(self) -> bool:
        """Every batch sent to this group has been matched (a receiver at the end of the run)."""
        if self.receiver is None:
            return True
        self.receiver.poll()
        return self.receiver.finished()

    def close(self, beat: Callable[[], None]) -> None:
        """The sender: no batch follows; wait until the others took every one."""
        if self.sender is not None:
            self.sender.close(range(self.first, self.groups), beat)
