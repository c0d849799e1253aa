"""One actor's trajectory file, ``traj/actor-NNNNN.h5``: every step it sampled.

Datasets (schema.TRAJ_FIELDS) are ``[steps, *per_step_shape]``, resizable along axis 0,
chunked, compressed. A fragment ``[T, N, ...]`` (T time steps of N environments) is
flattened **time-major**: step ``t * N + n`` is time ``t`` of environment ``n``; the
``env_index`` dataset repeats ``0..N-1`` accordingly. Fragments are buffered in memory and
written on :meth:`flush`: all datasets resized and written (``policy_version`` last, so
``policy_version >= 0`` marks a step whose fields all reached the file), flushed, and then
the committed count raised (the one-element dataset ``committed/steps``, for readers that keep the
file open, then the root attribute ``committed_steps``); a killed actor leaves the file as it was at
its last flush, and readers use ``min(committed_steps, shortest dataset)`` steps. A failed
write raises :class:`~hpcrl.io.errors.RecordWriteError` once and ends the writer (see
:mod:`hpcrl.io.tables`). A file deleted (or replaced) while its writer runs would lose every step
when the writer closes it, so each flush checks that the path still names the open file; if not,
the file is written again at its path from the open one (every committed step kept) and one line
on stderr says so.

API::

    w = TrajectoryWriter(path, layout: TrajLayout, compression="gzip", actor=0, flush_seconds=5.0)
    w = TrajectoryWriter.open_append(path, flush_seconds=5.0)        # resume: keeps growing
    w.append_fragment(obs, actions, rewards, terminated, truncated,
                      behaviour_logp, values, policy_version,
                      bootstrap_values=None) -> int  # steps added (T * N)
        # obs [T, N, *obs_shape], actions [T, N, *action_shape], the others [T, N];
        # policy_version: an int, or [T] / [T, N]; bootstrap_values None: NaN (not recorded)
    w.num_steps       # steps written + buffered
    w.committed       # steps written and vouched for by committed_steps
    cut_trajectory(f: h5py.File, steps) -> int   # shorten an open (non-SWMR) file; returns steps removed
    w.flush(); w.maybe_flush(now=None) -> bool; w.close()   # also a context manager
    held_committed_steps(path) -> int | None   # a file a writer of this process holds: its count, unopened
"""
from __future__ import annotations

import os
import sys
import threading
import weakref
from pathlib import Path

import h5py
import numpy as np

from hpcrl.io.errors import record_write_error
from hpcrl.io.h5format import APPEND_LIBVER, WRITE_LIBVER
from hpcrl.io.recovery import clear_write_flags
from hpcrl.io.schema import SCHEMA_VERSION, TRAJ_FIELDS, TrajLayout
from hpcrl.io.tables import (COMMITTED_STEPS, LIVE_GROUP, FlushTimer, TimedFlushFile, abandon_file, committed_length,
                             filter_kwargs, set_live_count, written_prefix)

CHUNK_BYTES = 1 << 18
LIVE_STEPS = "steps"
"""The trajectory file's live count: dataset ``committed/steps``."""
# policy_version is written last: a step whose policy_version is on disk has all its fields there
WRITE_ORDER = tuple(f.name for f in TRAJ_FIELDS if f.name != "policy_version") + ("policy_version",)

# the writers of this process by path: the in-process runners (serial, sim) count a live actor's file from its
# writer, because opening it again costs HDF5, at the close, a scan of every object open in the process (a
# checkpoint of a simulated job with 2,048 open files spent minutes there)
_HELD: "weakref.WeakValueDictionary[str, TrajectoryWriter]" = weakref.WeakValueDictionary()
_HELD_LOCK = threading.Lock()


def held_committed_steps(path: str | Path) -> int | None:
    """The committed steps of the file at ``path`` when a writer of this process holds it (and the path still
    names its file), else None: then read the file."""
    path = Path(path)
    with _HELD_LOCK:
        writer = _HELD.get(str(path.resolve()))
    if writer is None or writer.failed is not None or _identity(path) != writer._identity:
        return None
    return writer.committed


