"""``nodes/node-RRRRR.h5``: a node's per-fragment rows, written on the node (``actors.reports: summary``).

With ``actors.reports: summary`` a node's report relay (world rank RRRRR) writes the ``actors`` and ``episodes``
rows of its node's fragments here, with run.h5's schema for those two tables, and sends rank 0 only their sums
(:class:`~hpcrl.runtime.messages.NodeSummary`); at hundreds of nodes those rows are tens of MB/s that rank 0 could
neither write nor take apart (docs/scaling.md). The file is written as run.h5 is (SWMR, appends only, rows buffered
until :meth:`NodeFile.flush`); the relay flushes before each message to rank 0 and puts the committed row counts in
it, so rank 0's checkpoint knows how far each node file went without reading it, and a resume cuts each node file
as it cuts run.h5 (:mod:`hpcrl.io.rollback`).

Times: the relay does not know when the run started, so its file's ``time`` columns count from the file's own
``start_unix`` attribute (its creation); readers that join the node files to run.h5's tables
(:func:`hpcrl.io.readers.read_table`) shift them by the difference of the two attributes.

API::

    NodeFile.create(run_dir, relay, compression="gzip", unix=time.time) -> NodeFile   # or open_append(path)
    node.now_of(unix_times) -> array   # Unix seconds -> this file's time
    node.append(table, columns)        # "actors" or "episodes"
    node.flush() -> {"actors": rows, "episodes": rows}   # committed rows after writing the buffer
    node_files(run_dir) -> {relay: path}
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import h5py
import numpy as np

from hpcrl.io.errors import record_write_error
from hpcrl.io.h5format import APPEND_LIBVER, WRITE_LIBVER
from hpcrl.io.recovery import clear_write_flags
from hpcrl.io.schema import SCHEMA_VERSION, TABLES, numbered_files
from hpcrl.io.tables import FlushTimer, Table, TimedFlushFile, abandon_file, filter_kwargs

NODE_DIR = "nodes"
NODE_TABLES = ("actors", "episodes")
"""The tables a node file holds: run.h5's rows of its node's fragments."""


def node_filename(relay: int) -> str:
    """Path of relay ``relay``'s node file, relative to the run directory."""
    return f"{NODE_DIR}/node-{relay:05d}.h5"


def node_files(run_dir: str | Path) -> dict[int, Path]:
    """Relay world rank -> its nodes/node-RRRRR.h5, for the files that exist, in rank order."""
    return numbered_files(Path(run_dir) / NODE_DIR, "node")


class NodeFile(TimedFlushFile):
    """One relay's node file, open for appending (one writer: the relay)."""

    def __init__(self, file: h5py.File) -> None:
        self.file = file
        self.path = Path(file.filename)
        self.start_unix = float(file.attrs["start_unix"])
        self._timer = FlushTimer(float("inf"))  # flushed by the relay, before each message
        self.tables = {name: Table.open(file, TABLES[name]) for name in NODE_TABLES}

    @classmethod
    def create(cls, run_dir: str | Path, relay: int, compression: str = "gzip",
               unix: Callable[[], float] = time.time) -> "NodeFile":
        """A new node file for relay ``relay`` (an earlier one of the same name, from a resumed run, is appended to)."""
        path = Path(run_dir) / node_filename(relay)
        if path.is_file():
            return cls.open_append(path)
        filter_kwargs(compression)
        path.parent.mkdir(parents=True, exist_ok=True)
        f = h5py.File(path, "w", libver=WRITE_LIBVER, locking=False)
        try:
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["start_unix"] = unix()
            f.attrs["relay"] = relay
            for name in NODE_TABLES:
                Table.create(f, TABLES[name], compression)
            f.flush()
            node = cls(f)
            f.swmr_mode = True
        except (OSError, RuntimeError) as exc:
            abandon_file(f)
            raise record_write_error(path, exc) from None
        return node

    @classmethod
    def open_append(cls, path: str | Path) -> "NodeFile":
        """A node file of a resumed run (cut back to the checkpoint first, by :func:`hpcrl.io.truncate_record`)."""
        path = Path(path)
        clear_write_flags(path)
        f = h5py.File(path, "a", libver=APPEND_LIBVER, locking=False)
        try:
            node = cls(f)
            f.flush()
            f.swmr_mode = True
        except (OSError, RuntimeError, KeyError) as exc:
            abandon_file(f)
            raise record_write_error(path, exc) from None
        return node

    def now_of(self, unix_times) -> np.ndarray:
        """Unix seconds as this file's times."""
        return np.asarray(unix_times, dtype=np.float64) - self.start_unix

    def append(self, table: str, columns: Mapping[str, object]) -> int:
        self.check_writable()
        return self.tables[table].append(columns)

    def flush(self) -> dict[str, int]:
        """Write the buffered rows and flush the file; the committed rows of each table."""
        with self._writing():
            for t in self.tables.values():
                t.flush()
            self.file.flush()
        return {name: t.committed for name, t in self.tables.items()}
