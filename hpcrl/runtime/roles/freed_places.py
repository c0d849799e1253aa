"""``actors.on_policy``: rank 0 frees each batch's places in its group's backlog (the BACKLOG counter words).

An on-policy actor reserves a place in a group's backlog before it pulls the weights and samples; a batch's places
are freed once the version that holds its push is published (or once the push was dropped as non-finite), so the
next batch is sampled with the weights this one made. Rank 0 frees them, right after the publish, and every
group's at once (one ``counters.add_each`` over the BACKLOG words): an actor never sees one group's places free and
another's still held. When each group's learner freed its own, on reading its push applied, an actor between those
frees sent its fragment to whichever group had freed first, so which fragments made which group's batch depended on
timing (measured: one actor, three groups; its second batch went 1, 2, 0 instead of 0, 1, 2 in about one run in
eight, and the weights differed from the run's twin).

A push carries the places its batch held (the ``fragments`` stat); with ``learners.topology: allreduce`` group 0's
push holds every group's batch (push_apply.py ``ApplyWeights.batches_in``), each of the same size. Pipelined actors
(``actors.on_policy: false``) hold no place rank 0 frees (their learner frees the backlog as it takes a batch):
:class:`NoPlaces` then (:func:`places_for`).
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from hpcrl.runtime.transport import control


def places_for(on_policy: bool, counters, groups: int, batches_in: Callable[[int], Iterable[int]]):
    """Rank 0's freeing of the backlog places: :class:`FreedPlaces` for on-policy actors, else :class:`NoPlaces`."""
    return FreedPlaces(counters, groups, batches_in) if on_policy else NoPlaces()


class NoPlaces:
    """Pipelined actors: rank 0 frees nothing."""

    def restore(self, seq_next: list[int]) -> None:
        """Nothing is held across a resume."""

    def applied(self, records) -> None:
        """Nothing to free."""

    def publish(self) -> None:
        """Nothing to free."""


class FreedPlaces:
    def __init__(self, counters, groups: int, batches_in: Callable[[int], Iterable[int]]) -> None:
        """``batches_in(group)``: the groups whose batches a push of ``group`` holds."""
        self.counters, self.batches_in = counters, batches_in
        self.to_free = np.zeros(groups, dtype=np.int64)
        self.made_before = [0] * groups  # a resume: pushes made by the job before it hold no place in this one's words

    def restore(self, seq_next: list[int]) -> None:
        """--resume: the pushes before the checkpoint (some may still be queued) were made by the stopped job; the
        counter words start at zero, so their places are not held here."""
        self.made_before = list(seq_next)

    def applied(self, records) -> None:
        """These pushes (GradientRecords) are in the version just published, or were dropped."""
        for rec in records:
            if rec.seq >= self.made_before[rec.group]:
                for g in self.batches_in(rec.group):
                    self.to_free[g] += int(rec.stats["fragments"])

    def publish(self) -> None:
        """Free the places of the pushes applied since the last call (after the versions that hold them are
        published), every group's in one write."""
        if self.to_free.any():
            self.counters.add_each(control.BACKLOG, -self.to_free)
            self.to_free[:] = 0
