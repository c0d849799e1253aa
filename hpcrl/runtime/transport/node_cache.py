"""One weight fetch per node per version: a node's actors read the weight board through shared memory.

Without it every actor copies each new version from rank 0's :class:`WeightBoard` over RMA, so rank 0
sends a version's bytes once per actor; at a site with 64-128 actors per node that multiplies its
outgoing traffic by the actors per node. A :class:`NodeWeightCache` is the board as the actors of
one node see it: an MPI-3 shared-memory window (``Win.Allocate_shared`` over the node's actor
communicator, memory on the node's first actor) that holds one version's params and probe outputs.
An actor asks rank 0 only for the newest version number (one atomic read); when the node already
holds that version it copies it from shared memory, and when not, the actor that takes the node's
lock fetches it once from rank 0 into the shared segment while the others wait for it. So rank 0
serves each version at most once per node (run.h5 ``weight_fetches`` counts what it served), and a
read still returns a version no older than the newest rank 0 had when the read began.

Layout of the shared segment (bytes): ``int64 ctrl[4]`` = seq (SUM only: odd while a version is being
written), version (REPLACE only, -1 before the first fetch), lock (CAS only: 0 free, else the
holder's node rank + 1), fetches (SUM only: versions this node fetched), then at 64 ``float32
params[num_params] + probe[probe_size]``. The control words move only by MPI atomics on the window,
as in :mod:`~hpcrl.runtime.transport.windows`; the data moves by plain copies of the shared memory
(the point of the window), fenced by ``Win.Sync`` (a memory barrier in MPI's unified model, which
the constructor checks the window has) on both sides of the seqlock.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.transport.windows import _I8, _INT64, WeightBoard, _i64

if TYPE_CHECKING:
    from hpcrl.runtime.transport.weight_tree import WeightTree

SEQ, VERSION, LOCK, FETCHES = 0, 1, 2, 3
_DATA = 64  # byte offset of the data, past the control words


class NodeWeightCache:
    """The weight board through one node's shared memory (collective over ``node_comm``: the actor ranks
    of one node). ``board``: rank 0's board, or a weight tree over it (launch.weight_tree), which a fetch for the
    node goes through. Meets the ``Board`` protocol for readers; ``free()`` frees its window, then ``board``."""

    def __init__(self, board: WeightBoard | WeightTree, node_comm, beat: Callable[[], None] = lambda: None):
        self.board, self.beat = board, beat  # beat: the reading actor's heartbeat, while it waits on the node
        self.num_params, self.probe_size, self.history = board.num_params, board.probe_size, board.history
        self._n = board.num_params + board.probe_size
        self.node_rank = node_comm.Get_rank()
        nbytes = _DATA + 4 * self._n
        self._win = MPI.Win.Allocate_shared(nbytes if self.node_rank == 0 else 0, 1, MPI.INFO_NULL, node_comm)
        if self._win.Get_attr(MPI.WIN_MODEL) != MPI.WIN_UNIFIED:
            raise RuntimeError("NodeWeightCache: the MPI library's shared window is not in the unified memory model")
        memory, _ = self._win.Shared_query(0)
        self._data = np.frombuffer(memory, dtype=np.float32, count=self._n, offset=_DATA)
        self._scratch = np.empty(self._n, dtype=np.float32)  # a fetch from rank 0 lands here first
        self._res = np.zeros(1, dtype=np.int64)
        self._win.Lock_all(MPI.MODE_NOCHECK)  # the one shared epoch, closed in free()
        if self.node_rank == 0:
            self._data[:] = np.nan  # sentinel: an uninitialised read shows
            self._win.Sync()
            init = np.array([0, -1, 0, 0], dtype=np.int64)
            self._win.Accumulate(_i64(init), 0, (0, 4, _INT64), op=MPI.REPLACE)
            self._win.Flush(0)
        node_comm.Barrier()
        self.fetches = 0  # versions this rank fetched from rank 0 for the node
        self.waits = 0  # reads that waited while another actor of the node fetched
        self.retries = 0  # shared copies that overlapped a write and were redone

    # ---- the control words ---------------------------------------------------------------
    def _window(self):
        if self._win == MPI.WIN_NULL:
            raise RuntimeError("NodeWeightCache already freed")
        return self._win

    def _fop(self, word: int, value: int, op) -> int:
        win = self._window()
        win.Fetch_and_op(_i64(np.array([value], dtype=np.int64)), _i64(self._res), 0, _I8 * word, op)
        win.Flush(0)
        return int(self._res[0])

    def _cas(self, word: int, expect: int, new: int) -> int:
        win = self._window()
        win.Compare_and_swap(_i64(np.array([new], dtype=np.int64)), _i64(np.array([expect], dtype=np.int64)),
                             _i64(self._res), 0, _I8 * word)
        win.Flush(0)
        return int(self._res[0])

    def cached_version(self) -> int:
        """The version the node holds (-1: none yet): one atomic read of shared memory."""
        return self._fop(VERSION, 0, MPI.NO_OP)

    def node_fetches(self) -> int:
        """Versions the node's actors fetched from rank 0 so far (all of them, not only this rank)."""
        return self._fop(FETCHES, 0, MPI.NO_OP)

    # ---- reading ---------------------------------------------------------------------------
    def _copy(self, out: np.ndarray | None, offset: int) -> int | None:
        """Seqlocked copy of ``out.size`` floats at ``offset`` from shared memory (``out`` None: the version only):
        the version copied, or None when a write overlapped."""
        before = self._fop(SEQ, 0, MPI.NO_OP)
        if before % 2:
            return None
        version = self._fop(VERSION, 0, MPI.NO_OP)
        if out is not None:
            self._win.Sync()  # the seq and version loads before the data's
            np.copyto(out, self._data[offset:offset + out.size])
            self._win.Sync()  # the data's loads before the second seq load
        return version if self._fop(SEQ, 0, MPI.NO_OP) == before else None

    def _fetch(self) -> int:
        """Holding the node's lock: the newest version from rank 0 into shared memory, once; its version."""
        got = self.board.read_latest_with_probe(self._scratch)
        self._fop(SEQ, 1, MPI.SUM)  # odd: being written
        self._win.Sync()
        self._data[:] = self._scratch
        self._win.Sync()  # the data's stores before the version and the even seq
        self._fop(VERSION, got, MPI.REPLACE)
        self._fop(SEQ, 1, MPI.SUM)
        self._fop(FETCHES, 1, MPI.SUM)
        self.fetches += 1
        return got

    def _read(self, out: np.ndarray | None, offset: int, have: int) -> int:
        """The newest version rank 0 has (at least), copied into ``out`` from the node's memory unless it is
        ``have``; fetched from rank 0 first by whichever actor of the node takes the lock."""
        newest = self.board.latest_version()
        if newest < 0:
            return -1
        if newest == have:
            return have
        backoff, waited = Backoff(), False
        while True:
            cached = self.cached_version()
            if cached >= newest:
                if cached == have:
                    return have
                got = self._copy(out, offset)
                if got is not None and got >= newest:
                    return got
                self.retries += 1
            elif self._cas(LOCK, 0, self.node_rank + 1) == 0:
                try:
                    if self.cached_version() < newest:  # nobody filled it between the read and the lock
                        self._fetch()
                finally:
                    if self._cas(LOCK, self.node_rank + 1, 0) != self.node_rank + 1:
                        raise RuntimeError("NodeWeightCache: the node's lock was taken from its holder")
                continue  # copy it out through the seqlock like any reader
            elif not waited:
                waited = True
                self.waits += 1
            self.beat()  # alive, waiting on the node's fetcher: the watchdog must name that one if it hangs
            backoff.sleep()

    def _check_out(self, out: np.ndarray, n: int, what: str) -> None:
        if out.dtype != np.float32 or out.size != n or not out.flags.c_contiguous:
            raise ValueError(f"NodeWeightCache.{what}: out must be a contiguous float32 array of {n} values")

    def read_latest(self, out: np.ndarray, have: int = -1) -> int:
        """Copy the newest params into ``out``; their version (-1: none published). ``have``: the version
        ``out`` holds; when it is still rank 0's newest nothing is copied (one atomic read on rank 0)."""
        self._check_out(out, self.num_params, "read_latest")
        return self._read(out.reshape(-1), 0, have)

    def read_latest_part(self, out: np.ndarray, start: int, have: int = -1) -> int:
        """As :meth:`read_latest`, for the ``out.size`` params from ``start`` only."""
        if out.dtype != np.float32 or not out.flags.c_contiguous or not 0 <= start <= self.num_params - out.size:
            raise ValueError(f"NodeWeightCache.read_latest_part: out must be a contiguous float32 array within the "
                             f"{self.num_params} params from {start}")
        return self._read(out.reshape(-1), start, have)

    def read_probe(self, out: np.ndarray) -> int:
        """Copy the newest probe outputs into ``out`` (through the node's memory, like the params)."""
        self._check_out(out, self.probe_size, "read_probe")
        return self._read(out.reshape(-1), self.num_params, -1)

    def read_version(self, version: int, out: np.ndarray) -> bool:
        """``version``'s params from the node's memory when it holds that version, else from rank 0's ring."""
        self._check_out(out, self.num_params, "read_version")
        if self.cached_version() == version and self._copy(out.reshape(-1), 0) == version:
            return True
        return self.board.read_version(version, out)

    def latest_version(self) -> int:
        return self.board.latest_version()

    def versions(self) -> list[int]:
        return self.board.versions()

    def publish(self, version: int, flat: np.ndarray, probe: np.ndarray | None = None) -> None:
        raise RuntimeError("NodeWeightCache.publish: the parameter rank publishes on the WeightBoard itself")

    def fetch_rows(self, final: bool = False) -> dict[str, list[int]]:
        """Nothing: rank 0's board counts the fetches it served."""
        return self.board.fetch_rows(final) if self.board.is_owner else {}

    def free(self) -> None:
        """Collective over the node's actors, then over the board's ranks: the shared window, then the board."""
        win, self._win = self._win, MPI.WIN_NULL
        if win != MPI.WIN_NULL:
            win.Unlock_all()
            win.Free()
            self._data = None
        self.board.free()


