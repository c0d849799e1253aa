"""Per-node reports in one process (``actors.reports: node`` under the virtual-time runner): the twin of
:mod:`hpcrl.runtime.transport.node_reports`.

The simulated actors of one node share a :class:`NodeBuffer`; each holds a :class:`NodeMember` (its ``Reports``).
A report goes into the buffer, and the buffer goes to rank 0's queue as one
:class:`~hpcrl.runtime.messages.NodeReports` by the same rule as the MPI relay's: once every actor of the node that
has not closed has a message in it, or ``flush_seconds`` (on the node's clock: virtual time) after the oldest came,
checked whenever one of the node's actors sends or waits (``poll``: ``report_packing.due``); with ``actors.reports:
summary`` its :class:`~hpcrl.runtime.transport.report_packing.Packing` writes the rows to the node's file and the
buffer sends only every ``flush_seconds``. The last member to close sends the rest, before it counts itself done. No
MPI: any actor of the node may do the relay's work, since they share the buffer.
"""
from __future__ import annotations

import threading

from hpcrl.runtime.clock import Clock
from hpcrl.runtime.messages import Report
from hpcrl.runtime.transport.report_packing import Packing, ReportColumns, due


class NodeBuffer:
    """The reports of one node's actors (indices ``actors``) on their way to rank 0's ``up`` queue."""

    def __init__(self, up, actors: list[int], relay: int, clock: Clock, packing: Packing | None = None):
        self.up, self.relay, self.clock = up, relay, clock
        self.packing = ReportColumns() if packing is None else packing
        self.waiting = set(actors)  # actors that have not closed
        self.members = 0  # Reports handed out and not closed
        self._batch: list[Report] = []
        self._senders: set[int] = set()
        self._oldest = 0.0
        self._lock = threading.Lock()

    def member(self, actor: int) -> "NodeMember":
        self.members += 1
        return NodeMember(self, actor)

    def take(self, actor: int, message: Report) -> None:
        with self._lock:
            if not self._batch:
                self._oldest = self.clock.now()
            self._batch.append(message)
            self._senders.add(getattr(message, "actor", actor))  # a node's one role sends for all its actors
            self._flush_if_due()

    def poll(self) -> None:
        with self._lock:
            self._flush_if_due()

    def closed(self, actor: int) -> None:
        with self._lock:
            self.waiting.discard(actor)
            self.members -= 1
            if self.members == 0:
                if self._batch:
                    self._flush()
                self.packing.close()
            else:
                self._flush_if_due()

    def _flush_if_due(self) -> None:
        if self._batch and due(self.packing, self.waiting, self._senders, self.clock.now() - self._oldest):
            self._flush()

    def _flush(self) -> None:
        batch, self._batch, self._senders = self._batch, [], set()
        self.up.send(self.packing.pack(self.relay, batch))


class NodeMember:
    """One actor's ``Reports``: into its node's buffer."""

    def __init__(self, buffer: NodeBuffer, actor: int) -> None:
        self.buffer, self.actor = buffer, actor

    def send(self, message: Report) -> None:
        self.buffer.take(self.actor, message)

    def poll(self) -> None:
        self.buffer.poll()

    def drain(self, most: int | None = None) -> list[Report]:
        raise RuntimeError("NodeMember.drain: only the parameter role drains reports")

    def close(self) -> None:
        self.buffer.closed(self.actor)
