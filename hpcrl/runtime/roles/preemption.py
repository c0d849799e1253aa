"""``actors.sync_frac``: DD-PPO's preemption threshold (Wijmans et al. 2020), a learner group's side.

DD-PPO ends a rollout phase once a share of the workers (``sync_frac``, 0.6) have finished theirs and preempts the
rest, so a few slow workers do not hold every update back. hpcrl's on-policy actors (``actors.on_policy``) sample
whole fragments into places they reserve in a group's backlog (``control.BACKLOG``), so the threshold works on
places: a group's backlog takes ``ceil(places per batch / sync_frac)`` reservations a round, and the group trains on
the first fragments to arrive that make its batch. Then it closes the round: it fills its backlog word to twice the
reservations (no actor can reserve a place with the weights this batch is about to replace), drops the round's
other fragments, those already here and those that arrive later (a fragment sampled with this batch's version or an
older one is late), and its push holds the twice-the-reservations places, which rank 0 frees after the publish as it
frees every on-policy batch's (``freed_places.py``). A late fragment is work lost, as DD-PPO's preempted steps are;
unlike DD-PPO's, none of its steps are kept (a fragment is sampled whole). Which fragments make a batch then depends
on timing: on-policy runs with ``sync_frac < 1`` do not repeat themselves step for step.

Closing the word exactly: an actor's failed reservation adds 1 and takes it back, so the value the closing add
reads may hold such passing ones, but only once the word has reached the cap (a reservation fails only then, and
until rank 0's free nothing lowers it): ``min(value read, cap)`` is the reservations the round made.
:class:`WholeBatches` is ``sync_frac = 1``: a batch holds its fragments' places, nothing is dropped.
"""
from __future__ import annotations

from hpcrl.runtime.transport import control


def batch_places(sync_frac: float, counters, group: int, reserved: int):
    """A group's places per batch: :class:`FirstArrivals` with a preemption threshold, else :class:`WholeBatches`."""
    return WholeBatches() if sync_frac >= 1 else FirstArrivals(counters, group, reserved)


class WholeBatches:
    """Every reserved place's fragment is in a batch (``actors.sync_frac = 1``)."""

    def arrived(self, fragments: list[dict]) -> list[dict]:
        """The fragments to keep of those just received: all."""
        return fragments

    def close(self, taken: list[dict], waiting: list[dict]) -> int:
        """The places the batch of ``taken`` holds in the group's backlog: one per fragment."""
        return len(taken)


class FirstArrivals:
    """A batch of the first fragments to arrive; the round's others are preempted (``actors.sync_frac < 1``)."""

    def __init__(self, counters, group: int, reserved: int) -> None:
        """``reserved``: the places the group's backlog takes a round (the actors' cap, ``Job.max_backlog``)."""
        self.counters, self.word, self.reserved = counters, control.BACKLOG + group, reserved
        self.closed = -1  # the version of the last batch taken: fragments sampled with it or before are late
        self.dropped = 0  # late fragments so far

    def arrived(self, fragments: list[dict]) -> list[dict]:
        """The fragments to keep of those just received: those not late."""
        kept = [f for f in fragments if f["policy_version"] > self.closed]
        self.dropped += len(fragments) - len(kept)
        return kept

    def close(self, taken: list[dict], waiting: list[dict]) -> int:
        """Close the round of the batch ``taken``: no more reservations until rank 0 frees them, the round's other
        fragments dropped from ``waiting`` (in place); the places the batch's push holds."""
        versions = {f["policy_version"] for f in taken}
        if len(versions) != 1:  # every fragment of an on-policy batch has its round's weights: a late one was kept
            raise RuntimeError(f"actors.sync_frac: an on-policy batch of fragments sampled with versions "
                               f"{sorted(versions)}; a batch has one")
        self.closed = versions.pop()
        made = min(self.counters.add(self.word, self.reserved), self.reserved)
        self.counters.add(self.word, self.reserved - made)  # the word is now twice the reservations
        waiting[:] = self.arrived(waiting)
        return 2 * self.reserved
