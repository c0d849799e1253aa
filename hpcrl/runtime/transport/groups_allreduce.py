"""The learner groups' own allreduce (``learners.topology: allreduce``, DD-PPO's way): the G group roots average each
minibatch's gradient among themselves, with no parameter rank in between.

Two backends of ``protocols.GroupsAllreduce``: :class:`MpiGroupsAllreduce` (a nonblocking ``Iallreduce`` over the
roots' communicator, ``topo.roots_comm``) and :class:`LocalGroupsAllreduce` (the serial runner's threads).

Each group's gradient is scaled by ``float32(1 / G)`` before the sum, as rank 0's ``staleness.aggregate`` scales
each gradient of a sync step: with two groups the mean is then the parameter rank's to the bit (the local twin sums
in group order, as rank 0 does, for any G; MPI's order of summation is its own from three groups on).

Stopping together: each call carries whether the caller has seen the run's STOP word, and every group learns the
sum, so the groups leave the batch at the same minibatch. A group that waits calls ``wait()`` (its heartbeat; True
once the run has stopped without it, e.g. another group left for lack of a batch): it then abandons the call, and
every later call returns None at once (``broken``): an abandoned collective cannot be finished.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.clock import WALL, Clock


def _scaled(grad: np.ndarray, groups: int, stopping: bool) -> np.ndarray:
    """The gradient times float32(1/G), with the stop flag as one more element."""
    buf = np.empty(grad.size + 1, dtype=np.float32)
    np.multiply(grad, np.float32(1.0 / groups), out=buf[:-1])
    buf[-1] = 1.0 if stopping else 0.0
    return buf


class MpiGroupsAllreduce:
    """Over the group roots' communicator (rank g is group g)."""

    def __init__(self, comm, clock: Clock = WALL) -> None:
        self.comm, self.size, self.clock = comm, comm.Get_size(), clock
        self.broken = False
        self.abandoned: tuple | None = None

    def mean(self, grad: np.ndarray, stopping: bool, wait: Callable[[], bool]) -> tuple[np.ndarray, bool] | None:
        """(the mean of the groups' ``grad``, whether any group is stopping), or None when abandoned."""
        buf = _scaled(grad, self.size, stopping)
        if not self._sum(buf, wait):
            return None
        return buf[:-1], bool(buf[-1] > 0)

    def sum(self, values: np.ndarray, wait: Callable[[], bool]) -> np.ndarray | None:
        """The element-wise sum of every group's float64 ``values``, or None when abandoned."""
        buf = np.array(values, dtype=np.float64)
        return buf if self._sum(buf, wait) else None

    def _sum(self, buf: np.ndarray, wait: Callable[[], bool]) -> bool:
        from mpi4py import MPI

        if self.broken:
            return False
        request = self.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        backoff = Backoff(2e-5, 1e-3, self.clock)
        while not request.Test():  # each Test moves MPICH's progress on; the naps stay short (a minibatch is ms)
            if wait():
                self.broken = True
                # the other roots may still join it later, and MPI then writes the sum into the buffer: it must
                # outlive the call (freed, its memory would be overwritten under whatever reuses it)
                self.abandoned = (request, buf)
                return False
            backoff.sleep()
        return True

    def close(self) -> None:
        pass  # the communicator is the Topology's (freed with it)


class LocalGroupsAllreduce:
    """The serial runner's twin: the G group threads meet at one generation of contributions; the last to arrive
    sums them in group order."""

    def __init__(self, groups: int, abort: threading.Event | None = None) -> None:
        self.size = groups
        self.abort = abort or threading.Event()
        self.cond = threading.Condition()
        self.parts: dict[int, np.ndarray] = {}
        self.result: np.ndarray | None = None
        self.generation = 0
        self.broken = False

    def mean(self, grad: np.ndarray, stopping: bool, wait: Callable[[], bool], group: int = 0
             ) -> tuple[np.ndarray, bool] | None:
        buf = self._sum(group, _scaled(grad, self.size, stopping), wait)
        return None if buf is None else (buf[:-1], bool(buf[-1] > 0))

    def sum(self, values: np.ndarray, wait: Callable[[], bool], group: int = 0) -> np.ndarray | None:
        return self._sum(group, np.array(values, dtype=np.float64), wait)

    def _sum(self, group: int, part: np.ndarray, wait: Callable[[], bool]) -> np.ndarray | None:
        with self.cond:
            if self.broken:
                return None
            generation = self.generation
            if self._arrive(group, part):
                self.cond.notify_all()
                return self.result.copy()
            while self.generation == generation:
                if self.abort.is_set() or wait():
                    self.broken = True
                    self.cond.notify_all()
                    return None
                self.cond.wait(0.01)
            return self.result.copy()

    def _arrive(self, group: int, part: np.ndarray) -> bool:
        """Add ``group``'s part; the last of a generation sums them (in group order: rank 0's order of a sync step)
        into ``result``, starts the next generation and returns True."""
        self.parts[group] = part
        if len(self.parts) < self.size:
            return False
        total = np.zeros_like(part)
        for g in range(self.size):
            total += self.parts[g]
        self.result, self.parts = total, {}
        self.generation += 1
        return True

    def for_group(self, group: int) -> "LocalGroupRoot":
        return LocalGroupRoot(self, group)

    def close(self) -> None:
        pass


class LocalGroupRoot:
    """Group ``group``'s handle on the shared :class:`LocalGroupsAllreduce` (the protocol's calls, its group implied)."""

    def __init__(self, shared: LocalGroupsAllreduce, group: int) -> None:
        self.shared, self.group, self.size = shared, group, shared.size

    @property
    def broken(self) -> bool:
        return self.shared.broken

    def mean(self, grad: np.ndarray, stopping: bool, wait: Callable[[], bool]) -> tuple[np.ndarray, bool] | None:
        return self.shared.mean(grad, stopping, wait, self.group)

    def sum(self, values: np.ndarray, wait: Callable[[], bool]) -> np.ndarray | None:
        return self.shared.sum(values, wait, self.group)

    def close(self) -> None:
        pass
