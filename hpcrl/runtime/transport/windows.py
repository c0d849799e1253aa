"""The RMA objects of an hpcrl job: gradient mailbox, weight board, counters.

Modelled on mpi4py's ``util/sync.Counter``: window memory exists only on the owner rank
(``Win.Allocate`` with size 0 elsewhere), every access is a passive-target operation inside a
shared lock epoch, targets are explicit ``(byte displacement, count, datatype)`` triples
(``disp_unit`` = 1), and ``free()`` (collective) makes later use raise.

One epoch for the window's life: every rank opens ``Lock_all(MODE_NOCHECK)`` when the window is
made and closes it in ``free()``; each access completes with ``Flush``. A ``Lock``/``Unlock``
pair per access (mpi4py's Counter) costs a message the owner must answer from inside MPI: with
MPICH 5 (ch4, UCX/OFI) on 2 cores, about 1 ms per access while the owner naps 0.2 ms, 90 ms
while it naps 50 ms, against 2 to 7 us per Fetch_and_op or 40 kB Get inside the epoch, whatever
the owner does. No rank ever takes an exclusive lock, which is what MODE_NOCHECK promises.

MPI rules this module relies on, and how it meets them:

- Control words (slot states, sequence numbers, versions, counters) are only ever touched with
  accumulate-class atomics (``Compare_and_swap``, ``Fetch_and_op``, ``Get_accumulate``), and each
  word with a single operation plus ``NO_OP`` reads, as the default window hint
  ``accumulate_ops=same_op_no_op`` requires. Payloads (gradients, parameters) move with
  ``Put``/``Get``, separated from the control words by ``Flush`` (remote completion).
- The owner reads its own window memory through RMA on itself (``Lock(owner, LOCK_SHARED)``,
  ``Get``/``Get_accumulate``, ``Flush``), never by load/store, so the code is correct in both the
  separate and the unified memory model without ``Win.Sync`` reasoning.
- Progress: inside the epoch, the accesses measured above complete without the owner entering
  MPI. An MPI that still needs the owner's progress gets it from the owner's loop, which calls
  ``GradientMailbox.poll`` often; ``MPIR_CVAR_ASYNC_PROGRESS=1`` (MPICH, needs
  MPI_THREAD_MULTIPLE) is an optional extra for owners that spend long stretches in torch.
- Waiting never spins hot: :class:`~hpcrl.runtime.backoff.Backoff` sleeps 10 us doubling to 1 ms between attempts.
- Thread level: hpcrl calls MPI from each rank's main thread only, and keeps mpi4py's default
  ``MPI_THREAD_MULTIPLE`` (what ``MPIR_CVAR_ASYNC_PROGRESS`` needs); nothing here starts threads.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.messages import PushHeader
from hpcrl.runtime.transport.push import PushLoop

FREE, CLAIMED, FULL = 0, 1, 2
"""Mailbox slot states (the state word moves FREE -> CLAIMED -> FULL -> FREE, by CAS only)."""

_I8 = 8  # bytes of an int64 control word
_SLOTS = 1 << 16  # the weight board's latest word: version * _SLOTS + slot
FETCH_KINDS = ("actor", "learner")
"""Who reads the weight board: each kind's fetches of a version are counted apart (run.h5 ``weight_fetches``)."""
_TALLIES = 1024  # versions whose fetch counts the board keeps words for (a ring indexed by version)
_TALLY_LAG = 64  # versions a fetch count waits behind the newest before it is read, so late counts still land
_INT64 = MPI.INT64_T  # one datatype for every atomic on a control word (numpy's int64 maps to MPI_LONG)


def _i64(a: np.ndarray) -> list:
    return [a, _INT64]
_ALIGN = 64


def _align(n: int, to: int = _ALIGN) -> int:
    return (n + to - 1) // to * to


