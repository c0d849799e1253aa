"""A table in an HDF5 file: a group of equal-length, resizable 1-D datasets, one per column.

Rows are buffered in memory by :meth:`Table.append` and reach the file only in
:meth:`Table.flush`, which resizes every column first and then writes them, so the columns
on disk always have equal lengths after a flush and HDF5 metadata is touched only there
(a job killed between flushes leaves the file as it was at the last flush).

API::

    Table.create(parent: h5py.Group, spec: TableSpec, compression: str = "gzip") -> Table
    Table.open(parent: h5py.Group, spec: TableSpec) -> Table     # existing group, resume
    table.append(rows)     # dict column -> scalar or 1-D array (equal lengths), or list of dicts
    len(table)             # rows on disk + rows buffered
    table.pending          # rows buffered
    table.flush()          # write the buffer (h5py-level; RunFile.flush also flushes the file)
    table.read() -> dict[str, np.ndarray]   # disk + buffer
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import h5py
import numpy as np

from hpcrl.errors import ConfigError
from hpcrl.io.schema import Column, TableSpec

CHUNK_ROWS = 4096
COMPRESSIONS = ("gzip", "lzf", "none")


def filter_kwargs(compression: str) -> dict:
    """h5py create_dataset keywords for cfg.io.compression."""
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    if compression == "lzf":
        return {"compression": "lzf", "shuffle": True}
    if compression == "none":
        return {}
    raise ConfigError(f"io.compression: {compression!r} is not one of {', '.join(COMPRESSIONS)}")


class FlushTimer:
    """Says when ``seconds`` have passed on the caller's clock (any clock, used consistently)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._last: float | None = None

    def due(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if self._last is None:
            self._last = now
        if now - self._last >= self.seconds:
            self._last = now
            return True
        return False


class TimedFlushFile:
    """Shared ending of the record's writers: timed flushes, ``close`` (flushes first), ``with``.

    Subclasses set ``self.file`` (an open h5py.File) and ``self._timer`` and define ``flush``.
    """

    file: h5py.File
    _timer: FlushTimer

    def flush(self) -> None:
        raise NotImplementedError

    def maybe_flush(self, now: float | None = None) -> bool:
        """Flush if the flush interval passed since the last timed flush (now: any clock, default monotonic)."""
        if self._timer.due(now):
            self.flush()
            return True
        return False

    def close(self) -> None:
        if self.file.id.valid:
            self.flush()
            self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _text_list(values: Sequence[str]) -> np.ndarray:
    return np.array([v.encode() for v in values], dtype=h5py.string_dtype("ascii"))


class Table:
    def __init__(self, group: h5py.Group, spec: TableSpec):
        self.group = group
        self.spec = spec
        self._buffer: dict[str, list[np.ndarray]] = {c.name: [] for c in spec.columns}
        self.pending = 0
        self._on_disk = min((group[c.name].shape[0] for c in spec.columns), default=0)

    @classmethod
    def create(cls, parent: h5py.Group, spec: TableSpec, compression: str = "gzip") -> "Table":
        group = parent.create_group(spec.name)
        group.attrs["description"] = spec.meaning
        group.attrs["columns"] = _text_list(spec.names)
        kw = filter_kwargs(compression)
        for c in spec.columns:
            d = group.create_dataset(c.name, shape=(0,), maxshape=(None,), dtype=np.dtype(c.dtype),
                                     chunks=(CHUNK_ROWS,), fillvalue=c.fill, **kw)
            d.attrs["units"] = c.unit
            d.attrs["description"] = c.meaning
            if c.codes:
                d.attrs["codes"] = _text_list(c.codes)
        return cls(group, spec)

    @classmethod
    def open(cls, parent: h5py.Group, spec: TableSpec) -> "Table":
        missing = [c.name for c in spec.columns if f"{spec.name}/{c.name}" not in parent]
        if spec.name not in parent or missing:
            raise KeyError(f"table {spec.name!r} is missing columns: {', '.join(missing) or 'all'}")
        table = cls(parent[spec.name], spec)
        # a kill between resizes of an older writer could leave unequal lengths: cut to the shortest
        for c in spec.columns:
            if table.group[c.name].shape[0] != table._on_disk:
                table.group[c.name].resize(table._on_disk, axis=0)
        return table

    def __len__(self) -> int:
        return self._on_disk + self.pending

    def append(self, rows: Mapping[str, object] | Sequence[Mapping[str, object]]) -> int:
        """Buffer rows; returns how many. Unknown columns and missing required columns raise ValueError."""
        if not isinstance(rows, Mapping):
            rows = list(rows)
            if not rows:
                return 0
            rows = {k: [r[k] for r in rows] for k in rows[0]}
        unknown = set(rows) - set(self.spec.names)
        if unknown:
            raise ValueError(f"table {self.spec.name!r}: unknown columns {sorted(unknown)}; columns: {', '.join(self.spec.names)}")
        arrays = {k: np.atleast_1d(np.asarray(v)) for k, v in rows.items()}
        lengths = {k: a.shape[0] for k, a in arrays.items()}
        n = max(lengths.values(), default=0)
        bad = {k: m for k, m in lengths.items() if m not in (1, n) or arrays[k].ndim != 1}
        if bad:
            raise ValueError(f"table {self.spec.name!r}: columns must be scalars or 1-D of one length {n}; got {bad}")
        missing = [c.name for c in self.spec.columns if c.required and c.name not in arrays]
        if missing:
            raise ValueError(f"table {self.spec.name!r}: required column {missing[0]!r} missing")
        converted = {c.name: (self._convert(c, arrays[c.name], n) if c.name in arrays
                              else np.full(n, c.fill, dtype=np.dtype(c.dtype))) for c in self.spec.columns}
        for name, col in converted.items():  # only now: a bad call leaves the buffer untouched
            self._buffer[name].append(col)
        self.pending += n
        return n

    @staticmethod
    def _convert(c: Column, a: np.ndarray, n: int) -> np.ndarray:
        dtype = np.dtype(c.dtype)
        if dtype.kind == "S" and a.dtype.kind == "U":
            a = np.char.encode(a, "utf-8")
        return np.broadcast_to(a.astype(dtype, copy=False), (n,)).copy()

    def _buffered(self) -> dict[str, np.ndarray]:
        return {c.name: (np.concatenate(self._buffer[c.name]) if self._buffer[c.name]
                         else np.empty(0, np.dtype(c.dtype))) for c in self.spec.columns}

    def flush(self) -> None:
        """Write buffered rows: resize every column, then write them."""
        if not self.pending:
            return
        data = self._buffered()
        start, stop = self._on_disk, self._on_disk + self.pending
        for c in self.spec.columns:
            self.group[c.name].resize(stop, axis=0)
        for c in self.spec.columns:
            self.group[c.name][start:stop] = data[c.name]
        self._on_disk = stop
        self.pending = 0
        self._buffer = {c.name: [] for c in self.spec.columns}

    def read(self) -> dict[str, np.ndarray]:
        """All rows, written and buffered."""
        buf = self._buffered()
        return {c.name: np.concatenate([self.group[c.name][: self._on_disk], buf[c.name]]) for c in self.spec.columns}