def _chunk_rows(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    row = max(1, dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
    return int(min(65536, max(64, CHUNK_BYTES // row)))


def _create_field(f: h5py.File, fld, layout: TrajLayout, rows: int, kw: dict) -> None:
    """One dataset of ``fld`` with ``rows`` rows of its fill value (NaN or -1)."""
    dtype, shape = layout.field_dtype(fld), layout.field_shape(fld)
    fill = np.nan if dtype.kind == "f" else -1
    d = f.create_dataset(fld.name, shape=(rows, *shape), maxshape=(None, *shape), dtype=dtype,
                         chunks=(_chunk_rows(dtype, shape), *shape), fillvalue=fill, **kw)
    d.attrs["units"] = fld.unit
    d.attrs["description"] = fld.meaning


def cut_trajectory(f: h5py.File, steps: int) -> int:
    """Shorten a trajectory file opened for writing (not in SWMR mode) to ``steps`` (never lengthens),
    dropping uncommitted steps too; returns the committed steps removed. Fields an older file lacks
    are left out."""
    names = [name for name in WRITE_ORDER if name in f]
    lengths = [f[name].shape[0] for name in names]
    have = committed_length(f, lengths, COMMITTED_STEPS)
    if COMMITTED_STEPS not in f.attrs:  # older file: trailing steps that never got their policy_version
        have = written_prefix({"policy_version": f["policy_version"][:have]})
    steps = min(steps, have)
    for name in names:
        if f[name].shape[0] != steps:
            f[name].resize(steps, axis=0)
    set_live_count(f, LIVE_STEPS, steps)
    f.attrs[COMMITTED_STEPS] = np.int64(steps)
    return have - steps


class TrajectoryWriter(TimedFlushFile):
    def __init__(self, path: str | Path, layout: TrajLayout, compression: str = "gzip", actor: int = 0,
                 flush_seconds: float = 5.0, *, _file: h5py.File | None = None):
        self.path = Path(path)
        self.flush_seconds = flush_seconds
        if _file is None:
            kw = filter_kwargs(compression)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            f = h5py.File(self.path, "w", libver=WRITE_LIBVER, locking=False)
            try:
                f.attrs["schema_version"] = SCHEMA_VERSION
                f.attrs["actor"] = actor
                for k, v in layout.to_attrs().items():
                    f.attrs[k] = v
                set_live_count(f, LIVE_STEPS, 0)
                f.attrs[COMMITTED_STEPS] = np.int64(0)
                for fld in TRAJ_FIELDS:
                    _create_field(f, fld, layout, 0, kw)
                f.flush()
                f.swmr_mode = True  # see hpcrl.io.run_file for why SWMR
            except (OSError, RuntimeError) as exc:  # disk full at creation: one line, no destructor noise
                abandon_file(f)
                raise record_write_error(self.path, exc) from None
            _file = f
        self.file = _file
        self.layout = layout
        self.actor = int(self.file.attrs["actor"])
        # kept open: a temporary h5py object closed in its destructor would swallow a failed write
        self._datasets = {name: self.file[name] for name in WRITE_ORDER}
        self._live = self.file[f"{LIVE_GROUP}/{LIVE_STEPS}"]
        self._on_disk = committed_length(self.file, (d.shape[0] for d in self._datasets.values()), COMMITTED_STEPS)
        self._buffer: dict[str, list[np.ndarray]] = {f.name: [] for f in TRAJ_FIELDS}
        self._pending = 0
        self._timer = FlushTimer(flush_seconds)
        self._identity = _identity(self.path)
        self._held_key = str(self.path.resolve())
        with _HELD_LOCK:
            _HELD[self._held_key] = self

    @classmethod
    def open_append(cls, path: str | Path, flush_seconds: float = 5.0) -> "TrajectoryWriter":
        path = Path(path)
        clear_write_flags(path)  # left set by a killed writer
        f = h5py.File(path, "a", libver=APPEND_LIBVER, locking=False)
        try:
            layout = TrajLayout.from_attrs(f.attrs)
            cut_trajectory(f, f[WRITE_ORDER[0]].shape[0])  # drop what a killed writer left uncommitted
            rows = int(f.attrs.get(COMMITTED_STEPS, f["policy_version"].shape[0]))
            for fld in TRAJ_FIELDS:  # a field an older hpcrl did not write: NaN (not recorded) up to here
                if fld.name not in f:
                    _create_field(f, fld, layout, rows, filter_kwargs(f["rewards"].compression or "none"))
            f.swmr_mode = True
        except (OSError, RuntimeError) as exc:
            abandon_file(f)
            raise record_write_error(path, exc) from None
        return cls(path, layout, flush_seconds=flush_seconds, _file=f)

    @property
    def num_steps(self) -> int:
        return self._on_disk + self._pending

    @property
    def committed(self) -> int:
        """Steps written and vouched for by committed_steps (the buffer not included)."""
        return self._on_disk

    def append_fragment(self, obs, actions, rewards, terminated, truncated, behaviour_logp, values,
                        policy_version, bootstrap_values=None) -> int:
        """Buffer one [T, N, ...] fragment, flattened time-major; returns T * N."""
        self.check_writable()
        rewards = np.asarray(rewards)
        if rewards.ndim != 2:
            raise ValueError(f"rewards must be [T, N], got shape {rewards.shape}")
        T, N = rewards.shape
        pv = np.asarray(policy_version)
        pv = np.broadcast_to(pv.reshape(T, 1) if pv.ndim == 1 else pv, (T, N))
        given = {"obs": obs, "actions": actions, "rewards": rewards, "terminated": terminated,
                 "truncated": truncated, "behaviour_logp": behaviour_logp, "values": values,
                 "bootstrap_values": np.full((T, N), np.nan) if bootstrap_values is None else bootstrap_values,
                 "policy_version": pv, "env_index": np.broadcast_to(np.arange(N), (T, N))}
        for fld in TRAJ_FIELDS:
            a = np.asarray(given[fld.name])
            shape = (T, N, *self.layout.field_shape(fld))
            if a.shape != shape:
                raise ValueError(f"{self.path.name}: {fld.name} must have shape {shape} (T, N, ...), got {a.shape}")
            self._buffer[fld.name].append(a.reshape(T * N, *shape[2:]).astype(self.layout.field_dtype(fld)))
        self._pending += T * N
        return T * N

    def flush(self) -> None:
        """Write buffered steps (resize, write, flush every dataset, then raise committed_steps) and flush the file.

        Raises RecordWriteError (one line) if the file cannot be written.
        """
        with self._writing():
            if self._pending:
                start, stop = self._on_disk, self._on_disk + self._pending
                for d in self._datasets.values():
                    d.resize(stop, axis=0)
                for name, d in self._datasets.items():
                    d[start:stop] = np.concatenate(self._buffer[name])
                for d in self._datasets.values():
                    d.flush()  # the steps reach the file before the count that vouches for them
                self._live[0] = stop
                self._live.flush()
                self.file.attrs.modify(COMMITTED_STEPS, np.int64(stop))
                self._buffer = {f.name: [] for f in TRAJ_FIELDS}
                self._on_disk, self._pending = stop, 0
            self.file.flush()
            if _identity(self.path) != self._identity:
                self._write_again()

    def close(self) -> None:
        with _HELD_LOCK:
            if _HELD.get(self._held_key) is self:
                del _HELD[self._held_key]
        super().close()

    def _write_again(self) -> None:
        """The path no longer names the open file (deleted or replaced): copy the open file to the path and go
        on writing the copy, saying so in one line."""
        gone = "deleted" if not self.path.exists() else "replaced by another file"
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        steps = self._on_disk
        with h5py.File(tmp, "w", libver=WRITE_LIBVER, locking=False) as copy:  # not H5Ocopy: it fails on an
            for key, value in self.file.attrs.items():                        # SWMR file reopened for appending
                copy.attrs[key] = value
            for name, d in self._datasets.items():
                c = copy.create_dataset(name, shape=(steps, *d.shape[1:]), maxshape=d.maxshape, dtype=d.dtype,
                                        chunks=d.chunks, fillvalue=d.fillvalue, **filter_kwargs(d.compression or "none"))
                for key, value in d.attrs.items():
                    c.attrs[key] = value
                for lo in range(0, steps, d.chunks[0]):
                    c[lo:lo + d.chunks[0]] = d[lo:min(lo + d.chunks[0], steps)]
            set_live_count(copy, LIVE_STEPS, steps)
            copy.attrs[COMMITTED_STEPS] = np.int64(steps)
        # opened for appending before it takes the path: a reader in this process (the serial runner's checkpoint
        # counting steps) that opened the path in between would hold it read-only, and HDF5 then refuses the writer
        again = type(self).open_append(tmp, flush_seconds=self.flush_seconds)
        os.replace(tmp, self.path)
        self.file.close()
        self.file, self._datasets, self._live = again.file, again._datasets, again._live
        self._identity = _identity(self.path)
        print(f"hpcrl: actor {self.actor}: {self.path} was {gone} while the run went on; written again from the "
              f"open file ({self._on_disk:,} steps kept, none lost)", file=sys.stderr, flush=True)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
