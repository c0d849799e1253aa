"""One actor's trajectory file, ``traj/actor-NNNNN.h5``: every step it sampled.

Datasets (schema.TRAJ_FIELDS) are ``[steps, *per_step_shape]``, resizable along axis 0,
chunked, compressed. A fragment ``[T, N, ...]`` (T time steps of N environments) is
flattened **time-major**: step ``t * N + n`` is time ``t`` of environment ``n``; the
``env_index`` dataset repeats ``0..N-1`` accordingly. Fragments are buffered in memory and
written on :meth:`flush` (all datasets resized, then written), so a killed actor leaves the
file as it was at its last flush.

API::

    w = TrajectoryWriter(path, layout: TrajLayout, compression="gzip", actor=0, flush_seconds=5.0)
    w = TrajectoryWriter.open_append(path, flush_seconds=5.0)        # resume: keeps growing
    w.append_fragment(obs, actions, rewards, terminated, truncated,
                      behaviour_logp, values, policy_version) -> int  # steps added (T * N)
        # obs [T, N, *obs_shape], actions [T, N, *action_shape], the others [T, N];
        # policy_version: an int, or [T] / [T, N]
    w.num_steps       # steps written + buffered
    w.flush(); w.maybe_flush(now=None) -> bool; w.close()   # also a context manager
"""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from hpcrl.io.recovery import clear_write_flags
from hpcrl.io.schema import SCHEMA_VERSION, TRAJ_FIELDS, TrajLayout
from hpcrl.io.tables import FlushTimer, TimedFlushFile, filter_kwargs

CHUNK_BYTES = 1 << 18


def _chunk_rows(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    row = max(1, dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
    return int(min(65536, max(64, CHUNK_BYTES // row)))


class TrajectoryWriter(TimedFlushFile):
    def __init__(self, path: str | Path, layout: TrajLayout, compression: str = "gzip", actor: int = 0,
                 flush_seconds: float = 5.0, *, _file: h5py.File | None = None):
        self.path = Path(path)
        self.flush_seconds = flush_seconds
        if _file is None:
            kw = filter_kwargs(compression)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            f = h5py.File(self.path, "w", libver="latest", locking=False)
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["actor"] = actor
            for k, v in layout.to_attrs().items():
                f.attrs[k] = v
            for fld in TRAJ_FIELDS:
                dtype, shape = layout.field_dtype(fld), layout.field_shape(fld)
                fill = np.nan if dtype.kind == "f" else -1
                d = f.create_dataset(fld.name, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype,
                                     chunks=(_chunk_rows(dtype, shape), *shape), fillvalue=fill, **kw)
                d.attrs["units"] = fld.unit
                d.attrs["description"] = fld.meaning
            f.flush()
            f.swmr_mode = True  # see hpcrl.io.run_file for why SWMR
            _file = f
        self.file = _file
        self.layout = layout
        self.actor = int(self.file.attrs["actor"])
        self._on_disk = min(self.file[f.name].shape[0] for f in TRAJ_FIELDS)
        self._buffer: dict[str, list[np.ndarray]] = {f.name: [] for f in TRAJ_FIELDS}
        self._pending = 0
        self._timer = FlushTimer(flush_seconds)

    @classmethod
    def open_append(cls, path: str | Path, flush_seconds: float = 5.0) -> "TrajectoryWriter":
        clear_write_flags(path)  # left set by a killed writer
        f = h5py.File(path, "a", libver="latest", locking=False)
        layout = TrajLayout.from_attrs(f.attrs)
        n = min(f[fld.name].shape[0] for fld in TRAJ_FIELDS)
        for fld in TRAJ_FIELDS:  # equal lengths (a writer killed mid-flush)
            if f[fld.name].shape[0] != n:
                f[fld.name].resize(n, axis=0)
        f.swmr_mode = True
        return cls(path, layout, flush_seconds=flush_seconds, _file=f)

    @property
    def num_steps(self) -> int:
        return self._on_disk + self._pending

    def append_fragment(self, obs, actions, rewards, terminated, truncated, behaviour_logp, values,
                        policy_version) -> int:
        """Buffer one [T, N, ...] fragment, flattened time-major; returns T * N."""
        rewards = np.asarray(rewards)
        if rewards.ndim != 2:
            raise ValueError(f"rewards must be [T, N], got shape {rewards.shape}")
        T, N = rewards.shape
        pv = np.asarray(policy_version)
        pv = np.broadcast_to(pv.reshape(T, 1) if pv.ndim == 1 else pv, (T, N))
        given = {"obs": obs, "actions": actions, "rewards": rewards, "terminated": terminated,
                 "truncated": truncated, "behaviour_logp": behaviour_logp, "values": values,
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
        """Write buffered steps (resize all datasets, then write) and flush the file."""
        if self._pending:
            start, stop = self._on_disk, self._on_disk + self._pending
            for fld in TRAJ_FIELDS:
                self.file[fld.name].resize(stop, axis=0)
            for fld in TRAJ_FIELDS:
                self.file[fld.name][start:stop] = np.concatenate(self._buffer[fld.name])
            self._buffer = {f.name: [] for f in TRAJ_FIELDS}
            self._on_disk, self._pending = stop, 0
        self.file.flush()
