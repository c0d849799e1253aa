"""Read a run's HDF5 record, also while it is being written or after its job was killed.

Files are opened read-only with ``locking=False`` and, where the format allows (every file
hpcrl writes), as SWMR readers: a file whose writer is running or was killed refuses a plain
open, and run.h5's ``trajectories/`` view reads actor files through the same access mode, so
an actor killed with its file open would make a plain open's view fail. A table is cut to
the rows all its columns have and that its ``committed_rows`` attribute vouches for (a
writer killed, or a disk filled, mid-flush leaves longer columns holding fill values); a
table from before that attribute also loses trailing rows whose required columns hold fill
values. A missing, truncated or foreign file raises :class:`RunFileError` with one line
naming the file and what is missing.

API::

    read_table(run_h5, name, columns=None) -> dict[str, np.ndarray]   # name in schema.TABLES
    read_attrs(run_h5) -> dict        # schema_version, hpcrl_version, created, start_unix, config_yaml, ...
    read_trajectory(traj_h5, fields=None) -> dict[str, np.ndarray]     # one actor's file, [steps, ...]
    read_trajectories(run_h5, fields=None) -> dict[str, np.ndarray]    # run.h5's view, [actors, steps, ...]
    read_row_counts(run_h5) -> dict[str, int]    # rows read_table would return, per table
    read_trajectory_steps(traj_h5) -> int        # steps read_trajectory would return
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
from hpcrl.io.tables import COMMITTED_ROWS, COMMITTED_STEPS, committed_length, written_prefix

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
    """Open read-only, as an SWMR reader where the file format allows it.

    A plain open comes first (HDF5 checks truncation only there); a file an SWMR writer has
    open, or left open when it was killed, is refused that way. A clean file is then reopened
    as an SWMR reader too, so that run.h5's trajectories/ view can open the files of killed actors.
    """
    try:
        f = h5py.File(path, "r", locking=False)
    except OSError as exc:
        if "already open for write" not in str(exc):
            raise
    else:
        f.close()
        try:
            return h5py.File(path, "r", swmr=True, locking=False)
        except OSError:  # an older file format (not written by hpcrl): plain is all there is
            return h5py.File(path, "r", locking=False)
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
    """One table of run.h5 as column -> 1-D array, cut to the rows every column of the table has
    and the ``committed_rows`` attribute vouches for."""
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
            n = table_rows(group, name)
            return {c: group[c][:n] for c in wanted}
        except (OSError, KeyError) as exc:
            raise _Transient(f"{f.filename}: table '{name}' cannot be read ({str(exc).splitlines()[0]})") from None


def table_rows(group: h5py.Group, name: str) -> int:
    """Rows of table ``name`` (an open group) that a reader may use: every column has them and
    ``committed_rows`` vouches for them (older files: no trailing rows of fill values)."""
    spec = TABLES[name]
    n = committed_length(group, (group[c.name].shape[0] for c in spec.columns if c.name in group))
    if COMMITTED_ROWS not in group.attrs:
        n = written_prefix({c.name: group[c.name][:n] for c in spec.columns if c.required and c.name in group})
    return n


def trajectory_steps(f: h5py.File) -> int:
    """Steps of an open trajectory file that a reader may use (as :func:`table_rows` for a table)."""
    n = committed_length(f, (f[k].shape[0] for k in TRAJ_FIELD_NAMES if k in f), COMMITTED_STEPS)
    if COMMITTED_STEPS not in f.attrs and "policy_version" in f:
        n = written_prefix({"policy_version": f["policy_version"][:n]})
    return n


def read_row_counts(run_h5: str | Path) -> dict[str, int]:
    """Rows a reader may use of every table in run.h5 (tables the file lacks are left out)."""
    return _retry(_read_row_counts, run_h5)


def _read_row_counts(run_h5):
    with _open(run_h5, "run") as f:
        try:
            return {name: table_rows(f[name], name) for name in TABLES if name in f}
        except (OSError, KeyError) as exc:
            raise _Transient(f"{f.filename}: tables cannot be read ({str(exc).splitlines()[0]})") from None


def read_trajectory_steps(traj_h5: str | Path) -> int:
    """Steps a reader may use of one actor's trajectory file."""
    return _retry(_read_trajectory_steps, traj_h5)


def _read_trajectory_steps(traj_h5):
    with _open(traj_h5, "trajectory") as f:
        try:
            return trajectory_steps(f)
        except (OSError, KeyError) as exc:
            raise _Transient(f"{f.filename}: trajectory data cannot be read ({str(exc).splitlines()[0]})") from None


def read_trajectory(traj_h5: str | Path, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """One actor's trajectory datasets, [steps, ...], cut to the steps every dataset has and the
    ``committed_steps`` attribute vouches for."""
    wanted = list(fields) if fields is not None else list(TRAJ_FIELD_NAMES)
    return _retry(_read_trajectory, traj_h5, wanted)


def _read_trajectory(traj_h5, wanted):
    with _open(traj_h5, "trajectory") as f:
        missing = [k for k in wanted if k not in f]
        if missing:
            raise RunFileError(f"{f.filename}: missing trajectory datasets {', '.join(missing)}")
        try:
            n = trajectory_steps(f)
            return {k: f[k][:n] for k in wanted}
        except (OSError, KeyError) as exc:
            raise _Transient(f"{f.filename}: trajectory data cannot be read ({str(exc).splitlines()[0]})") from None


def read_trajectories(run_h5: str | Path, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """run.h5's ``trajectories/`` view: field -> [num_actors, steps, ...], padded with NaN / -1
    (``policy_version >= 0`` marks real steps). Works while actors run and after they were killed."""
    wanted = list(fields) if fields is not None else list(TRAJ_FIELD_NAMES)
    return _retry(_read_trajectories, run_h5, wanted)


def _read_trajectories(run_h5, wanted):
    with _open(run_h5, "run") as f:
        if "trajectories" not in f:
            raise RunFileError(f"{f.filename}: no trajectories/ view (the run was created without a trajectory layout)")
        group = f["trajectories"]
        missing = [k for k in wanted if k not in group]
        if missing:
            raise RunFileError(f"{f.filename}: trajectories/ is missing {', '.join(missing)}")
        try:
            return {k: group[k][()] for k in wanted}
        except (OSError, KeyError) as exc:
            raise _Transient(f"{f.filename}: trajectories/ cannot be read ({str(exc).splitlines()[0]})") from None
