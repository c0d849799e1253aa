"""Rank 0's decisions to the other parameter shards (``runtime/shards.py`` events), over MPI.

One pickled message per event on one tag, from rank 0 only: MPI keeps the messages of one sender, tag and
communicator in order, which is the order the shards must apply them in. Sends are nonblocking and completed
(waited for without spinning) on :meth:`close`; a shard receives with Iprobe, never blocking.
"""
from __future__ import annotations


from hpcrl.runtime.shards import ShardEvent
from hpcrl.runtime.transport import control

TAG_SHARD = 16
"""Rank 0 -> a parameter shard: one pickled decision (hpcrl.runtime.shards)."""


class MpiShardLink:
    """``shard_ranks``: the rank of each shard (shard 0 is rank 0, the sender)."""

    def __init__(self, comm, shard_ranks: list[int]) -> None:
        self.comm, self.shard_ranks = comm, list(shard_ranks)
        self._pending: list = []

    def send(self, shard: int, event: ShardEvent) -> None:
        """Rank 0: ``event`` to shard ``shard`` (>= 1)."""
        self._pending = [r for r in self._pending if not r.Test()]
        self._pending.append(self.comm.isend(event, dest=self.shard_ranks[shard], tag=TAG_SHARD))

    def poll(self) -> list[ShardEvent]:
        """A shard: every decision that has arrived, in the order rank 0 sent them."""
        out = []
        while self.comm.Iprobe(source=self.shard_ranks[0], tag=TAG_SHARD):
            out.append(self.comm.recv(source=self.shard_ranks[0], tag=TAG_SHARD))
        return out

    def close(self) -> None:
        for r in self._pending:
            control.wait_request(r)
        self._pending = []