# ---- wiring it (the MPI runner; whether to: placement.node_weight_caches) ------------------------
def shared_memory_node(actors):
    """The actors that share this rank's node memory (``Split_type(COMM_TYPE_SHARED)``)."""
    return actors.Split_type(MPI.COMM_TYPE_SHARED, key=actors.Get_rank())


def for_actors(board: WeightBoard, comm, is_actor: bool, beat: Callable[[], None] = lambda: None,
               tree_fanout: int = 0, node_of: Callable = shared_memory_node) -> WeightBoard | NodeWeightCache:
    """Collective over ``comm`` (every rank of the board): each actor's :class:`NodeWeightCache` over the actors
    of its node (``node_of(actors)``: those that share its memory), ``beat`` its heartbeat; the board itself on the
    other ranks. ``tree_fanout`` k >= 2: the node caches fetch through a
    :class:`~hpcrl.runtime.transport.weight_tree.WeightTree` (rank 0 serves k nodes, each node k more)."""
    actors = comm.Split(0 if is_actor else MPI.UNDEFINED, comm.Get_rank())
    if actors == MPI.COMM_NULL:
        return board
    node = node_of(actors)
    source = board
    if tree_fanout:
        from hpcrl.runtime.transport.weight_tree import WeightTree

        leader = node.bcast(actors.Get_rank(), root=0)  # the node's first actor keeps its relay
        leaders = sorted(set(actors.allgather(leader)))
        source = WeightTree(board, actors, leaders.index(leader), leaders, tree_fanout, beat)
    actors.Free()
    cache = NodeWeightCache(source, node, beat)
    node.Free()  # the window keeps what it needs of it
    return cache
