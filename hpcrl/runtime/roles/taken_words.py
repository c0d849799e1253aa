"""``actors.on_policy``: each learner group's TAKEN word on rank 0, the count of the group's pushes applied.

A group that has trained a batch waits until its word reaches the pushes it made, then frees the batch's places in
its backlog, and the actors sample the next batch with the newest weights (runtime/roles/learner.py). The word counts
a push once the version that holds it is published (or once it was dropped as non-finite), not when rank 0 takes it
out of the mailbox: under sync admission a group's last push waits in the queue for the other groups' pushes, and
freed then, its places were filled with weights a step short of the batch's (measured: one actor of a two-group job
sampled a fragment with version 3 between the batches' versions 2 and 4).
"""
from __future__ import annotations

from hpcrl.runtime.transport import control


class TakenWords:
    def __init__(self, counters, groups: int, on_policy: bool) -> None:
        self.counters, self.groups, self.on_policy = counters, groups, on_policy
        self.applied_next = [0] * groups
        self.changed: set[int] = set()

    def restore(self, seq_next: list[int], queue) -> None:
        """--resume: every push before the checkpoint applied, but those it left in the admission queue."""
        self.applied_next = list(seq_next)
        for rec in queue:
            self.applied_next[rec.group] = min(self.applied_next[rec.group], rec.seq)

    def applied(self, records) -> None:
        """These pushes (GradientRecords) are in the version just published, or were dropped."""
        if self.on_policy:
            for rec in records:
                self.applied_next[rec.group] = max(self.applied_next[rec.group], rec.seq + 1)
                self.changed.add(rec.group)

    def publish(self) -> None:
        """Set the words that moved (after the versions that hold their pushes are published)."""
        for g in self.changed:
            self.counters.set(control.taken_word(self.groups, g), self.applied_next[g])
        self.changed.clear()