class _OwnedWindow:
    """A window whose memory lives on ``owner_rank`` only; shared lock epochs; ``free()``."""

    _what = "window"

    def __init__(self, comm, owner_rank: int, nbytes: int):
        if not 0 <= owner_rank < comm.Get_size():
            raise ValueError(f"{self._what}: owner_rank {owner_rank} outside communicator of size {comm.Get_size()}")
        self._comm = comm
        self.owner = owner_rank
        self.rank = comm.Get_rank()
        self.nbytes = nbytes
        self._win = MPI.Win.Allocate(nbytes if self.rank == owner_rank else 0, 1, MPI.INFO_NULL, comm)
        self._win.Lock_all(MPI.MODE_NOCHECK)  # the one shared epoch, closed in free()

    @property
    def is_owner(self) -> bool:
        return self.rank == self.owner

    @contextmanager
    def _epoch(self):
        """The window inside its lifelong shared epoch (accesses still end with Flush)."""
        yield self._window()

    def _window(self):
        if self._win == MPI.WIN_NULL:
            raise RuntimeError(f"{self._what} already freed")
        return self._win

    def _require_owner(self, what: str) -> None:
        if not self.is_owner:
            raise RuntimeError(f"{self._what}.{what} is for the owner rank {self.owner} (this is rank {self.rank})")

    def _init_words(self, disp: int, values: np.ndarray) -> None:
        """Owner: set control words atomically (REPLACE), before anyone else touches them."""
        with self._epoch() as win:
            win.Accumulate(_i64(values), self.owner, (disp, values.size, _INT64), op=MPI.REPLACE)
            win.Flush(self.owner)

    def _fill_floats(self, disp: int, count: int, value: float) -> None:
        """Owner: fill a float32 region with a sentinel (NaN shows uninitialised reads)."""
        chunk = np.full(min(count, 1 << 20), value, dtype=np.float32)
        with self._epoch() as win:
            done = 0
            while done < count:
                n = min(chunk.size, count - done)
                win.Put([chunk, n, MPI.FLOAT], self.owner, (disp + 4 * done, n, MPI.FLOAT))
                win.Flush(self.owner)
                done += n

    def free(self) -> None:
        """Collective over the communicator: release the window; later use raises RuntimeError."""
        win, self._win = self._win, MPI.WIN_NULL
        if win != MPI.WIN_NULL:
            win.Unlock_all()
            win.Free()


