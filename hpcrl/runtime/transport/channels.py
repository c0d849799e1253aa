"""Actor -> learner trajectory fragments: one contiguous byte buffer per fragment, bounded sends.

A fragment is a dict of numpy arrays with a fixed layout (:class:`~hpcrl.runtime.transport.layout.FragmentLayout`), packed into
one ``uint8`` buffer so that a single message moves it (no pickle). :class:`FragmentSender`
uses synchronous-mode ``Issend``: a send completes only once the learner has matched it, so
``max_in_flight`` really bounds fragments sent but not yet taken by a learner, and a slow
learner group slows its actors down instead of filling MPI's buffers. :class:`FragmentReceiver`
keeps a few ``Irecv`` from any source preposted and hands fragments out in match order.

Shutdown: ``FragmentSender.close(dests)`` drains its sends, then sends each destination a
``TAG_STOP`` message holding how many fragments it sent there; the receiver counts a source as
finished once that many fragments from it have arrived (tags differ, so the count, not message
order, decides). The role loops' own tags are in :mod:`hpcrl.runtime.transport.control`.
"""
from __future__ import annotations

import time
from collections import Counter, deque

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.transport.layout import FragmentLayout

TAG_FRAGMENT = 101
"""Actor -> learner group root: one packed fragment."""
TAG_STOP = 102
"""Actor -> learner group root: int64 count of fragments sent to it; nothing more follows."""

class FragmentSender:
    """Nonblocking fragment sends (Issend) with at most ``max_in_flight`` outstanding."""

    def __init__(self, comm, layout: FragmentLayout, max_in_flight: int = 2):
        if max_in_flight < 1:
            raise ValueError("FragmentSender: max_in_flight must be >= 1")
        self.comm, self.layout = comm, layout
        self._buffers = [layout.empty_buffer() for _ in range(max_in_flight)]
        self._free = deque(range(max_in_flight))
        self._pending: deque[tuple[MPI.Request, int]] = deque()
        self.sent: Counter[int] = Counter()
        self.count = 0
        self.total_wait = 0.0
        self._closed = False

    @property
    def in_flight(self) -> int:
        self._reap()
        return len(self._pending)

    def _reap(self) -> None:
        while self._pending and self._pending[0][0].Test():
            self._free.append(self._pending.popleft()[1])

    def _wait_oldest(self) -> float:
        start = time.perf_counter()
        backoff = Backoff()
        while not self._pending[0][0].Test():
            backoff.sleep()
        self._free.append(self._pending.popleft()[1])
        return time.perf_counter() - start

    def send(self, dest: int, fragment: dict) -> float:
        """Start sending ``fragment`` to ``dest``; return seconds waited for a free buffer."""
        if self._closed:
            raise RuntimeError("FragmentSender: send after close")
        self._reap()
        waited = self._wait_oldest() if not self._free else 0.0
        index = self._free.popleft()
        buf = self._buffers[index]
        frag = dict(fragment)
        frag.setdefault("actor", self.comm.Get_rank())
        frag.setdefault("fragment", self.count)
        self.layout.pack(frag, buf)
        self._pending.append((self.comm.Issend([buf, MPI.BYTE], dest, TAG_FRAGMENT), index))
        self.sent[dest] += 1
        self.count += 1
        self.total_wait += waited
        return waited

    def drain(self) -> float:
        """Wait until every fragment sent so far has been taken; return seconds waited."""
        waited = 0.0
        while self._pending:
            waited += self._wait_oldest()
        self.total_wait += waited
        return waited

    def close(self, dests) -> None:
        """Drain, then tell each of ``dests`` how many fragments it got from this rank (TAG_STOP)."""
        self.drain()
        reqs = [self.comm.Isend([np.array([self.sent[d]], dtype=np.int64), MPI.INT64_T], d, TAG_STOP)
                for d in dests]
        backoff = Backoff()
        while not MPI.Request.Testall(reqs):
            backoff.sleep()
        self._closed = True


class FragmentReceiver:
    """Fragments from any source, ``prepost`` receives kept posted; FIFO in match order."""

    def __init__(self, comm, layout: FragmentLayout, prepost: int = 2):
        if prepost < 1:
            raise ValueError("FragmentReceiver: prepost must be >= 1")
        self.comm, self.layout = comm, layout
        self._posted: deque[tuple[MPI.Request, np.ndarray]] = deque()
        for _ in range(prepost):
            self._post(layout.empty_buffer())
        self.received: Counter[int] = Counter()
        self.announced: dict[int, int] = {}
        self._status = MPI.Status()
        self._count = np.zeros(1, dtype=np.int64)

    def _post(self, buf: np.ndarray) -> None:
        self._posted.append((self.comm.Irecv([buf, MPI.BYTE], MPI.ANY_SOURCE, TAG_FRAGMENT), buf))

    def _take_stops(self) -> None:
        while self.comm.Iprobe(MPI.ANY_SOURCE, TAG_STOP, self._status):
            source = self._status.Get_source()
            self.comm.Recv([self._count, MPI.INT64_T], source, TAG_STOP)
            self.announced[source] = int(self._count[0])

    def poll(self) -> dict | None:
        """The next fragment if one has arrived (its arrays are a private copy), else None."""
        if self._posted is None:
            raise RuntimeError("FragmentReceiver: poll after close")
        self._take_stops()
        req, buf = self._posted[0]
        if not req.Test(self._status):
            return None
        self._posted.popleft()
        source = self._status.Get_source()
        if self._status.Get_count(MPI.BYTE) != self.layout.nbytes:
            raise RuntimeError(f"FragmentReceiver: {self._status.Get_count(MPI.BYTE)} bytes from rank {source}, "
                               f"layout has {self.layout.nbytes} (actor and learner disagree on the layout)")
        fragment = self.layout.unpack(buf, copy=True)
        self._post(buf)
        self.received[source] += 1
        return fragment

    def recv(self, timeout: float | None = None) -> dict | None:
        """Wait (backing off, never spinning hot) for a fragment; None after ``timeout`` seconds."""
        start = time.perf_counter()
        backoff = Backoff()
        while (fragment := self.poll()) is None:
            if timeout is not None and time.perf_counter() - start >= timeout:
                return None
            backoff.sleep()
        return fragment

    def finished(self, sources) -> bool:
        """True once every source in ``sources`` sent TAG_STOP and all its fragments were received."""
        self._take_stops()
        return all(s in self.announced and self.received[s] >= self.announced[s] for s in sources)

    def close(self) -> None:
        """Cancel the preposted receives (call once no more fragments are expected)."""
        for req, _ in self._posted or ():
            req.Cancel()
            req.Wait()
        self._posted = None
