"""The role loops' view of MPI transport: fragments (:mod:`hpcrl.runtime.transport.channels`) and reports.

Fragments are packed with :func:`hpcrl.runtime.transport.layout.fragment_layout`. The actor asks :meth:`ActorLink.can_send` before
sampling the next send (``max_in_flight`` unmatched synchronous sends at most), and
:meth:`ActorLink.close` ends with the channel's stop convention, so a learner root knows
when every actor is done (:meth:`LearnerLink.finished`). A post-processing learner group (MARL
``algo.postprocess_learner``) passes prepared batches to the other group roots with
:class:`BatchSender` / :class:`BatchReceiver`. :class:`MpiReports` carries the
small pickled messages to the parameter rank (:mod:`hpcrl.runtime.messages`).

The serial runner's in-memory twins with the same methods are in :mod:`hpcrl.runtime.transport.local`.
"""
from __future__ import annotations

from mpi4py import MPI

from hpcrl.runtime.messages import Report
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.channels import FragmentReceiver, FragmentSender
from hpcrl.runtime.transport.layout import FragmentLayout

TAG_BATCH = 103
"""Post-processing group root -> policy/critic group root: one prepared batch (pickled), or None: no more."""



class ActorLink:
    """An actor's fragment sends to the learner group roots (``roots[g]`` is group g's world rank)."""

    def __init__(self, comm, layout: FragmentLayout, max_in_flight: int, roots: list[int]):
        self.sender = FragmentSender(comm, layout, max_in_flight)
        self.max_in_flight = max_in_flight
        self.roots = roots

    def can_send(self) -> bool:
        return self.sender.in_flight < self.max_in_flight

    def send(self, group: int, fragment: dict) -> float:
        return self.sender.send(self.roots[group], fragment)

    def close(self) -> None:
        """Wait for every send to be taken, then tell each learner root how many it got."""
        self.sender.close(self.roots)


class LearnerLink:
    def __init__(self, comm, layout: FragmentLayout, sources: list[int]):
        self.receiver = FragmentReceiver(comm, layout, prepost=2)
        self.sources = sources

    def poll(self) -> list[dict]:
        """Every fragment that has arrived (possibly none)."""
        out = []
        while (f := self.receiver.poll()) is not None:
            out.append(f)
        return out

    def finished(self) -> bool:
        return self.receiver.finished(self.sources)

    def close(self) -> None:
        self.receiver.close()


class MpiReports:
    """Pickled report messages to the parameter rank (nonblocking sends, completed on ``close``)."""

    def __init__(self, comm, parameter_rank: int = 0):
        self.comm, self.dest = comm, parameter_rank
        self._pending: list = []

    def send(self, message: Report, synchronous: bool = False) -> None:
        """``synchronous``: the send completes only once rank 0 has taken it (a node's report relay's last)."""
        self._pending = [r for r in self._pending if not r.Test()]
        post = self.comm.issend if synchronous else self.comm.isend
        self._pending.append(post(message, dest=self.dest, tag=control.TAG_REPORT))

    def poll(self) -> None:
        """Nothing waits here: every report went to rank 0 when it was sent."""

    def drain(self, most: int | None = None) -> list[Report]:
        """Parameter rank: the reports that have arrived, ``most`` at the most (one sender's in the order it sent
        them)."""
        out = []
        while (most is None or len(out) < most) and self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=control.TAG_REPORT):
            out.append(self.comm.recv(source=MPI.ANY_SOURCE, tag=control.TAG_REPORT))
        return out

    def close(self, beat=None) -> None:
        """Wait until every send completed (``beat()``: the waiting rank's heartbeat, while it waits)."""
        abandon = None if beat is None else (lambda: beat() or False)
        for r in self._pending:
            control.wait_request(r, abandon=abandon)
        self._pending = []


class BatchSender:
    """The post-processing group root's prepared batches to the other group roots (synchronous-mode sends:
    one completes once its group has taken it; how many a group may hold is the BACKLOG counter's job)."""

    def __init__(self, comm, roots: list[int]):
        self.comm, self.roots = comm, roots
        self._pending: dict[int, list] = {g: [] for g in range(len(roots))}

    def send(self, group: int, message: dict) -> None:
        self._pending[group] = [r for r in self._pending[group] if not r.Test()]
        self._pending[group].append(self.comm.issend(message, dest=self.roots[group], tag=TAG_BATCH))

    def close(self, groups, beat) -> None:
        """Tell each of ``groups`` that no batch follows (after those sent: same pair, same tag), then wait
        until every send was taken, calling ``beat()`` while waiting."""
        def keep_beating() -> bool:
            beat()
            return False

        for g in groups:
            self._pending[g].append(self.comm.issend(None, dest=self.roots[g], tag=TAG_BATCH))
        for reqs in self._pending.values():
            for r in reqs:
                control.wait_request(r, abandon=keep_beating)


class BatchReceiver:
    """A policy/critic group root's prepared batches from the post-processing group root."""

    def __init__(self, comm, source: int):
        self.comm, self.source = comm, source
        self.ended = False

    def poll(self) -> list[dict]:
        """Every batch that has arrived (possibly none)."""
        out = []
        while self.comm.Iprobe(source=self.source, tag=TAG_BATCH):
            message = self.comm.recv(source=self.source, tag=TAG_BATCH)
            if message is None:
                self.ended = True
            else:
                out.append(message)
        return out

    def finished(self) -> bool:
        """True once the post-processing group said no batch follows (every batch before it was polled)."""
        return self.ended


class MpiFragments:
    """Builds the MPI fragment links of one job (the twin of :class:`hpcrl.runtime.transport.local.LocalFragments`)."""

    def __init__(self, comm, layout: FragmentLayout, max_in_flight: int, roots: list[int], actor_ranks: list[int]):
        self.comm, self.layout, self.max_in_flight = comm, layout, max_in_flight
        self.roots, self.actor_ranks = roots, actor_ranks

    def actor_link(self, actor: int) -> ActorLink:
        return ActorLink(self.comm, self.layout, self.max_in_flight, self.roots)

    def learner_link(self, group: int) -> LearnerLink:
        return LearnerLink(self.comm, self.layout, self.actor_ranks)

    def batch_sender(self) -> BatchSender:
        return BatchSender(self.comm, self.roots)

    def batch_receiver(self, group: int) -> BatchReceiver:
        return BatchReceiver(self.comm, self.roots[0])  # group 0 post-processes
