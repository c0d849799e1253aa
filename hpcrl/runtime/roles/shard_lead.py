"""Rank 0's side of the parameter shards (``aggregation.shards``), one object per mode, as the push modes are:

- :class:`OneShard` (S = 1): rank 0 owns every float; every method does nothing (today's path, unchanged);
- :class:`LeadShards` (S > 1): rank 0 owns shard 0 and decides for all: each step it admits is sent to the
  other shards (``runtime/shards.py``) before it applies its own slice; after publishing a version it waits until
  every shard has published it, so a version rank 0 has published is visible (what the on-policy places rank 0 frees, the
  lockstep pacing and the stop rule rely on, as with one parameter rank); the algorithm's ``end_round`` and the
  checkpoint see the whole weights (read from the shards' boards), and values ``end_round`` changes in another
  shard's slice (PPO's KL coefficient) are sent to it.

The follower's side is ``runtime/roles/shard.py``.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from hpcrl.runtime.backoff import window_owner_nap
from hpcrl.runtime.roles.shard import SliceModel
from hpcrl.runtime.shards import ShardDrop, ShardEnd, ShardPublish, ShardSet, ShardStep, StepPart


class OneShard:
    """One parameter rank: nothing to tell anyone."""

    def __init__(self, board) -> None:
        self.board = board

    def model(self, model):
        return model

    def step(self, version: int, step, lr: float) -> None:
        pass

    def publish(self, version: int, params: np.ndarray, probe) -> None:
        self.board.publish(version, params, probe)

    def drop(self, rec) -> None:
        pass

    @contextmanager
    def whole_weights(self, flat, version: int):
        yield

    def close(self) -> None:
        pass


class LeadShards:
    def __init__(self, board, link, shards: int, clock, patience: float) -> None:
        self.board, self.link, self.shards, self.clock = board, link, shards, clock
        self.patience = patience  # seconds a shard may stay behind (launch.watchdog_seconds)
        self.start: int | None = None  # the first version: every shard publishes it by itself
        self.announced = -1
        self.unpublished: dict[int, np.ndarray] = {}  # shard -> values set since its last publish (ShardSet)

    def model(self, model):
        """What rank 0's push mode steps: its own slice."""
        return SliceModel(model, self.board.own_slice())

    def _to_all(self, event) -> None:
        for s in range(1, self.shards):
            self.link.send(s, event)

    def step(self, version: int, step, lr: float) -> None:
        """Before rank 0 applies the step that makes ``version``: the same step to every shard."""
        self._to_all(ShardStep(version, tuple(StepPart.of(rec, scale) for rec, scale in step), float(lr)))
        self.announced = version
        self.unpublished.clear()  # the shards publish what they were set to with it

    def publish(self, version: int, params: np.ndarray, probe) -> None:
        """Rank 0's slice of ``version`` on the board, visible once it returns (every shard has published it)."""
        self._announce(version)
        self.board.publish(version, params, probe)
        self._wait(version)

    def _announce(self, version: int) -> None:
        """Before rank 0 publishes ``version``: a version made without a step is published by every shard too."""
        if self.start is None:  # publish_initial's: the other shards publish it themselves
            if version != 0:
                raise RuntimeError(f"parameter shards start at version 0, not {version}")
            self.start = version
        elif version > self.announced:
            self._to_all(ShardPublish(version))
            self.announced = version
            self.unpublished.clear()

    def _wait(self, version: int) -> None:
        """After rank 0 published ``version``: until every shard has (it is then visible)."""
        if version == self.start:
            return
        backoff = window_owner_nap(self.clock)
        end = self.clock.now() + self.patience
        while self.board.latest_version() < version:
            if self.clock.now() > end:
                behind = [s for s, v in enumerate(self.board.shard_versions()) if v < version]
                raise RuntimeError(f"parameter shard(s) {behind} have not published version {version} within "
                                   f"{self.patience:g} s (launch.watchdog_seconds)")
            backoff.sleep()

    def drop(self, rec) -> None:
        """A push rank 0 refused: the shards forget their slices of it (a combined push's: its pusher's record)."""
        if rec.grad is not None:
            self._to_all(ShardDrop(rec.group, rec.seq))

    @contextmanager
    def whole_weights(self, flat, version: int):
        """Rank 0's model holds the whole weights inside the block: those of ``version`` (every shard has published
        it) with the values set since (a round's end: published with the next version, as with one parameter rank);
        the values the block changes in another shard's slice are sent to that shard."""
        whole = np.empty(flat.num_params, dtype=np.float32)
        if not self.board.read_version(version, whole):
            raise RuntimeError(f"parameter shards: version {version} is not on every shard's board")
        for s, values in self.unpublished.items():
            whole[self.board.slice_of(s)] = values
        flat.load_(whole)
        yield
        now = flat.numpy()
        for s in range(1, self.shards):
            where = self.board.slice_of(s)
            if not np.array_equal(now[where], whole[where]):
                self.unpublished[s] = np.array(now[where], dtype=np.float32)
                self.link.send(s, ShardSet(self.unpublished[s]))

    def close(self) -> None:
        """The run is over: every shard leaves its loop."""
        self._to_all(ShardEnd())
        self.link.close()


def lead_shards(job, patience: float):
    """Rank 0's side for the job's shard count."""
    if job.plan.shards == 1:
        return OneShard(job.board)
    if job.resume:
        raise RuntimeError(f"--resume: aggregation.shards={job.plan.shards} runs are not resumable yet (each shard's "
                           "optimizer state stays on its rank)")
    return LeadShards(job.board, job.shard_link, job.plan.shards, job.clock, patience)
