"""Cut a run's record back to a checkpoint, for ``--resume``.

A checkpoint stores :func:`record_counts` (rows of every run.h5 table, steps of every
trajectory file) when it is taken. Rows written after it describe updates and samples that
the resumed job will redo (with other weights under the same version numbers), so resuming
first calls :func:`truncate_record` with those counts, with no writer open (before
``RunFile.open_append`` / ``TrajectoryWriter.open_append``).

API::

    record_counts(run_dir, run_file=None) -> {"tables": {name: rows}, "traj_steps": {actor: steps}}
        # run_file: the parameter rank's open RunFile (flushed here first); otherwise run.h5 is read
    truncate_record(run_dir, counts: dict[str, int], traj_steps: dict[int, int])
        -> {"tables": {name: rows removed}, "traj_steps": {actor: steps removed}}
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import h5py

from hpcrl.io.errors import RunFileError
from hpcrl.io.h5format import APPEND_LIBVER
from hpcrl.io.readers import _read_trajectory_steps, _retry, read_row_counts
from hpcrl.io.recovery import clear_write_flags
from hpcrl.io.run_file import RunFile
from hpcrl.io.schema import RUN_FILE, TABLES, TRAJ_DIR, traj_filename
from hpcrl.io.tables import Table
from hpcrl.io.traj_file import cut_trajectory

_TRAJ_NAME = re.compile(r"actor-(\d+)\.h5")


def trajectory_files(run_dir: str | Path) -> dict[int, Path]:
    """Actor index -> its traj/actor-NNNNN.h5, for the files that exist."""
    folder = Path(run_dir) / TRAJ_DIR
    found = {}
    for p in sorted(folder.glob("actor-*.h5")) if folder.is_dir() else ():
        m = _TRAJ_NAME.fullmatch(p.name)
        if m:
            found[int(m.group(1))] = p
    return found


def record_counts(run_dir: str | Path, run_file: RunFile | None = None) -> dict[str, dict]:
    """Committed rows of every run.h5 table and committed steps of every trajectory file.

    The parameter rank passes its open ``run_file`` (HDF5 cannot open a file a second time in the
    process that writes it); it is flushed first, so every row appended so far counts. The
    trajectory files belong to the actor processes and are read as an SWMR reader (their
    buffered steps are not counted); mid-job without the bounded check of :mod:`hpcrl.io.probe`
    (no child process per file at every checkpoint of the parameter rank).
    """
    run_dir = Path(run_dir)
    if run_file is not None:
        run_file.flush()
    tables = run_file.row_counts() if run_file is not None else read_row_counts(run_dir / RUN_FILE)
    steps = {a: _retry(_read_trajectory_steps, p, run_file is None) for a, p in trajectory_files(run_dir).items()}
    return {"tables": dict(tables), "traj_steps": steps}


def truncate_record(run_dir: str | Path, counts: Mapping[str, int], traj_steps: Mapping[int, int]) -> dict[str, dict]:
    """Cut run.h5's tables to ``counts`` rows and each listed trajectory file to ``traj_steps`` steps.

    Never lengthens; tables and actors not named are left as they are (rows a killed writer
    left uncommitted are dropped from every file opened). Returns what was removed. Run it
    with no writer open on these files (the run lock held).
    """
    run_dir = Path(run_dir)
    unknown = sorted(set(counts) - set(TABLES))
    if unknown:
        raise RunFileError(f"truncate_record: no table {unknown[0]!r} in the hpcrl schema; tables: {', '.join(TABLES)}")
    removed_rows = {}
    if counts:
        path = run_dir / RUN_FILE
        if not path.is_file():
            raise RunFileError(f"{path}: no such run file to truncate")
        with _open_for_cutting(path) as f:
            for name, rows in counts.items():
                if name not in f:
                    raise RunFileError(f"{path}: table '{name}' is missing")
                removed_rows[name] = Table.open(f, TABLES[name]).cut(int(rows))
    removed_steps = {}
    for actor, steps in traj_steps.items():
        path = run_dir / traj_filename(int(actor))
        if not path.is_file():
            removed_steps[int(actor)] = 0
            continue
        with _open_for_cutting(path) as f:
            removed_steps[int(actor)] = cut_trajectory(f, int(steps))
    return {"tables": removed_rows, "traj_steps": removed_steps}


def _open_for_cutting(path: Path) -> h5py.File:
    try:
        clear_write_flags(path)  # a killed writer left them; nobody writes the file now
        return h5py.File(path, "a", libver=APPEND_LIBVER, locking=False)
    except (OSError, ValueError) as exc:
        raise RunFileError(f"{path}: cannot open to truncate ({str(exc).splitlines()[0]})") from None
