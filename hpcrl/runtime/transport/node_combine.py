"""learners.combine=node: the learner groups whose roots share a node push once for all of them.

Each group root hands its push to its node's pusher, the root of the node's first group: the push's header and its
gradient times float32(1 / H), H the size of a sync step (every group of the job). The pusher sums those in group
order from zero, which is the sum rank 0's ``staleness.aggregate`` makes of a node's gradients, and pushes it once,
every member's header in its statistics (``messages.CombinedPush``). Rank 0 makes a record per member, so admission,
the staleness of each push and run.h5's gradients rows stay each group's, and the step is the same to the bit.

:class:`CombiningOutbox` is the group root's ``protocols.Outbox`` for it, over a ``protocols.NodeGather``:
:class:`MpiNodeGather` (two ``Igather`` over the node's roots' communicator) or, in virtual time,
``transport/sim.py``'s ``SimNodeGather``. A root that waits for the others and learns that the run has stopped
abandons the gather, and every later gather returns None at once (``broken``): an abandoned collective cannot be
finished.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.clock import WALL, Clock, Work
from hpcrl.runtime.messages import CombinedPush, PushHeader
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.push import PushAbandoned
from hpcrl.staleness import GradientRecord

class CombiningOutbox:
    """A group root's pushes under learners.combine=node: handed to the node's pusher, which pushes the node's sum
    to rank 0's ``mailbox`` (any ``protocols.Mailbox``: one parameter rank's or the shards')."""

    def __init__(self, mailbox, gather, step_size: int, stats: int, clock: Clock = WALL) -> None:
        self.mailbox, self.gather, self.clock = mailbox, gather, clock
        self.scale = np.float32(1.0 / step_size)
        self.step_size, self.stats = step_size, stats

    def push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray, stats=None,
             timeout: float | None = None, abandon: Callable[[], bool] | None = None, backoff=None) -> float:
        """Hand this push to the node's pusher (on the pusher: then push the node's sum). Returns the seconds waited
        for the other groups of the node and for a mailbox slot; raises PushAbandoned when ``abandon()`` says so."""
        start = self.clock.now()
        vector = stats if callable(stats) else (lambda waited: stats)
        def header(waited: float) -> PushHeader:
            return PushHeader(seq=seq, group=group, base_version=base_version, samples=samples,
                              stats=np.array(_stats(vector(waited), self.stats), dtype=np.float64))

        mine = CombinedPush.row(header(0.0))
        part = np.multiply(np.ascontiguousarray(grad, dtype=np.float32).reshape(-1), self.scale)
        got = self.gather.gather(mine, part, abandon or (lambda: False))
        if got is None:
            raise PushAbandoned(f"group {group} push of seq {seq}: its node's combined push was abandoned")
        gathered = self.clock.now() - start
        if not got:
            return gathered  # the pusher takes it on
        total = np.zeros_like(part)
        for _, member_part in got:  # group order, from zero: rank 0's order of a node's sum
            total += member_part
        self.clock.did(Work.COMBINE, len(got))
        headers = [CombinedPush.member(meta) for meta, _ in got]  # the pusher's first: its node's first group

        def packed(waited: float) -> np.ndarray:
            """The members' headers, the pusher's with the whole of its wait (the others and a slot)."""
            headers[0] = header(gathered + waited)
            return CombinedPush(tuple(headers), self.step_size).pack()

        waited = self.mailbox.push(group, seq, base_version, sum(h.samples for h in headers), total, packed,
                                   timeout=timeout, abandon=abandon, backoff=backoff)
        return gathered + waited


def push_records(header: PushHeader, grad: np.ndarray, combined: bool, group_nodes: list[int], stats: int,
                 received_at: float) -> list[GradientRecord]:
    """Rank 0's admission records of a push: one, or (``combined``) one per member of a node's push, in group order,
    the first holding the node's sum and the others no gradient of their own."""
    if not combined:
        return [GradientRecord(group=header.group, seq=header.seq, base_version=header.base_version,
                               samples=header.samples, grad=grad, stats=dict(zip(control.GRAD_STATS, header.stats)),
                               received_at=received_at, node=group_nodes[header.group])]
    push = CombinedPush.unpack(header.stats, stats)
    return [GradientRecord(group=m.group, seq=m.seq, base_version=m.base_version, samples=m.samples,
                           grad=grad if i == 0 else None, stats=dict(zip(control.GRAD_STATS, m.stats)),
                           received_at=received_at, node=group_nodes[m.group], scaled_for=push.scaled_for if i == 0 else 0)
            for i, m in enumerate(push.members)]


def _stats(values, n: int) -> list[float]:
    values = [] if values is None else list(values)
    return values + [np.nan] * (n - len(values))



class MpiNodeGather:
    """The node's group roots' gather to the first of them, over their communicator (rank i: the node's i-th group
    in group order; ``Topology.combine_comm``)."""

    def __init__(self, comm, meta_size: int, num_params: int, clock: Clock = WALL) -> None:
        self.comm, self.clock = comm, clock
        self.members, self.rank = comm.Get_size(), comm.Get_rank()
        self.meta_size, self.num_params = meta_size, num_params
        self.broken = False
        self.abandoned: list[tuple] = []

    def gather(self, meta: np.ndarray, part: np.ndarray, wait: Callable[[], bool]
               ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        from mpi4py import MPI

        if self.broken:
            return None
        pusher = self.rank == 0
        metas = np.empty((self.members, self.meta_size), dtype=np.float64) if pusher else None
        parts = np.empty((self.members, self.num_params), dtype=np.float32) if pusher else None
        requests = [self.comm.Igather([meta, MPI.DOUBLE], [metas, MPI.DOUBLE] if pusher else None, root=0),
                    self.comm.Igather([part, MPI.FLOAT], [parts, MPI.FLOAT] if pusher else None, root=0)]
        backoff = Backoff(2e-5, 1e-3, self.clock)
        while not MPI.Request.Testall(requests):  # each Test moves MPICH's progress on
            if wait():
                self.broken = True
                # the others may still join later, and MPI then moves data into or out of these: they must outlive
                # the call
                self.abandoned.append((requests, meta, part, metas, parts))
                return None
            backoff.sleep()
        if not pusher:
            return []
        return [(metas[i], parts[i]) for i in range(self.members)]

    def close(self) -> None:
        pass  # the communicator is the Topology's (freed with it)
