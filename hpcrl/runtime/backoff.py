"""Waiting without spinning: the one back-off every hpcrl wait loop uses.

MPICH's blocking calls poll the network at full speed, which on an oversubscribed node takes
the core from the rank that has work; threads of the serial runner share one interpreter.
So every wait here is a test-and-sleep loop with a sleep that doubles up to a cap.

A wait whose producers live in the same process can do better: :class:`Doorbell` naps like a Backoff
with a longer cap, and a producer's ``ring`` ends the nap at once (the serial runner's rank 0).
"""
from __future__ import annotations

import threading

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


def window_owner_nap(clock: Clock = WALL) -> Backoff:
    """The idle nap of a rank that owns windows others use (rank 0, a parameter shard): RMA against them progresses
    only while the owner is inside MPI (MPICH/UCX active messages), so its naps stay short (0.2 ms at most): a
    learner's push waits for them. The sim runner's rank 0 naps the same (in virtual time)."""
    return Backoff(2e-5, 2e-4, clock)


class Doorbell(Backoff):
    """A Backoff whose nap a producer ends early with :meth:`ring`. The serial runner's in-memory mailbox and
    report queue ring rank 0's bell on every push and report: its thread sleeps up to ``cap`` (the watchdog and
    the stop rule look every 0.5 s anyway) instead of taking the interpreter lock 5,000 times a second, as its
    0.2 ms MPI back-off must (RMA progresses only while rank 0 is inside MPI). A ring between a nap's end and
    the next poll is not lost: the bell stays rung until a nap takes it, and the data rung for is already there."""

    def __init__(self, first: float = 2e-5, cap: float = 5e-3):
        super().__init__(first, cap, WALL)
        self._rung = threading.Event()

    def ring(self) -> None:
        self._rung.set()

    def sleep(self) -> None:
        start = self.clock.now()
        if self._rung.wait(self.delay):
            self.delay = self.first
        else:
            self.delay = min(self.delay * 2, self.cap)
        self._rung.clear()
        self.waited += self.clock.now() - start


class Changes:
    """A number every change of the serial runner's shared state moves (a counter word set or added, weights
    published, a fragment delivered or taken): a :class:`ChangeNap` sleeps until it moves."""

    def __init__(self) -> None:
        self._moved = threading.Condition()
        self.version = 0

    def bump(self) -> None:
        with self._moved:
            self.version += 1
            self._moved.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """The version once it differs from ``seen``, or after ``timeout`` seconds (then possibly ``seen``)."""
        with self._moved:
            self._moved.wait_for(lambda: self.version != seen, timeout)
            return self.version


class NoChanges:
    """The changes of a state nobody naps on (the MPI and virtual-time twins)."""

    def bump(self) -> None:
        pass


class ChangeNap(Backoff):
    """A Backoff whose nap ends when the shared state changes (:class:`Changes`): an actor of the serial runner
    waiting for room or for new weights wakes when they come, not every few milliseconds while its learner trains
    (each wake takes the interpreter lock from the learner; measured: about 10 % of a Hopper run's time). A change
    between the waiter's last look and its nap ends the nap at once: the version it saw is the one before it looked."""

    def __init__(self, changes: Changes, first: float, cap: float):
        super().__init__(first, cap, WALL)
        self.changes = changes
        self.seen = changes.version

    def sleep(self) -> None:
        start = self.clock.now()
        now = self.changes.wait(self.seen, self.delay)
        if now != self.seen:
            self.seen, self.delay = now, self.first
        else:
            self.delay = min(self.delay * 2, self.cap)
        self.waited += self.clock.now() - start


class NoBell:
    """The bell of a queue nobody naps on (the virtual-time runner's twins)."""

    def ring(self) -> None:
        pass
