"""The mailbox and the weight board of a job whose weights S parameter ranks own (``aggregation.shards``).

Both are made of S ordinary ones, one owned by each shard, over that shard's floats (``runtime/shards.py``), and
satisfy the same Protocols (``protocols.Mailbox``, ``protocols.Board``), so a role does not know how many shards
there are. They use only the Protocol methods of the parts, so they work over the RMA windows and over the
in-memory twins alike (tests/mpi_programs/shard_stress.py runs the torn-version body on both).

- :class:`ShardedMailbox`: a push puts each shard its slice, shard 0 first (the one whose headers rank 0 admits:
  when it has a push, every earlier push of that group is in every shard's mailbox and this one is on its way). A
  gradient with a non-finite value anywhere carries a NaN in shard 0's slice, so rank 0 refuses it as a whole.
- :class:`ShardedBoard`: the visible version is the smallest of the shards' latest versions; a read copies each
  shard's slice of that version and retries when a shard no longer holds it. A version some shards have not
  published is invisible, so a copy never mixes two versions (a torn version).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hpcrl.runtime.backoff import Backoff


class ShardedMailbox:
    """S mailboxes, shard s's holding floats ``bounds[s]:bounds[s+1]`` of every push (``runtime/shards.py``);
    ``mine``: the shard this rank owns (-1: none)."""

    def __init__(self, parts: Sequence, bounds: Sequence[int], mine: int) -> None:
        self.parts, self.mine = list(parts), mine
        self.num_params = bounds[-1]
        self._bounds = list(bounds)
        self.total_wait = 0.0

    def _slices(self, grad: np.ndarray) -> list[np.ndarray]:
        grad = np.ascontiguousarray(grad, dtype=np.float32).reshape(-1)
        if grad.size != self.num_params:
            raise ValueError(f"ShardedMailbox.push: gradient has {grad.size} values, the shards hold {self.num_params}")
        b = self._bounds
        out = [grad[b[s]:b[s + 1]] for s in range(len(self.parts))]
        if not np.isfinite(grad).all() and np.isfinite(out[0]).all():
            out[0] = out[0].copy()
            out[0][0] = np.nan  # rank 0 sees shard 0's slice only: it must see that the push is not finite
        return out

    def try_push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray, stats=None) -> bool:
        """Shard 0's slice if a slot is free (False otherwise), then the others' (their owners never stop taking)."""
        first, *rest = self._slices(grad)
        if not self.parts[0].try_push(group, seq, base_version, samples, first, stats):
            return False
        for part, piece in zip(self.parts[1:], rest):
            part.push(group, seq, base_version, samples, piece, stats)
        return True

    def push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray, stats=None,
             timeout: float | None = None, abandon: Callable[[], bool] | None = None, backoff=None) -> float:
        """Every shard its slice, shard 0 first; the seconds waited for slots (PushLoop.push's contract)."""
        waited = 0.0
        for part, piece in zip(self.parts, self._slices(grad)):
            waited += part.push(group, seq, base_version, samples, piece, stats, timeout=timeout, abandon=abandon,
                                backoff=backoff)
        self.total_wait += waited
        return waited

    def poll(self, limit: int | None = None) -> list:
        """The owner's pushes (headers and its slices)."""
        return self.parts[self.mine].poll(limit)

    def free(self) -> None:
        for part in self.parts:
            part.free()


class ShardedBoard:
    """S weight boards, shard s's holding floats ``bounds[s]:bounds[s+1]`` of every version; ``mine``: the shard
    this rank owns (-1: none)."""

    def __init__(self, parts: Sequence, bounds: Sequence[int], mine: int) -> None:
        self.parts, self.mine = list(parts), mine
        self.num_params, self.probe_size = bounds[-1], 0
        self.history = min(p.history for p in self.parts)
        self._bounds = list(bounds)
        self.retries = 0

    @property
    def is_owner(self) -> bool:
        """This rank owns shard 0 (rank 0: the parameter rank)."""
        return self.mine == 0

    def slice_of(self, shard: int) -> slice:
        return slice(self._bounds[shard], self._bounds[shard + 1])

    def own_slice(self) -> slice:
        return self.slice_of(self.mine)

    def _views(self, out: np.ndarray) -> list[np.ndarray]:
        if out.dtype != np.float32 or out.size != self.num_params or not out.flags.c_contiguous:
            raise ValueError(f"ShardedBoard: out must be a contiguous float32 array of {self.num_params} values")
        flat, b = out.reshape(-1), self._bounds
        return [flat[b[s]:b[s + 1]] for s in range(len(self.parts))]

    def publish(self, version: int, flat: np.ndarray, probe: np.ndarray | None = None) -> None:
        """The owner: its slice of the full ``flat`` as ``version`` (visible once every shard has published it)."""
        if probe is not None and np.size(probe):
            raise ValueError("ShardedBoard.publish: no probe outputs with aggregation.shards > 1")
        self.parts[self.mine].publish(version, np.asarray(flat, dtype=np.float32).reshape(-1)[self.own_slice()])

    def latest_version(self) -> int:
        """The newest version every shard has published (-1: none yet)."""
        return min(p.latest_version() for p in self.parts)

    def shard_versions(self) -> list[int]:
        """Each shard's latest version (rank 0's wait for the others, the tests)."""
        return [p.latest_version() for p in self.parts]

    def read_latest(self, out: np.ndarray, have: int = -1) -> int:
        """The newest visible version into ``out`` (nothing copied when it is ``have``); -1 before the first."""
        views = self._views(out)
        backoff = Backoff()
        while True:
            version = self.latest_version()
            if version < 0 or version == have:
                return version
            if all(p.read_version(version, v) for p, v in zip(self.parts, views)):
                return version
            self.retries += 1  # a shard moved past it meanwhile: the next visible one
            backoff.sleep()

    def read_latest_part(self, out: np.ndarray, start: int, have: int = -1) -> int:
        """The newest visible version's ``out.size`` params from ``start`` (read whole from the shards, then cut)."""
        whole = np.empty(self.num_params, dtype=np.float32)
        version = self.read_latest(whole, have)
        if version >= 0 and version != have:
            out.reshape(-1)[:] = whole[start:start + out.size]
        return version

    def read_version(self, version: int, out: np.ndarray) -> bool:
        """``version`` into ``out`` if it is visible and every shard still holds it."""
        views = self._views(out)
        return 0 <= version <= self.latest_version() and all(
            p.read_version(version, v) for p, v in zip(self.parts, views))

    def read_latest_with_probe(self, out: np.ndarray, have: int = -1) -> int:
        return self.read_latest(out, have)  # no probe (actors.weight_sync=aaps is refused with shards)

    def read_probe(self, out: np.ndarray) -> int:
        raise RuntimeError("ShardedBoard: no probe outputs with aggregation.shards > 1")

    def versions(self) -> list[int]:
        """Versions every shard holds and that are visible (a snapshot)."""
        held = set.intersection(*(set(p.versions()) for p in self.parts))
        return sorted(held)

    def fetch_rows(self, final: bool = False) -> dict[str, list[int]]:
        """Shard 0's fetch counts (its slice's bytes), on rank 0."""
        return self.parts[0].fetch_rows(final)

    def free(self) -> None:
        for part in self.parts:
            part.free()
