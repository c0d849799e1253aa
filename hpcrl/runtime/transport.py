"""Actor -> learner fragment transport used by the role loops (interim: pickled nonblocking sends).

A thin adapter with the four calls the loops need, so the buffer-based channels of
:mod:`hpcrl.runtime.channels` can replace it without touching the loops.
"""
from __future__ import annotations

from mpi4py import MPI

from hpcrl.runtime.control import wait_request

TAG_FRAGMENT = 21


class FragmentSender:
    """Nonblocking sends with at most ``max_in_flight`` pending."""

    def __init__(self, comm, max_in_flight: int):
        self.comm, self.max_in_flight = comm, max_in_flight
        self._pending: list = []

    def progress(self) -> None:
        self._pending = [r for r in self._pending if not r.Test()]

    def can_send(self) -> bool:
        self.progress()
        return len(self._pending) < self.max_in_flight

    def send(self, dest: int, fragment: dict) -> None:
        self._pending.append(self.comm.isend(fragment, dest=dest, tag=TAG_FRAGMENT))

    def drain(self) -> None:
        for r in self._pending:
            wait_request(r)
        self._pending = []


class FragmentReceiver:
    """Receives whatever fragments have arrived, from any actor."""

    def __init__(self, comm, sources):
        self.comm = comm
        self.sources = list(sources)

    def poll(self) -> list[dict]:
        out = []
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_FRAGMENT, status=status):
            out.append(self.comm.recv(source=status.Get_source(), tag=TAG_FRAGMENT))
        return out

    def close(self) -> None:
        pass
