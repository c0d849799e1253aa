"""Per-node reports (``actors.reports: node``): a node's actors' reports reach rank 0 as one message per flush.

With ``fragment`` (the default) every actor sends rank 0 its own pickled report per fragment
(:class:`~hpcrl.runtime.transport.links.MpiReports`), so rank 0 takes one message per fragment: at 64 actors
per node and thousands of nodes those messages alone fill its core (docs/scaling.md). With ``node`` the actors
of one node (``Split_type(COMM_TYPE_SHARED)`` of the actors' communicator, as the node weight cache finds them)
send their reports to the node's first actor, the **relay** (:class:`ReportRelay`), over the node; the relay
sends rank 0 one :class:`~hpcrl.runtime.messages.NodeReports` holding them, once every actor of the node that
has not closed has a message in it, or ``flush_seconds`` after the oldest came, whichever is first. The fragment
reports travel as columns (``FragmentColumns``), which rank 0 appends to the record as a whole: the same rows, and
the same elastic-rule, numbering and round statistics as report by report, without unpickling and handling each.

With ``summary`` the relay is the same, but what it sends is made by a :class:`Packing` that writes the batch's
fragment rows to the node's own file and sends rank 0 their sums (``runtime/record/node_rows.py``); then the relay
sends only every ``flush_seconds``, since rank 0's work is per message, not per report.

The relay is an actor: it takes its node's reports when it sends its own and whenever its loop waits or parks
(``poll``, with its heartbeat), so a report waits at most ``flush_seconds`` or one of the relay's fragments. Each
actor's fragment reports stay in the order it sent them (one sender and tag per pair; the relay keeps its arrival
order), and so do its other messages. Of an actor's normalisation statistics only the newest in a message travels
on: rank 0 keeps only the newest.

The end: a member (:class:`ReportMember`) closes with a synchronous ``None`` after its reports, which completes
once the relay has taken them all; the relay closes once every member has, sending the rest synchronously,
so when the last actor counts itself done every report has reached rank 0. Both beat their heartbeat while
they wait, so a stopped relay or member is the rank the watchdog names, not the ones waiting on it.
"""
from __future__ import annotations

from typing import Callable

from mpi4py import MPI

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.messages import Report
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.links import MpiReports
from hpcrl.runtime.transport.report_packing import Packing, ReportColumns, due

TAG_NODE_REPORT = 17
"""An actor -> its node's relay: one pickled report, or None: this actor sends no more."""
MODES = ("fragment", "node", "summary")
"""``actors.reports``: one message to rank 0 per fragment; per node and flush; or per node and flush with the rows
written on the node."""


def _keep_beating(beat: Callable[[], None]) -> Callable[[], bool]:
    def abandon() -> bool:
        beat()
        return False

    return abandon


class ReportMember:
    """An actor that is not its node's relay: each report to the relay (node rank 0 of ``node_comm``)."""

    def __init__(self, node_comm, beat: Callable[[], None]) -> None:
        self.comm, self.beat = node_comm, beat
        self._pending: list = []

    def send(self, message: Report) -> None:
        self._pending = [r for r in self._pending if not r.Test()]
        self._pending.append(self.comm.isend(message, dest=0, tag=TAG_NODE_REPORT))

    def poll(self) -> None:
        """Nothing waits here: every report went to the relay when it was sent."""

    def drain(self, most: int | None = None) -> list[Report]:
        raise RuntimeError("ReportMember.drain: only the parameter rank drains reports")

    def close(self) -> None:
        """Say so after the last report (same pair and tag: it comes after them) and wait until the relay took it."""
        self._pending.append(self.comm.issend(None, dest=0, tag=TAG_NODE_REPORT))
        for r in self._pending:
            control.wait_request(r, abandon=_keep_beating(self.beat))
        self._pending = []


class ReportRelay:
    """The node's first actor: its own reports and its node's other actors' to rank 0, as one ``NodeReports`` per
    flush (when every open actor of the node has a message in it, or ``flush_seconds`` after the oldest came)."""

    def __init__(self, node_comm, up: MpiReports, world_rank: int, beat: Callable[[], None],
                 clock: Clock = WALL, packing: Packing | None = None) -> None:
        self.comm, self.up, self.world_rank, self.beat, self.clock = node_comm, up, world_rank, beat, clock
        self.packing = ReportColumns() if packing is None else packing
        self.open = set(range(node_comm.Get_size()))  # node ranks that have not closed (0: this one)
        self._batch: list[Report] = []
        self._senders: set[int] = set()
        self._oldest = 0.0
        self._status = MPI.Status()
        self.flushes = 0

    def send(self, message: Report) -> None:
        self._take(0, message)
        self.poll()

    def poll(self) -> None:
        """Take what the node's actors sent; send rank 0 the batch when it is due."""
        comm, status = self.comm, self._status
        while comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_NODE_REPORT, status=status):
            source = status.Get_source()
            message = comm.recv(source=source, tag=TAG_NODE_REPORT)
            if message is None:
                self.open.discard(source)
            else:
                self._take(source, message)
        if self._batch and due(self.packing, self.open, self._senders, self.clock.now() - self._oldest):
            self._flush()

    def _take(self, source: int, message: Report) -> None:
        if not self._batch:
            self._oldest = self.clock.now()
        self._batch.append(message)
        self._senders.add(source)

    def _flush(self, synchronous: bool = False) -> None:
        batch, self._batch, self._senders = self._batch, [], set()
        self.up.send(self.packing.pack(self.world_rank, batch), synchronous)
        self.flushes += 1

    def drain(self, most: int | None = None) -> list[Report]:
        raise RuntimeError("ReportRelay.drain: only the parameter rank drains reports")

    def close(self) -> None:
        """Wait (beating) until every other actor of the node closed, then send the rest so that it completes only
        once rank 0 has taken it (and so every batch before it)."""
        self.open.discard(0)
        backoff = Backoff(5e-5, 5e-3, self.clock)
        while self.open:
            self.beat()
            self.poll()
            backoff.sleep()
        self.poll()
        self._flush(synchronous=True)
        self.packing.close()
        self.up.close(self.beat)


def for_rank(mode: str, comm, is_actor: bool, beat: Callable[[], None],
             summary: Callable[[int, int], Packing] | None = None):
    """Collective over ``comm`` (every rank of the job) for ``mode`` ``node`` or ``summary``: an actor's relay or
    member over the actors of its node, ``beat`` its heartbeat (``summary(relay, relays)``: the relay's packing for
    ``summary``, given the number of relays); :class:`MpiReports` on the other ranks and for ``fragment``."""
    if mode not in MODES:
        raise ValueError(f"actors.reports: {mode!r}; allowed: {', '.join(MODES)}")
    if mode == "fragment":
        return MpiReports(comm)
    actors = comm.Split(0 if is_actor else MPI.UNDEFINED, comm.Get_rank())
    if actors == MPI.COMM_NULL:
        return MpiReports(comm)
    node = actors.Split_type(MPI.COMM_TYPE_SHARED, key=actors.Get_rank())
    relays = actors.allreduce(int(node.Get_rank() == 0))
    actors.Free()
    if node.Get_rank() == 0:
        packing = summary(comm.Get_rank(), relays) if mode == "summary" else None
        return ReportRelay(node, MpiReports(comm), comm.Get_rank(), beat, packing=packing)
    return ReportMember(node, beat)
