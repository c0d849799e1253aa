"""A tree over the nodes' weight caches: rank 0 serves a version to ``fanout`` nodes, each of them to ``fanout`` more.

With node caches (:mod:`~hpcrl.runtime.transport.node_cache`) each node fetches a version once from rank 0, so rank
0's link still carries ``4 P`` bytes per node and version: at hundreds of nodes and large weights that link, not
rank 0's CPU, bounds the job (docs/scaling.md). The tree numbers the nodes 0..n-1 (in their first actors' rank
order). Node ``i`` fetches from its *source*: rank 0's board for ``i < fanout``, else the relay of node ``i //
fanout - 1``. A *relay* is a copy of the board kept on the first actor of a node that has children. So rank 0 serves
each version at most ``fanout`` times, and each relay at most ``fanout`` times more.

A relay is filled on demand, never by a loop of its own. A node's fetcher reads rank 0's newest version number (one
atomic read, as with the cache alone). When its source relay holds an older one, it fills that relay from the
relay's own source, up the tree as far as needed. Whoever finds a relay stale and takes its lock fills it; the others
wait for it. So:
- a fetch still returns a version no older than the newest rank 0 had when the fetch began;
- no relay waits for its own node's actors to read.
Relay locks are taken child before parent only (the higher node number first), and a holder of one never waits on a
node cache's lock, so fills cannot deadlock.

Window (one, over the actors' communicator; memory only on the first actors of nodes with children), per relay:
- ``int64 ctrl[4 + 2 * HISTORY]``: latest (``version * SLOTS + slot``, -1 before the first fill; REPLACE only), lock
  (CAS only: 0 free, else the holder's rank + 1), fills (SUM only), 0, then (seq: SUM only, version: REPLACE only)
  per slot;
- then per slot the params and probe outputs as float32.
A fill writes the slot after the latest one: seq odd, version, data, seq even, then the latest word. A reader copies
the slot the latest word names under its seqlock, as on the :class:`~hpcrl.runtime.transport.windows.WeightBoard`,
whose rules (one epoch, atomics per word, Flush between words and data) this follows.

Progress: a relay's owner is an actor, inside MPI only between its env steps. Where RMA needs the target's progress
(MPICH over TCP), a child's access waits for the owner's next MPI call, at least once per fragment; networks with
hardware RMA do not wait.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.transport.windows import _I8, _INT64, WeightBoard, _align, _i64
from hpcrl.runtime.transport.windows import _SLOTS as SLOTS  # the latest word: version * SLOTS + slot

HISTORY = 2  # a relay's slots: the newest is never the one being rewritten
LATEST, LOCK, FILLS = 0, 1, 2
_CTRL = 4 + 2 * HISTORY


def source_of(node: int, fanout: int) -> int:
    """The node whose relay ``node`` fetches from; -1: rank 0's board."""
    return node // fanout - 1


def has_children(node: int, fanout: int, nodes: int) -> bool:
    """Whether some node fetches from ``node``'s relay (so ``node`` keeps one)."""
    return fanout * (node + 1) < nodes


def depth(nodes: int, fanout: int) -> int:
    """Fetches between rank 0 and the deepest of ``nodes`` nodes (1: all fetch from rank 0)."""
    level, below, reached = 1, fanout, fanout
    while reached < nodes:
        below *= fanout
        reached += below
        level += 1
    return level


