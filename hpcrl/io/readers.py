"""Read a run's HDF5 record, also while it is being written, after its job was killed, or damaged.

Files are opened read-only with ``locking=False``: plainly when no writer holds them, and as SWMR
readers when one does (a file whose writer is running or was killed refuses a plain open; run.h5's
``trajectories/`` view reads the actor files in run.h5's mode, so it is opened for SWMR when any
actor file is held). A table is cut to the rows all its columns have and that its
``committed_rows`` attribute vouches for (a writer killed, or a disk filled, mid-flush leaves
longer columns holding fill values); a table from before that attribute also loses trailing rows
whose required columns hold fill values. A missing, truncated or foreign file raises
:class:`RunFileError` with one line naming the file and what is missing.

With ``actors.reports: summary`` the ``actors`` and ``episodes`` rows of most fragments are in the run's
node files (``nodes/node-RRRRR.h5``, :mod:`hpcrl.io.node_file`), whose times count from their own
``start_unix``: :func:`read_table` joins them to run.h5's rows, shifted to run.h5's clock (node time
``t`` is run time ``t + node start_unix - run start_unix``) and sorted by time.

Damaged metadata never hangs a reader: a plain read fails at once, and an SWMR read (which HDF5
would retry for ever) is preceded by a check in a child process with a time limit
(:mod:`hpcrl.io.probe`). Either way :class:`RecordDamagedError` (a RunFileError) names the file
and the table or dataset in one line; the other tables still read. Reading never writes.

API::

    read_table(run_h5, name, columns=None) -> dict[str, np.ndarray]   # name in schema.TABLES; actors and
        # episodes: run.h5's rows and the node files', by time
    read_attrs(run_h5) -> dict        # schema_version, hpcrl_version, created, start_unix, config_yaml, ...
    read_trajectory(traj_h5, fields=None) -> dict[str, np.ndarray]     # one actor's file, [steps, ...]
    read_trajectories(run_h5, fields=None) -> dict[str, np.ndarray]    # run.h5's view, [actors, steps, ...]
    read_row_counts(run_h5) -> dict[str, int]    # rows of each table in run.h5 (node files' not counted)
    read_trajectory_steps(traj_h5) -> int        # steps read_trajectory would return
    open_run_file(path) -> h5py.File  # read-only, checked; close it yourself (or use `with`)
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from hpcrl.io import probe
from hpcrl.io.errors import RecordDamagedError, RunFileError
from hpcrl.io.node_file import NODE_TABLES, node_files
from hpcrl.io.recovery import is_truncated, writer_has_open
from hpcrl.io.schema import RUN_FILE, SCHEMA_VERSION, TABLES, TRAJ_DIR, TRAJ_FIELD_NAMES
from hpcrl.io.tables import COMMITTED_ROWS, COMMITTED_STEPS, committed_length, written_prefix

_RETRIES = 5
_H5_ERRORS = (OSError, KeyError, RuntimeError)  # what h5py raises on damaged metadata


class _Transient(Exception):
    """A read that may succeed when retried (the writer was flushing); carries the error for the last try."""

    def __init__(self, error: RunFileError):
        super().__init__(str(error))
        self.error = error


def _retry(read, *args):
    """Run read(*args); on a transient failure retry a few times, then raise its one-line RunFileError."""
    for attempt in range(_RETRIES):
        try:
            return read(*args)
        except _Transient as exc:
            if attempt == _RETRIES - 1:
                raise exc.error from None
            time.sleep(0.1 * (attempt + 1))


def _held(path: Path) -> bool:
    """A writer has the file open, or was killed with it open (its superblock's write flags are set)."""
    try:
        return writer_has_open(path)
    except (OSError, ValueError, IndexError):  # not HDF5: the open says so
        return False


def _first_line(exc: BaseException) -> str:
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return str(text).splitlines()[0] if str(text) else type(exc).__name__


def _actor_files(run_h5: Path) -> list[Path]:
    folder = run_h5.parent / TRAJ_DIR
    return sorted(folder.glob("actor-*.h5")) if folder.is_dir() else []


def _open_h5(path: Path, kind: str, groups: Sequence[str] | None, view: bool, checked: bool) -> h5py.File:
    """Open read-only: plainly when no writer holds the file (HDF5 then reads damaged metadata once and
    fails), as an SWMR reader when one does, after :func:`hpcrl.io.probe.check` read the metadata of
    ``groups`` in a child process within a time limit (an SWMR reader retries damaged metadata for ever).
    ``view``: run.h5's trajectories/ view will be read; HDF5 opens the actors' files in run.h5's mode, so
    run.h5 is opened for SWMR when any of them is held, and they are checked too. ``checked`` False:
    no check (see :func:`_read_trajectory_steps`)."""
    actors = _actor_files(path) if view else []
    try:
        f = h5py.File(path, "r", locking=False)
    except OSError as exc:
        if "already open for write" not in str(exc):
            raise
    else:
        if not any(_held(a) for a in actors):
            return f
        f.close()
    if is_truncated(path):
        raise OSError("truncated file: the superblock's end of file lies beyond its size")
    if checked:
        probe.check([*((a, None, "dataset") for a in actors),
                     (path, groups, "table" if kind in ("run", "node") else "dataset")])
    return h5py.File(path, "r", swmr=True, locking=False)


def _open(path: str | Path, kind: str, groups: Sequence[str] | None = None, view: bool = False,
          checked: bool = True) -> h5py.File:
    """Open read-only with the checks; ``groups``: what will be read (None: everything). A failed open
    is retried (transient) only while a writer holds the file: it may be flushing."""
    path = Path(path)
    if path.is_dir():
        path = path / RUN_FILE
    if not path.is_file():
        raise RunFileError(f"{path}: no such file (expected an hpcrl {kind} file)")
    try:
        f = _open_h5(path, kind, groups, view, checked)
    except RecordDamagedError:  # from the bounded check: final
        raise
    except (OSError, ValueError) as exc:
        text = _first_line(exc)
        if "checksum" in text:
            err = RecordDamagedError(path, None, text)
            raise (_Transient(err) if _held(path) else err) from None
        why = "empty file" if path.stat().st_size == 0 else "truncated or not HDF5"
        final = "signature not found" in text or not _held(path)  # a writer mid-flush can look truncated: retried
        err = RunFileError(f"{path}: cannot be read as an hpcrl {kind} file ({why}: {text})")
        raise (err if final else _Transient(err)) from None
    try:
        version = f.attrs["schema_version"] if "schema_version" in f.attrs else None
    except _H5_ERRORS as exc:
        err = _damaged(f, exc, None)
        f.close()
        raise err from None
    if version is None:
        f.close()
        raise RunFileError(f"{path}: not an hpcrl {kind} file (no schema_version attribute)")
    if int(version) > SCHEMA_VERSION:
        f.close()
        raise RunFileError(f"{path}: schema_version {int(version)} is newer than this reader's {SCHEMA_VERSION}; "
                           "upgrade hpcrl")
    return f


def _damaged(f: h5py.File, exc: BaseException, table: str | None, kind: str = "table") -> Exception:
    """The error for h5py's ``exc`` while reading ``table`` of ``f``: :func:`damage_error`, made transient
    (retried) while a writer holds the file."""
    err = damage_error(f, exc, table, kind)
    return _Transient(err) if _live(f) else err


def _live(f: h5py.File) -> bool:
    return (f.id.valid and f.swmr_mode) or _held(Path(f.filename))


def damage_error(f: h5py.File, exc: BaseException, table: str | None, kind: str = "table") -> RecordDamagedError:
    """The RecordDamagedError for h5py's ``exc`` while reading ``table`` of the open file ``f``. ``table``
    None: the first damaged group is looked up (plain reads only: an SWMR reader could wait for ever)."""
    if table is None and f.id.valid and not _live(f):
        def at(name: str) -> None:
            nonlocal table
            table = name

        try:
            probe.walk(f, None, at)
            table = None  # the metadata reads: the damage is in the data
        except _H5_ERRORS:
            pass
    return RecordDamagedError(f.filename, table, _first_line(exc), kind)


def open_run_file(path: str | Path) -> h5py.File:
    """run.h5 (or a run directory) opened read-only after the checks above."""
    return _retry(_open, path, "run", None, True)


def read_attrs(run_h5: str | Path) -> dict:
    return _retry(_read_attrs, run_h5)


def _read_attrs(run_h5):
    with _open(run_h5, "run", []) as f:
        try:
            return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        except _H5_ERRORS as exc:
            raise _damaged(f, exc, None) from None


def read_table(run_h5: str | Path, name: str, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """One table of run.h5 as column -> 1-D array, cut to the rows every column of the table has
    and the ``committed_rows`` attribute vouches for. For ``actors`` and ``episodes``, when the run
    directory has node files, their rows are joined to run.h5's (times shifted to run.h5's clock) and
    all are sorted stably by time (equal times: run.h5's rows, then the nodes' in relay order)."""
    if name not in TABLES:
        raise RunFileError(f"no table {name!r} in the hpcrl schema; tables: {', '.join(TABLES)}")
    wanted = list(columns) if columns is not None else list(TABLES[name].names)
    nodes = node_files(_run_dir(run_h5)) if name in NODE_TABLES else {}
    if not nodes:
        return _retry(_read_table, run_h5, name, wanted)
    read = wanted if "time" in wanted else [*wanted, "time"]  # the order of the joined rows
    parts = [_retry(_read_table, run_h5, name, read)]
    start = read_attrs(run_h5).get("start_unix")
    if start is None:
        raise RunFileError(f"{_run_dir(run_h5) / RUN_FILE}: no start_unix attribute, so the rows of its node files "
                           "cannot be put on its clock")
    checked = check_held_together(list(nodes.values()), [name])  # a live run's files: one probe, not one each
    for path in nodes.values():
        rows, node_start = _retry(_read_node_table, path, name, read, path not in checked)
        rows["time"] = rows["time"] + (node_start - float(start))
        parts.append(rows)
    order = np.argsort(np.concatenate([p["time"] for p in parts]), kind="stable")
    return {c: np.concatenate([p[c] for p in parts])[order] for c in wanted}


def _run_dir(run_h5: str | Path) -> Path:
    path = Path(run_h5)
    return path if path.is_dir() else path.parent


def _read_table(run_h5, name, wanted):
    with _open(run_h5, "run", [name]) as f:
        return _columns(f, name, wanted)


def _read_node_table(path, name, wanted, checked=True):
    """A node file's rows of table ``name`` and its ``start_unix`` (what its times count from); ``checked`` False:
    :func:`check_held_together` read its metadata already."""
    with _open(path, "node", [name], checked=checked) as f:
        return _columns(f, name, wanted), start_unix(f, "not an hpcrl node file")


def check_held_together(paths: list[Path], groups: Sequence[str]) -> set[Path]:
    """The node files among ``paths`` that a writer holds, their ``groups`` checked (:func:`hpcrl.io.probe.check`)
    in one child process rather than one each (about 0.3 s a file, at hundreds of nodes): those that passed. One
    that fails is left to its own check."""
    held = [p for p in paths if _held(p)]
    while len(held) > 1:
        try:
            probe.check([(p, list(groups), "table") for p in held])
            return set(held)
        except RecordDamagedError as exc:
            rest = [p for p in held if str(p) != exc.path]
            if len(rest) == len(held):
                break
            held = rest
        except RunFileError:
            break
    return set()


def start_unix(f: h5py.File, without: str) -> float:
    """The open file's ``start_unix`` attribute (what its times count from); RunFileError ``FILE: without (no
    start_unix attribute)`` when it has none."""
    try:
        start = f.attrs.get("start_unix")
    except _H5_ERRORS as exc:
        raise _damaged(f, exc, None) from None
    if start is None:
        raise RunFileError(f"{f.filename}: {without} (no start_unix attribute)")
    return float(start)


def _read_node_counts(path):
    """A node file's rows per table (:data:`~hpcrl.io.node_file.NODE_TABLES`) and the ``actor`` and ``steps``
    columns of its ``actors`` rows, in one open (:func:`hpcrl.io.rollback.record_counts`)."""
    with _open(path, "node", list(NODE_TABLES)) as f:
        return _row_counts(f, NODE_TABLES), _columns(f, "actors", ["actor", "steps"])


def _row_counts(f: h5py.File, names) -> dict[str, int]:
    """:func:`table_rows` of each of tables ``names`` of the open file ``f``."""
    counts = {}
    for name in names:
        try:
            counts[name] = table_rows(f[name], name)
        except _H5_ERRORS as exc:
            raise _damaged(f, exc, name) from None
    return counts


def _columns(f: h5py.File, name: str, wanted: Sequence[str]) -> dict[str, np.ndarray]:
    """Columns ``wanted`` of table ``name`` of the open file ``f``, cut to :func:`table_rows`."""
    try:
        present = name in f
    except _H5_ERRORS as exc:  # the root group's links: every table is out of reach
        raise _damaged(f, exc, None) from None
    if not present:
        raise RunFileError(f"{f.filename}: table '{name}' is missing")
    try:
        group = f[name]
        missing = [c for c in wanted if c not in group]
        if missing:
            raise RunFileError(f"{f.filename}: table '{name}' is missing columns {', '.join(missing)}")
        n = table_rows(group, name)
        return {c: group[c][:n] for c in wanted}
    except _H5_ERRORS as exc:
        raise _damaged(f, exc, name) from None


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
    with _open(run_h5, "run", list(TABLES)) as f:
        try:
            present = [name for name in TABLES if name in f]
        except _H5_ERRORS as exc:
            raise _damaged(f, exc, None) from None
        return _row_counts(f, present)


def read_trajectory_steps(traj_h5: str | Path) -> int:
    """Steps a reader may use of one actor's trajectory file."""
    return _retry(_read_trajectory_steps, traj_h5)


def _read_trajectory_steps(traj_h5, checked: bool = True):
    """``checked`` False: no child process checks a file a writer holds (the parameter rank counting the
    steps of its live actors' files at a checkpoint: see :func:`hpcrl.io.rollback.record_counts`)."""
    with _open(traj_h5, "trajectory", checked=checked) as f:
        try:
            return trajectory_steps(f)
        except _H5_ERRORS as exc:
            raise _damaged(f, exc, None, "dataset") from None


def read_trajectory(traj_h5: str | Path, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """One actor's trajectory datasets, [steps, ...], cut to the steps every dataset has and the
    ``committed_steps`` attribute vouches for."""
    wanted = list(fields) if fields is not None else list(TRAJ_FIELD_NAMES)
    return _retry(_read_trajectory, traj_h5, wanted)


def _read_trajectory(traj_h5, wanted):
    with _open(traj_h5, "trajectory") as f:
        try:
            missing = [k for k in wanted if k not in f]
            if missing:
                raise RunFileError(f"{f.filename}: missing trajectory datasets {', '.join(missing)}")
            n = trajectory_steps(f)
            return {k: f[k][:n] for k in wanted}
        except _H5_ERRORS as exc:
            raise _damaged(f, exc, None, "dataset") from None


def read_trajectories(run_h5: str | Path, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """run.h5's ``trajectories/`` view: field -> [num_actors, steps, ...], padded with NaN / -1
    (``policy_version >= 0`` marks real steps). Works while actors run and after they were killed."""
    wanted = list(fields) if fields is not None else list(TRAJ_FIELD_NAMES)
    return _retry(_read_trajectories, run_h5, wanted)


def _read_trajectories(run_h5, wanted):
    with _open(run_h5, "run", ["trajectories"], view=True) as f:
        if not f.swmr_mode:  # the view's own error names no actor file: look at each one first
            for actor in _actor_files(Path(f.filename)):
                _check_plain(actor)
        try:
            if "trajectories" not in f:
                raise RunFileError(f"{f.filename}: no trajectories/ view "
                                   "(the run was created without a trajectory layout)")
            group = f["trajectories"]
            missing = [k for k in wanted if k not in group]
            if missing:
                raise RunFileError(f"{f.filename}: trajectories/ is missing {', '.join(missing)}")
            return {k: group[k][()] for k in wanted}
        except _H5_ERRORS as exc:
            raise _damaged(f, exc, "trajectories") from None


def _check_plain(path: Path) -> None:
    """Read the metadata of a file no writer holds (plainly: damage fails at once), naming what is damaged."""
    try:
        f = h5py.File(path, "r", locking=False)
    except OSError as exc:
        if "already open for write" in str(exc):
            raise _Transient(RunFileError(f"{path}: a writer opened it while it was being read")) from None
        raise RecordDamagedError(path, None, _first_line(exc)) from None
    with f:
        try:
            probe.walk(f)
        except _H5_ERRORS as exc:
            raise _damaged(f, exc, None, "dataset") from None
