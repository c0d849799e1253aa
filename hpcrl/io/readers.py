"""Read a run's HDF5 record, also while it is being written or after its job was killed.

Files are opened read-only with ``locking=False``, as SWMR readers when a writer has them
open or was killed (the writers use SWMR and flush whole tables at once; see
:mod:`hpcrl.io.run_file`), columns of a table are cut to their shortest length, and a
missing, truncated or foreign file raises :class:`RunFileError` with one line naming the
file and what is missing.

API::

    read_table(run_h5, name, columns=None) -> dict[str, np.ndarray]   # name in schema.TABLES
    read_attrs(run_h5) -> dict        # schema_version, hpcrl_version, created, start_unix, config_yaml, ...
    read_trajectory(traj_h5, fields=None) -> dict[str, np.ndarray]     # one actor's file, [steps, ...]
    open_run_file(path) -> h5py.File  # read-only, checked; close it yourself (or use `with`)
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from hpcrl.io.errors import RunFileError
from hpcrl.io.recovery import is_truncated
from hpcrl.io.schema import RUN_FILE, SCHEMA_VERSION, TABLES, TRAJ_FIELD_NAMES

_RETRIES = 5


class _Transient(Exception):
    """A read that may succeed when retried (the writer was flushing); carries the final message."""


def _retry(read, *args):
    """Run read(*args); on a transient failure retry a few times, then raise its one-line RunFileError."""
    for attempt in range(_RETRIES):
        try:
            return read(*args)
        except _Transient as exc:
            if attempt == _RETRIES - 1:
                raise RunFileError(str(exc)) from None
            time.sleep(0.1 * (attempt + 1))


def _open_h5(path: Path) -> h5py.File:
    """A plain read-only open (HDF5 checks truncation); a file an SWMR writer has open, or left
    open when it was killed, is refused that way and opened as an SWMR reader instead."""
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as exc:
        if "already open for write" not in str(exc):
            raise
    if is_truncated(path):
        raise OSError("truncated file: the superblock's end of file lies beyond its size")
    return h5py.File(path, "r", swmr=True, locking=False)


def _open(path: str | Path, kind: str) -> h5py.File:
    """Open read-only with the checks; OSError while opening is transient (a writer may be flushing)."""
    path = Path(path)
    if path.is_dir():
        path = path / RUN_FILE
    if not path.is_file():
        raise RunFileError(f"{path}: no such file (expected an hpcrl {kind} file)")
    try:
        f = _open_h5(path)
    except (OSError, ValueError) as exc:
        why = "empty file" if path.stat().st_size == 0 else "truncated or not HDF5"
        final = "signature not found" in str(exc)  # truncation can be a writer mid-flush: retried
        raise (RunFileError if final else _Transient)(f"{path}: cannot be read as an hpcrl {kind} file ({why}: {str(exc).splitlines()[0]})") from None
    if "schema_version" not in f.attrs:
        f.close()
        raise RunFileError(f"{path}: not an hpcrl {kind} file (no schema_version attribute)")
    version = int(f.attrs["schema_version"])
    if version > SCHEMA_VERSION:
        f.close()
        raise RunFileError(f"{path}: schema_version {version} is newer than this reader's {SCHEMA_VERSION}; upgrade hpcrl")
    return f


def open_run_file(path: str | Path) -> h5py.File:
    """run.h5 (or a run directory) opened read-only after the checks above."""
    return _retry(_open, path, "run")


def read_attrs(run_h5: str | Path) -> dict:
    return _retry(_read_attrs, run_h5)


def _read_attrs(run_h5):
    with _open(run_h5, "run") as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}


def read_table(run_h5: str | Path, name: str, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """One table of run.h5 as column -> 1-D array, all cut to the shortest column."""
    if name not in TABLES:
        raise RunFileError(f"no table {name!r} in the hpcrl schema; tables: {', '.join(TABLES)}")
    wanted = list(columns) if columns is not None else list(TABLES[name].names)
    return _retry(_read_table, run_h5, name, wanted)


def _read_table(run_h5, name, wanted):
    with _open(run_h5, "run") as f:
        if name not in f:
            raise RunFileError(f"{f.filename}: table '{name}' is missing")
        group = f[name]
        missing = [c for c in wanted if c not in group]
        if missing:
            raise RunFileError(f"{f.filename}: table '{name}' is missing columns {', '.join(missing)}")
        try:
            n = min((group[c].shape[0] for c in wanted), default=0)
            return {c: group[c][:n] for c in wanted}
        except (OSError, KeyError) as exc:
            raise _Transient(f"{f.filename}: table '{name}' cannot be read ({str(exc).splitlines()[0]})") from None


def read_trajectory(traj_h5: str | Path, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """One actor's trajectory datasets, [steps, ...], cut to the shortest."""
    wanted = list(fields) if fields is not None else list(TRAJ_FIELD_NAMES)
    return _retry(_read_trajectory, traj_h5, wanted)


def _read_trajectory(traj_h5, wanted):
    with _open(traj_h5, "trajectory") as f:
        missing = [k for k in wanted if k not in f]
        if missing:
            raise RunFileError(f"{f.filename}: missing trajectory datasets {', '.join(missing)}")
        try:
            n = min((f[k].shape[0] for k in wanted), default=0)
            return {k: f[k][:n] for k in wanted}
        except (OSError, KeyError) as exc:
            raise _Transient(f"{f.filename}: trajectory data cannot be read ({str(exc).splitlines()[0]})") from None