class GradientMailbox(_OwnedWindow, PushLoop):
    """Slots on the parameter rank where learner groups put flat float32 gradients (one-sided).

    Window layout (bytes, owner only): ``int64 ticket`` (arrival counter, SUM only), ``int64
    state[G*S]`` (CAS only), then G*S slots, slot ``g*S + k`` belonging to group g, each
    ``int64 header[8]`` (seq, group, base_version, samples, ticket, pusher rank, n_stats, 0),
    ``float64 stats[stats_capacity]``, ``float32 grad[num_params]``.

    A pusher claims a FREE slot of its group with CAS (FREE -> CLAIMED), takes a ticket
    (Fetch_and_op SUM), Puts header and gradient, Flushes, then CASes CLAIMED -> FULL. The owner
    reads the states, copies FULL slots out and CASes them FULL -> FREE; CLAIMED slots (a write
    in progress) are skipped, so poll never waits on a learner. Tickets order the arrivals.
    """

    _what = "GradientMailbox"
    HEADER = ("seq", "group", "base_version", "samples", "ticket", "rank", "n_stats")

    def __init__(self, comm, owner_rank: int, num_groups: int, slots_per_group: int, num_params: int,
                 stats_capacity: int = 8):
        if num_groups < 1 or slots_per_group < 1 or num_params < 1 or stats_capacity < 0:
            raise ValueError("GradientMailbox: num_groups, slots_per_group, num_params must be >= 1")
        self.num_groups, self.slots_per_group = num_groups, slots_per_group
        self.num_params, self.stats_capacity = num_params, stats_capacity
        nslots = num_groups * slots_per_group
        self._state_disp = _I8
        self._slots_disp = _align(_I8 * (1 + nslots))
        self._header_bytes = _I8 * 8 + 8 * stats_capacity
        self._slot_bytes = _align(self._header_bytes + 4 * num_params)
        super().__init__(comm, owner_rank, self._slots_disp + nslots * self._slot_bytes)
        self._one = np.ones(1, dtype=np.int64)
        self._res = np.zeros(1, dtype=np.int64)
        self._hdr = np.zeros(self._header_bytes // 8, dtype=np.int64)
        self.pushes = 0
        self._next_slot: dict[int, int] = {}
        if self.is_owner:
            self._init_words(0, np.zeros(1 + nslots, dtype=np.int64))
            for s in range(nslots):
                self._fill_floats(self._grad_disp(s), num_params, np.nan)
        comm.Barrier()

    def _slot_disp(self, slot: int) -> int:
        return self._slots_disp + slot * self._slot_bytes

    def _grad_disp(self, slot: int) -> int:
        return self._slot_disp(slot) + self._header_bytes

    def _cas_state(self, win, slot: int, expect: int, new: int) -> int:
        origin = np.array([new], dtype=np.int64)
        compare = np.array([expect], dtype=np.int64)
        win.Compare_and_swap(_i64(origin), _i64(compare), _i64(self._res), self.owner, self._state_disp + _I8 * slot)
        win.Flush(self.owner)
        return int(self._res[0])

    # ---- learner side -------------------------------------------------------------------
    def try_push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray,
                 stats=None) -> bool:
        """One attempt: True if the gradient is now FULL in a slot of ``group``; False if all busy."""
        if not 0 <= group < self.num_groups:
            raise ValueError(f"GradientMailbox.push: group {group} outside 0..{self.num_groups - 1}")
        grad = np.ascontiguousarray(grad, dtype=np.float32).reshape(-1)
        if grad.size != self.num_params:
            raise ValueError(f"GradientMailbox.push: gradient has {grad.size} values, mailbox holds {self.num_params}")
        stats = np.asarray([] if stats is None else stats, dtype=np.float64).reshape(-1)
        if stats.size > self.stats_capacity:
            raise ValueError(f"GradientMailbox.push: {stats.size} stats, capacity is {self.stats_capacity}")
        with self._epoch() as win:
            first = self._next_slot.get(group, 0)  # the slot after the last one filled: likely free
            for k in range(self.slots_per_group):
                slot = group * self.slots_per_group + (first + k) % self.slots_per_group
                if self._cas_state(win, slot, FREE, CLAIMED) != FREE:
                    continue
                self._next_slot[group] = (first + k + 1) % self.slots_per_group
                win.Fetch_and_op(_i64(self._one), _i64(self._res), self.owner, 0, MPI.SUM)
                win.Flush(self.owner)
                hdr = self._hdr
                hdr[:] = 0
                hdr[:7] = (seq, group, base_version, samples, self._res[0], self.rank, stats.size)
                hdr.view(np.float64)[8:8 + stats.size] = stats
                base = self._slot_disp(slot)
                win.Put([hdr, MPI.BYTE], self.owner, (base, self._header_bytes, MPI.BYTE))
                win.Put([grad, MPI.FLOAT], self.owner, (base + self._header_bytes, grad.size, MPI.FLOAT))
                win.Flush(self.owner)
                if self._cas_state(win, slot, CLAIMED, FULL) != CLAIMED:
                    raise RuntimeError(f"GradientMailbox: slot {slot} left CLAIMED by someone else")
                self.pushes += 1
                return True
        return False

    # ---- owner side ---------------------------------------------------------------------
    def states(self) -> np.ndarray:
        """Current state word of every slot (atomic reads), shape (groups, slots_per_group)."""
        n = self.num_groups * self.slots_per_group
        out = np.zeros(n, dtype=np.int64)
        with self._epoch() as win:
            win.Get_accumulate(_i64(np.zeros(n, dtype=np.int64)), _i64(out), self.owner, (self._state_disp, n, _INT64),
                               op=MPI.NO_OP)
            win.Flush(self.owner)
        return out.reshape(self.num_groups, self.slots_per_group)

    def poll(self, limit: int | None = None) -> list[tuple[PushHeader, np.ndarray]]:
        """Owner: copy out every FULL slot (oldest ticket first), free them; never waits.

        Returns ``[(header, grad)]``: the slot's header (``stats`` a float64 array) and a fresh float32
        array of ``num_params`` values.
        """
        self._require_owner("poll")
        full = np.flatnonzero(self.states().reshape(-1) == FULL)
        if full.size == 0:
            return []
        out = []
        with self._epoch() as win:
            hdrs = np.zeros((full.size, self._header_bytes // 8), dtype=np.int64)
            for i, slot in enumerate(full):
                win.Get([hdrs[i], MPI.BYTE], self.owner, (self._slot_disp(slot), self._header_bytes, MPI.BYTE))
            win.Flush(self.owner)
            order = np.argsort(hdrs[:, 4], kind="stable")[:limit]
            for i in order:
                slot = int(full[i])
                grad = np.empty(self.num_params, dtype=np.float32)
                win.Get([grad, MPI.FLOAT], self.owner, (self._grad_disp(slot), self.num_params, MPI.FLOAT))
                win.Flush(self.owner)
                if self._cas_state(win, slot, FULL, FREE) != FULL:
                    raise RuntimeError(f"GradientMailbox: slot {slot} changed while FULL")
                h = hdrs[i]
                seq, group, base_version, samples, ticket, _, n_stats = (int(x) for x in h[:len(self.HEADER)])
                header = PushHeader(seq=seq, group=group, base_version=base_version, samples=samples,
                                    stats=h.view(np.float64)[8:8 + n_stats].copy(), ticket=ticket)
                out.append((header, grad))
        return out


class WeightBoard(_OwnedWindow):
    """The parameter rank's published policy: version, flat float32 params, probe outputs.

    A ring of ``history`` slots, each guarded by a seqlock. Layout (owner only): ``int64
    ctrl[4 + 2*history]`` = latest (``version * 2**16 + slot``, -1 before the first publish),
    publications, 0, 0, then (seq, version) per slot; then per slot ``float32 params[num_params] +
    probe[probe_size]``. ``publish`` fills the slot after the latest one: seq -> odd, version, Put
    data, Flush, seq -> even, then the latest word. A reader reads seq, Gets the data, Flushes,
    reads seq again and retries when it was odd or changed (a conflicting Get is then discarded,
    never returned) or when the slot no longer holds the version the latest word named. Version
    and slot share one word, so ``latest_version()`` read after ``read_latest`` (or
    ``read_probe``) returned v is never below v, and ``read_latest`` after ``latest_version()``
    returned v never returns less. The newest version is never the slot being rewritten
    (history >= 2), so readers rarely retry; the older slots serve ``read_version`` for
    Stellaris' IS truncation.

    Fetch counts: after the ctrl words, ``int64 tally[1024][2 * len(FETCH_KINDS)]`` (SUM only),
    row ``version % 1024``: per reader kind (``reader``, this rank's), the copies of that version's
    data it took and their bytes. A reader adds to them after a copy succeeded (a retried copy is
    not counted; ``retries`` counts those); ``read_latest`` with the newest version held copies
    nothing and counts nothing. The owner turns them into one row per published version
    (:meth:`fetch_rows`): what rank 0 served, whoever read it (a node's actors through a
    :class:`~hpcrl.runtime.transport.node_cache.NodeWeightCache` count once per node).
    """

    _what = "WeightBoard"

    def __init__(self, comm, owner_rank: int, num_params: int, history: int = 4, probe_size: int = 0,
                 reader: str = "actor"):
        if num_params < 1 or not 1 <= history < _SLOTS or probe_size < 0:
            raise ValueError(f"WeightBoard: num_params >= 1, 1 <= history < {_SLOTS}, probe_size >= 0")
        if reader not in FETCH_KINDS:
            raise ValueError(f"WeightBoard: reader {reader!r} is not one of {', '.join(FETCH_KINDS)}")
        self.num_params, self.history, self.probe_size = num_params, history, probe_size
        self._nctrl = 4 + 2 * history
        self._tally_disp = _align(_I8 * self._nctrl)
        self._tally_width = 2 * len(FETCH_KINDS)
        self._data_disp = _align(self._tally_disp + _I8 * _TALLIES * self._tally_width)
        self._slot_bytes = _align(4 * (num_params + probe_size))
        super().__init__(comm, owner_rank, self._data_disp + history * self._slot_bytes)
        self._res = np.zeros(1, dtype=np.int64)
        self._ctrl = np.zeros(self._nctrl, dtype=np.int64)
        self._kind = FETCH_KINDS.index(reader)
        self._count = np.zeros(2, dtype=np.int64)  # this reader's (1, bytes), added to a version's tally
        self._latest_slot = -1
        self._latest_version = -1
        self._unread: deque[int] = deque()  # owner: versions published whose fetch counts are not read yet
        self._tally_seen = np.zeros((_TALLIES, self._tally_width), dtype=np.int64)  # owner: the sums read so far
        self._rows: list[tuple[int, ...]] = []  # owner: counts read, not yet taken by fetch_rows
        self.retries = 0
        if self.is_owner:
            init = np.zeros(self._nctrl, dtype=np.int64)
            init[0] = -1
            init[5::2] = -1
            self._init_words(0, init)
            self._init_words(self._tally_disp, np.zeros(_TALLIES * self._tally_width, dtype=np.int64))
            self._fill_floats(self._data_disp, history * self._slot_bytes // 4, np.nan)
        comm.Barrier()

    def _word(self, i: int) -> int:
        return _I8 * i

    def _seq_word(self, slot: int) -> int:
        return 4 + 2 * slot

    def _fop(self, win, word: int, value: int, op) -> int:
        win.Fetch_and_op(_i64(np.array([value], dtype=np.int64)), _i64(self._res), self.owner, self._word(word), op)
        win.Flush(self.owner)
        return int(self._res[0])

    def publish(self, version: int, flat: np.ndarray, probe: np.ndarray | None = None) -> None:
        """Owner: make ``flat`` (and the probe outputs) readable as ``version`` (strictly increasing)."""
        self._require_owner("publish")
        if version <= self._latest_version:
            raise ValueError(f"WeightBoard.publish: version {version} not above the latest {self._latest_version}")
        flat = np.ascontiguousarray(flat, dtype=np.float32).reshape(-1)
        if flat.size != self.num_params:
            raise ValueError(f"WeightBoard.publish: {flat.size} params, board holds {self.num_params}")
        probe = np.ascontiguousarray([] if probe is None else probe, dtype=np.float32).reshape(-1)
        if probe.size != self.probe_size:
            raise ValueError(f"WeightBoard.publish: probe has {probe.size} values, board expects {self.probe_size}")
        while self._unread and version - self._unread[0] >= _TALLIES // 2:  # its tally row is about to be reused
            self._take_tallies(1)
        slot = (self._latest_slot + 1) % self.history
        base = self._data_disp + slot * self._slot_bytes
        seq = self._seq_word(slot)
        # three Flushes, each separating what readers must see in order (a Flush per word would be
        # six: each one a chance for MPICH to yield the core on an oversubscribed node)
        with self._epoch() as win:
            odd = self._accumulate(win, [(seq, 1, MPI.SUM), (seq + 1, version, MPI.REPLACE)])
            win.Flush(self.owner)  # odd (being written) before any byte of the data
            win.Put([flat, MPI.FLOAT], self.owner, (base, flat.size, MPI.FLOAT))
            if probe.size:
                win.Put([probe, MPI.FLOAT], self.owner, (base + 4 * self.num_params, probe.size, MPI.FLOAT))
            win.Flush(self.owner)  # the data before even (consistent)
            # even, then version and slot in one atomic word, the count: a reader that meets the new
            # latest word before the even seq finds the slot odd and reads again
            even = self._accumulate(win, [(seq, 1, MPI.SUM), (0, version * _SLOTS + slot, MPI.REPLACE),
                                          (1, 1, MPI.SUM)])
            win.Flush(self.owner)
        del odd, even  # origin buffers live until their Flush
        self._latest_slot, self._latest_version = slot, version
        self._unread.append(version)

    # ---- fetch counts -------------------------------------------------------------------
    def fetch_rows(self, final: bool = False) -> dict[str, list[int]]:
        """Owner: one row per published version whose fetch counts are settled (columns of run.h5's
        ``weight_fetches``: version, then fetches and bytes per reader kind), each version once.

        A version's counts are read once it is 64 versions behind the newest (a reader still adding
        to them would have to stall across 64 publishes); ``final`` (no reader reads any more: the run's
        end) reads every version's."""
        self._require_owner("fetch_rows")
        self._take_tallies(len(self._unread) if final else max(len(self._unread) - _TALLY_LAG, 0))
        rows, self._rows = self._rows, []
        names = ["version"] + [f"{k}_{what}" for k in FETCH_KINDS for what in ("fetches", "bytes")]
        return {name: [r[i] for r in rows] for i, name in enumerate(names)}

    def _take_tallies(self, n: int) -> None:
        """Owner: read the tally rows of the ``n`` oldest unread versions into ``_rows``."""
        if n <= 0:
            return
        words = _TALLIES * self._tally_width
        now = np.zeros(words, dtype=np.int64)
        with self._epoch() as win:
            win.Get_accumulate(_i64(np.zeros(words, dtype=np.int64)), _i64(now), self.owner,
                               (self._tally_disp, words, _INT64), op=MPI.NO_OP)
            win.Flush(self.owner)
        now = now.reshape(_TALLIES, self._tally_width)
        for _ in range(n):
            version = self._unread.popleft()
            i = version % _TALLIES
            self._rows.append((version, *(int(x) for x in now[i] - self._tally_seen[i])))
            self._tally_seen[i] = now[i]

    def _tally(self, win, version: int, nbytes: int) -> None:
        """Reader: count one successful copy of ``version`` (``nbytes``) for this rank's kind."""
        self._count[:] = (1, nbytes)
        disp = self._tally_disp + _I8 * ((version % _TALLIES) * self._tally_width + 2 * self._kind)
        win.Accumulate(_i64(self._count), self.owner, (disp, 2, _INT64), op=MPI.SUM)
        win.Flush(self.owner)

    def _accumulate(self, win, updates: list[tuple[int, int, object]]) -> list[np.ndarray]:
        """Start ``(word, value, op)`` updates (Accumulate, no Flush); returns their origin buffers."""
        buffers = []
        for word, value, op in updates:
            buf = np.array([value], dtype=np.int64)
            win.Accumulate(_i64(buf), self.owner, (self._word(word), 1, _INT64), op=op)
            buffers.append(buf)
        return buffers

    def latest_version(self) -> int:
        """Newest published version (-1 before the first publish): one atomic read."""
        with self._epoch() as win:
            latest = self._fop(win, 0, 0, MPI.NO_OP)
        return -1 if latest < 0 else latest // _SLOTS

    def _read_ctrl(self, win) -> np.ndarray:
        win.Get_accumulate(_i64(np.zeros(self._nctrl, dtype=np.int64)), _i64(self._ctrl), self.owner,
                           (0, self._nctrl, _INT64), op=MPI.NO_OP)
        win.Flush(self.owner)
        return self._ctrl

    def _read_slot(self, win, slot: int, offset: int, out: np.ndarray) -> int | None:
        """Seqlocked copy of ``out.size`` floats at ``offset`` of ``slot``: its version, or None if a
        publish overlapped. The version word is read between the two seq reads, never with the
        ctrl snapshot (a multi-word Get_accumulate is atomic per word only, in no set order)."""
        seq = self._seq_word(slot)
        before = self._fop(win, seq, 0, MPI.NO_OP)
        if before % 2:
            return None
        version = self._fop(win, seq + 1, 0, MPI.NO_OP)
        base = self._data_disp + slot * self._slot_bytes + 4 * offset
        win.Get([out, MPI.FLOAT], self.owner, (base, out.size, MPI.FLOAT))
        win.Flush(self.owner)
        return version if self._fop(win, seq, 0, MPI.NO_OP) == before else None

    def _read(self, offset: int, out: np.ndarray, version: int | None, have: int = -1) -> int:
        """Seqlocked read of the latest slot (version None) or of ``version``; -1 if absent. The latest
        version is not copied when it is ``have`` (returned as it is; -1, no version, never is)."""
        backoff = Backoff()
        while True:
            with self._epoch() as win:
                ctrl = self._read_ctrl(win)
                if version is None:  # the slot the latest word names, holding the version it names
                    if ctrl[0] < 0:
                        return -1
                    slot, version_wanted = int(ctrl[0] % _SLOTS), int(ctrl[0] // _SLOTS)
                    if version_wanted == have:
                        return have
                else:
                    version_wanted = version
                    found = np.flatnonzero(ctrl[5::2] == version) if version >= 0 else []
                    slot = int(found[0]) if len(found) else -1
                if slot < 0:
                    return -1
                got = self._read_slot(win, slot, offset, out)
                if got is not None and got == version_wanted:
                    self._tally(win, got, out.nbytes)
                    return got
            self.retries += 1
            backoff.sleep()

    def _check_out(self, out: np.ndarray, n: int, what: str) -> None:
        if out.dtype != np.float32 or out.size != n or not out.flags.c_contiguous:
            raise ValueError(f"WeightBoard.{what}: out must be a contiguous float32 array of {n} values")

    def read_latest(self, out: np.ndarray, have: int = -1) -> int:
        """Copy the newest params into ``out`` (float32, num_params); return their version (-1: none yet).
        ``have``: the version ``out`` holds already (-1: none); when it is still the newest nothing is
        copied (one atomic read, as :meth:`latest_version`)."""
        self._check_out(out, self.num_params, "read_latest")
        return self._read(0, out.reshape(-1), None, have)

    def read_latest_part(self, out: np.ndarray, start: int, have: int = -1) -> int:
        """As :meth:`read_latest`, for the ``out.size`` params from ``start`` only (an allreduce group's untrained
        values: the rest it holds already); the fetch counts count these bytes."""
        if out.dtype != np.float32 or not out.flags.c_contiguous or not 0 <= start <= self.num_params - out.size:
            raise ValueError(f"WeightBoard.read_latest_part: out must be a contiguous float32 array within the "
                             f"{self.num_params} params from {start}")
        return self._read(start, out.reshape(-1), None, have)

    def read_version(self, version: int, out: np.ndarray) -> bool:
        """Copy the params of ``version`` into ``out`` if the ring still holds it; False otherwise."""
        self._check_out(out, self.num_params, "read_version")
        return self._read(0, out.reshape(-1), version) == version

    def read_probe(self, out: np.ndarray) -> int:
        """Copy the newest probe outputs into ``out`` (float32, probe_size); return their version."""
        self._check_out(out, self.probe_size, "read_probe")
        return self._read(self.num_params, out.reshape(-1), None)

    def read_latest_with_probe(self, out: np.ndarray, have: int = -1) -> int:
        """The newest params and their probe outputs in one copy (``out``: float32, num_params + probe_size,
        params first): what a node's cache holds of one version. ``have`` as in :meth:`read_latest`."""
        self._check_out(out, self.num_params + self.probe_size, "read_latest_with_probe")
        return self._read(0, out.reshape(-1), None, have)

    def versions(self) -> list[int]:
        """Versions the ring holds now, oldest first (a snapshot: publish may change it)."""
        with self._epoch() as win:
            held = self._read_ctrl(win)[5::2]
        return sorted(int(v) for v in held if v >= 0)


class CounterWindow(_OwnedWindow):
    """``n`` int64 counters on ``owner_rank`` that any rank reads and updates atomically.

    ``add`` is Fetch_and_op SUM, ``set`` is Fetch_and_op REPLACE, reads are NO_OP. MPI's default
    hint ``accumulate_ops=same_op_no_op`` allows concurrent updates of one counter with one op
    only: use each counter either with ``add`` (backlogs, tallies) or with ``set`` (flags, the
    active-group count), not both at the same time. Reads are always safe.
    """

    _what = "CounterWindow"

    def __init__(self, comm, owner_rank: int, n: int, initial=0):
        if n < 1:
            raise ValueError("CounterWindow: n must be >= 1")
        self.n = n
        super().__init__(comm, owner_rank, _I8 * n)
        self._res = np.zeros(1, dtype=np.int64)
        if self.is_owner:
            self._init_words(0, np.broadcast_to(np.asarray(initial, dtype=np.int64), (n,)).copy())
        comm.Barrier()

    def _index(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"CounterWindow: counter {i} outside 0..{self.n - 1}")
        return _I8 * i

    def _fop(self, i: int, value: int, op) -> int:
        disp = self._index(i)
        with self._epoch() as win:
            win.Fetch_and_op(_i64(np.array([value], dtype=np.int64)), _i64(self._res), self.owner, disp, op)
            win.Flush(self.owner)
        return int(self._res[0])

    def add(self, i: int, value: int = 1) -> int:
        """Atomically add ``value`` to counter ``i``; return the value before."""
        return self._fop(i, value, MPI.SUM)

    def add_each(self, first: int, values) -> None:
        """Add ``values[k]`` to counter ``first + k``, in one Accumulate. MPI makes each word atomic; MPICH applies
        one accumulate at its target whole (under the window's lock in shared memory, in one handler over the
        network), so a :meth:`read_all` sees the words all changed or none (tests/test_runtime_windows.py checks it)."""
        deltas = np.ascontiguousarray(values, dtype=np.int64)
        self._index(first + len(deltas) - 1)
        with self._epoch() as win:
            win.Accumulate(_i64(deltas), self.owner, (self._index(first), len(deltas), _INT64), op=MPI.SUM)
            win.Flush(self.owner)

    def set(self, i: int, value: int) -> int:
        """Atomically replace counter ``i``; return the value before."""
        return self._fop(i, value, MPI.REPLACE)

    def read(self, i: int) -> int:
        return self._fop(i, 0, MPI.NO_OP)

    def read_all(self) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.int64)
        with self._epoch() as win:
            win.Get_accumulate(_i64(np.zeros(self.n, dtype=np.int64)), _i64(out), self.owner, (0, self.n, _INT64),
                               op=MPI.NO_OP)
            win.Flush(self.owner)
        return out

    def wait_until(self, predicate, timeout: float, nap: float = 0.05) -> bool:
        """Sleep until ``predicate(read_all())`` holds (True) or ``timeout`` seconds pass (False), reading
        every ``nap`` seconds: MPICH has no blocking wait that does not spin, so this is how a parked
        learner blocks (20 reads a second cost a few hundred microseconds of CPU)."""
        end = time.monotonic() + timeout
        while not predicate(self.read_all()):
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(nap, left))
        return True
