"""A table in an HDF5 file: a group of equal-length, resizable 1-D datasets, one per column.

Rows are buffered in memory by :meth:`Table.append` and reach the file only in
:meth:`Table.flush`: every column is resized and written, each column is flushed to the
file, and only then does the table's committed count grow to vouch for the new rows: the
one-element dataset ``committed/<table>`` beside the table (a reader that keeps the file open sees
it change after ``Dataset.refresh()``, which h5py does not offer for attributes), then the group's
``committed_rows`` attribute (for readers of a closed file; files from before the dataset have
only the attribute). A job killed (or a disk filled) mid-flush can leave columns longer than
``committed_rows``, holding fill values; readers and :meth:`Table.open` use
``min(committed_rows, shortest column)`` rows.

A write that fails (disk full, quota, I/O error) is fatal: the writer built on
:class:`TimedFlushFile` raises :class:`~hpcrl.io.errors.RecordWriteError` (one line) from
that flush, detaches its file (:func:`abandon_file`) and raises the same error at every
later call, so the job dies instead of running on with a record that silently stopped.

API::

    Table.create(parent: h5py.Group, spec: TableSpec, compression: str = "gzip") -> Table
    Table.open(parent: h5py.Group, spec: TableSpec) -> Table     # existing group, resume
    table.append(rows)     # dict column -> scalar or 1-D array (equal lengths), or list of dicts
    len(table)             # rows on disk + rows buffered
    table.pending          # rows buffered
    table.flush()          # write the buffer (h5py-level; RunFile.flush also flushes the file)
    table.read() -> dict[str, np.ndarray]   # disk + buffer
    committed_length(node, lengths) -> int  # rows a reader may use (committed_rows attribute, shortest column)
    set_live_count(parent, key, value)      # parent/committed/<key>, the one-element count (created if missing)
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np

from hpcrl.errors import ConfigError
from hpcrl.io.errors import RecordWriteError, record_write_error
from hpcrl.io.schema import Column, TableSpec, fill_value

CHUNK_ROWS = 4096
COMPRESSIONS = ("gzip", "lzf", "none")
COMMITTED_ROWS = "committed_rows"
"""Attribute of a table group: rows known to be fully written (readers use no more)."""
COMMITTED_STEPS = "committed_steps"
"""Root attribute of a trajectory file: steps known to be fully written."""
LIVE_GROUP = "committed"
"""Group of one-element int64 datasets: ``committed/<table>`` (run.h5), ``committed/steps`` (a trajectory file)."""


def set_live_count(parent: h5py.Group, key: str, value: int) -> h5py.Dataset:
    """Write ``value`` into ``parent/committed/<key>`` and flush it. Created when missing (only possible
    before SWMR starts: at creation, resume and rollback). A reader that keeps the file open sees the
    new value after ``refresh()``; the caller sets the matching attribute after this."""
    d = parent.get(f"{LIVE_GROUP}/{key}")
    if d is None:
        group = parent.require_group(LIVE_GROUP)
        group.attrs["description"] = ("rows (steps) fully written per table (trajectory file: 'steps'); "
                                      "a reader that keeps the file open refreshes these datasets")
        d = group.create_dataset(key, data=np.array([value], np.int64))
    else:
        d[0] = value
    d.flush()
    return d


def committed_length(node: h5py.Group, lengths: Iterable[int], attr: str = COMMITTED_ROWS) -> int:
    """Rows of ``node`` a reader may use: the shortest length, capped by the committed attribute if present
    (files written before the attribute existed have none)."""
    n = min(lengths, default=0)
    if attr in node.attrs:
        n = min(n, int(node.attrs[attr]))
    return n


def written_prefix(required: Mapping[str, np.ndarray]) -> int:
    """Rows up to the last one whose required columns all hold real values, not their fill value
    (for tables written before committed_rows existed: a cut-short flush left fill rows at the end)."""
    n = min((len(a) for a in required.values()), default=0)
    if not required or n == 0:
        return n
    unwritten = np.zeros(n, bool)
    for a in required.values():
        unwritten |= np.isnan(a[:n]) if a.dtype.kind == "f" else (a[:n] == fill_value(a.dtype))
    real = np.flatnonzero(~unwritten)
    return int(real[-1]) + 1 if len(real) else 0


def abandon_file(f: h5py.File) -> None:
    """Close a file whose write failed without writing anything more to it.

    HDF5 still holds the failed chunks and metadata and would retry writing them at every
    close: h5py's destructors then print each failure ("Exception ignored", thousands of lines)
    and HDF5's exit handler can crash the process. Pointing the file's descriptor at /dev/null
    first makes those writes vanish, so the close succeeds and the file keeps what reached the
    disk before the failure (sec2 driver, h5py's default; other drivers are just closed).
    """
    try:
        if f.id.valid and f.driver == "sec2":
            fd = f.id.get_vfd_handle()
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
    except (OSError, RuntimeError, ValueError):
        pass
    try:
        if f.id.valid:
            f.close()
    except (OSError, RuntimeError, ValueError):
        pass


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
    """Shared ending of the record's writers: timed flushes, fatal write failures, ``close`` (flushes first), ``with``.

    Subclasses set ``self.file`` (an open h5py.File), ``self.path`` and ``self._timer``, define
    ``flush`` and do every write inside ``with self._writing():``.
    """

    file: h5py.File
    path: Path
    _timer: FlushTimer
    failed: RecordWriteError | None = None
    """The error that ended this writer (then its file is closed), or None."""

    def flush(self) -> None:
        raise NotImplementedError

    def check_writable(self) -> None:
        """Raise the RecordWriteError that ended this writer, if one did."""
        if self.failed is not None:
            raise self.failed

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Run HDF5 writes; the first failure becomes a one-line RecordWriteError and ends the writer."""
        self.check_writable()
        try:
            yield
        except (OSError, RuntimeError) as exc:
            err = exc if isinstance(exc, RecordWriteError) else record_write_error(self.path, exc)
            self.failed = err
            abandon_file(self.file)
            raise err from None

    def maybe_flush(self, now: float | None = None) -> bool:
        """Flush if the flush interval passed since the last timed flush (now: any clock, default monotonic)."""
        if self._timer.due(now):
            self.flush()
            return True
        return False

    def close(self) -> None:
        """Flush and close; after a write failure (the file is closed already) do nothing."""
        if self.failed is None and self.file.id.valid:
            self.flush()
            with self._writing():
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
        # kept open: a temporary h5py object closed in its destructor would swallow a failed write
        self._columns = {c.name: group[c.name] for c in spec.columns}
        self._buffer: dict[str, list[np.ndarray]] = {c.name: [] for c in spec.columns}
        self.pending = 0
        self._on_disk = committed_length(group, (d.shape[0] for d in self._columns.values()))
        self._live = group.parent.get(f"{LIVE_GROUP}/{spec.name}")
        """The one-element count dataset (None in a file from before it, until open() adds it)."""

    @classmethod
    def create(cls, parent: h5py.Group, spec: TableSpec, compression: str = "gzip") -> "Table":
        group = parent.create_group(spec.name)
        group.attrs["description"] = spec.meaning
        group.attrs["columns"] = _text_list(spec.names)
        for c in spec.columns:
            _column(group, c, 0, compression)
        set_live_count(parent, spec.name, 0)
        group.attrs[COMMITTED_ROWS] = np.int64(0)
        return cls(group, spec)

    @classmethod
    def open(cls, parent: h5py.Group, spec: TableSpec, compression: str = "gzip") -> "Table":
        """The table of a file being resumed. An optional column added to the schema after the file was made is
        added, holding its fill value in the rows before (a required one missing is a KeyError)."""
        missing = [c for c in spec.columns if f"{spec.name}/{c.name}" not in parent]
        if spec.name not in parent or any(c.required for c in missing):
            raise KeyError(f"table {spec.name!r} is missing columns: {', '.join(c.name for c in missing) or 'all'}")
        group = parent[spec.name]
        for c in missing:
            _column(group, c, max(group[name].shape[0] for name in spec.names if name in group), compression)
        if missing:
            group.attrs["columns"] = _text_list(spec.names)
        table = cls(group, spec)
        # a kill or a failed write mid-flush leaves columns longer than the committed rows: cut them
        # (the file is not in SWMR mode yet, so the attribute can be created for older files)
        rows = table._on_disk
        if COMMITTED_ROWS not in table.group.attrs:
            rows = written_prefix({c.name: table._columns[c.name][:rows] for c in spec.columns if c.required})
        table.cut(rows)
        return table

    def cut(self, rows: int) -> int:
        """Shorten the table on disk to ``rows`` (never lengthens; drops the buffer); returns rows removed.
        Only for a file not in SWMR mode (resume, truncation to a checkpoint)."""
        rows = min(rows, self._on_disk)
        removed = self._on_disk - rows
        for d in self._columns.values():
            if d.shape[0] != rows:
                d.resize(rows, axis=0)
        self._live = set_live_count(self.group.parent, self.spec.name, rows)
        self.group.attrs[COMMITTED_ROWS] = np.int64(rows)
        self._on_disk, self.pending = rows, 0
        self._buffer = {c.name: [] for c in self.spec.columns}
        return removed

    def __len__(self) -> int:
        return self._on_disk + self.pending

    @property
    def committed(self) -> int:
        """Rows written and vouched for by committed_rows (the buffer not included)."""
        return self._on_disk

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
        """Write buffered rows: resize and write every column, flush them, then raise committed_rows.

        HDF5 errors propagate (the writer owning the file turns them into RecordWriteError).
        """
        if not self.pending:
            return
        data = self._buffered()
        start, stop = self._on_disk, self._on_disk + self.pending
        for d in self._columns.values():
            d.resize(stop, axis=0)
        for name, d in self._columns.items():
            d[start:stop] = data[name]
        for d in self._columns.values():
            d.flush()  # the rows reach the file before the count that vouches for them
        if self._live is not None:
            self._live[0] = stop
            self._live.flush()
        self.group.attrs.modify(COMMITTED_ROWS, np.int64(stop))
        self._on_disk = stop
        self.pending = 0
        self._buffer = {c.name: [] for c in self.spec.columns}

    def read_written(self, names: Sequence[str], start: int = 0) -> dict[str, np.ndarray]:
        """Columns ``names`` of the committed rows from ``start`` on (the buffer not included)."""
        return {name: self._columns[name][start:self._on_disk] for name in names}

    def read(self) -> dict[str, np.ndarray]:
        """All rows, written and buffered."""
        buf = self._buffered()
        return {name: np.concatenate([d[: self._on_disk], buf[name]]) for name, d in self._columns.items()}


def _column(group: h5py.Group, c, rows: int, compression: str) -> None:
    """Column ``c``'s dataset in a table's ``group``: ``rows`` rows of its fill value, extendable."""
    d = group.create_dataset(c.name, shape=(rows,), maxshape=(None,), dtype=np.dtype(c.dtype), chunks=(CHUNK_ROWS,),
                             fillvalue=c.fill, **filter_kwargs(compression))
    d.attrs["units"] = c.unit
    d.attrs["description"] = c.meaning
    if c.codes:
        d.attrs["codes"] = _text_list(c.codes)