class WeightTree:
    """Rank 0's board as one node's fetcher sees it through the tree (collective over ``actors``, the actor ranks).

    ``node``: this rank's node number; ``leaders[i]``: node i's first actor (its rank in ``actors``). Meets what a
    :class:`~hpcrl.runtime.transport.node_cache.NodeWeightCache` asks of its board: ``read_latest_with_probe`` goes
    through the tree, the rest to the board. ``free()`` frees the relays' window, then the board."""

    def __init__(self, board: WeightBoard, actors, node: int, leaders: list[int], fanout: int,
                 beat: Callable[[], None] = lambda: None):
        if fanout < 2:
            raise ValueError(f"WeightTree: fanout {fanout}; allowed: 2 or more")
        if not 0 <= node < len(leaders):
            raise ValueError(f"WeightTree: node {node} outside the {len(leaders)} nodes")
        self.board, self.beat, self.fanout, self.node = board, beat, fanout, node
        self.leaders = list(leaders)
        self.num_params, self.probe_size, self.history = board.num_params, board.probe_size, board.history
        self.is_owner = False  # an actor never owns rank 0's board
        self._n = board.num_params + board.probe_size
        self._data = _align(_I8 * _CTRL)
        self._slot_bytes = _align(4 * self._n)
        self.rank = actors.Get_rank()
        keeps = self.rank == self.leaders[node] and has_children(node, fanout, len(self.leaders))
        nbytes = self._data + HISTORY * self._slot_bytes
        self._win = MPI.Win.Allocate(nbytes if keeps else 0, 1, MPI.INFO_NULL, actors)
        self._win.Lock_all(MPI.MODE_NOCHECK)  # the one epoch, closed in free()
        self._res = np.zeros(1, dtype=np.int64)
        if keeps:
            init = np.zeros(_CTRL, dtype=np.int64)
            init[LATEST] = -1
            init[5::2] = -1  # no slot holds a version yet
            self._win.Accumulate(_i64(init), self.rank, (0, _CTRL, _INT64), op=MPI.REPLACE)
            self._win.Flush(self.rank)
        actors.Barrier()
        self.fills = 0  # relays this rank filled
        self.waits = 0  # fills this rank waited for while another rank held the relay's lock
        self.retries = 0  # relay copies that overlapped a fill and were redone

    # ---- one relay's words -------------------------------------------------------------------
    def _window(self):
        if self._win == MPI.WIN_NULL:
            raise RuntimeError("WeightTree already freed")
        return self._win

    def _fop(self, relay: int, word: int, value: int, op) -> int:
        win, owner = self._window(), self.leaders[relay]
        win.Fetch_and_op(_i64(np.array([value], dtype=np.int64)), _i64(self._res), owner, _I8 * word, op)
        win.Flush(owner)
        return int(self._res[0])

    def _cas(self, relay: int, expect: int, new: int) -> int:
        win, owner = self._window(), self.leaders[relay]
        win.Compare_and_swap(_i64(np.array([new], dtype=np.int64)), _i64(np.array([expect], dtype=np.int64)),
                             _i64(self._res), owner, _I8 * LOCK)
        win.Flush(owner)
        return int(self._res[0])

    def relay_version(self, relay: int) -> int:
        """The newest version ``relay`` holds (-1: none yet): one atomic read."""
        latest = self._fop(relay, LATEST, 0, MPI.NO_OP)
        return -1 if latest < 0 else latest // SLOTS

    def relay_fills(self, relay: int) -> int:
        """Versions written into ``relay`` so far, by whichever ranks filled it."""
        return self._fop(relay, FILLS, 0, MPI.NO_OP)

    def _copy(self, relay: int, out: np.ndarray) -> int | None:
        """Seqlocked copy of ``relay``'s newest slot into ``out``: its version, or None (none yet, or a fill overlapped)."""
        latest = self._fop(relay, LATEST, 0, MPI.NO_OP)
        if latest < 0:
            return None
        slot, wanted = latest % SLOTS, latest // SLOTS
        seq = 4 + 2 * slot
        before = self._fop(relay, seq, 0, MPI.NO_OP)
        if before % 2:
            return None
        version = self._fop(relay, seq + 1, 0, MPI.NO_OP)
        win, owner = self._window(), self.leaders[relay]
        win.Get([out, MPI.FLOAT], owner, (self._data + slot * self._slot_bytes, self._n, MPI.FLOAT))
        win.Flush(owner)
        same = self._fop(relay, seq, 0, MPI.NO_OP) == before
        return version if same and version == wanted else None

    def _write(self, relay: int, version: int, data: np.ndarray) -> None:
        """Holding ``relay``'s lock: ``data`` as ``version`` into the slot after its newest."""
        latest = self._fop(relay, LATEST, 0, MPI.NO_OP)
        slot = 0 if latest < 0 else (latest % SLOTS + 1) % HISTORY
        seq = 4 + 2 * slot
        win, owner = self._window(), self.leaders[relay]
        self._fop(relay, seq, 1, MPI.SUM)  # odd: being written, before any byte of the data
        self._fop(relay, seq + 1, version, MPI.REPLACE)
        win.Put([data, MPI.FLOAT], owner, (self._data + slot * self._slot_bytes, self._n, MPI.FLOAT))
        win.Flush(owner)  # the data before even (consistent)
        self._fop(relay, seq, 1, MPI.SUM)
        self._fop(relay, LATEST, version * SLOTS + slot, MPI.REPLACE)
        self._fop(relay, FILLS, 1, MPI.SUM)
        self.fills += 1

    # ---- through the tree ----------------------------------------------------------------------
    def _take(self, source: int, newest: int, out: np.ndarray) -> int:
        """A version no older than ``newest`` from ``source`` (a relay, or -1: rank 0's board) into ``out``."""
        if source < 0:
            return self.board.read_latest_with_probe(out)
        while True:
            written = self._fill(source, newest, out)
            if written is not None:  # this rank filled it: ``out`` holds what it wrote
                return written
            got = self._copy(source, out)
            if got is not None and got >= newest:
                return got
            self.retries += 1

    def _fill(self, relay: int, newest: int, out: np.ndarray) -> int | None:
        """Make ``relay`` hold ``newest`` or newer, from its own source when it does not: the version this rank
        wrote there (``out`` holds it), or None when the relay already held one (or another rank filled it)."""
        backoff, waited = Backoff(), False
        while self.relay_version(relay) < newest:
            if self._cas(relay, 0, self.rank + 1) == 0:
                try:
                    if self.relay_version(relay) < newest:  # nobody filled it between the read and the lock
                        got = self._take(source_of(relay, self.fanout), newest, out)
                        self._write(relay, got, out)
                        return got
                finally:
                    if self._cas(relay, self.rank + 1, 0) != self.rank + 1:
                        raise RuntimeError(f"WeightTree: relay {relay}'s lock was taken from its holder")
                return None
            if not waited:
                waited = True
                self.waits += 1
            self.beat()  # alive, waiting on the relay's filler: the watchdog names that one if it hangs
            backoff.sleep()
        return None

    # ---- what a node cache asks of its board -----------------------------------------------------
    def read_latest_with_probe(self, out: np.ndarray, have: int = -1) -> int:
        """The newest params and probe outputs (at least rank 0's newest when called) into ``out``, through this
        node's relay when it keeps one (then its children find it filled), else through its source's."""
        if out.dtype != np.float32 or out.size != self._n or not out.flags.c_contiguous:
            raise ValueError(f"WeightTree.read_latest_with_probe: out must be a contiguous float32 array of {self._n}")
        newest = self.board.latest_version()
        if newest < 0 or newest == have:
            return newest
        out = out.reshape(-1)
        keeps = has_children(self.node, self.fanout, len(self.leaders))
        return self._take(self.node if keeps else source_of(self.node, self.fanout), newest, out)

    def latest_version(self) -> int:
        return self.board.latest_version()

    def read_version(self, version: int, out: np.ndarray) -> bool:
        return self.board.read_version(version, out)

    def versions(self) -> list[int]:
        return self.board.versions()

    def fetch_rows(self, final: bool = False) -> dict[str, list[int]]:
        return {}

    def free(self) -> None:
        """Collective over the actors, then over the board's ranks: the relays' window, then the board."""
        win, self._win = self._win, MPI.WIN_NULL
        if win != MPI.WIN_NULL:
            win.Unlock_all()
            win.Free()
        self.board.free()
