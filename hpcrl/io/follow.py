"""Follow a table of run.h5 (or an actor's trajectory file) while its job writes it, keeping the file open.

h5py re-reads a dataset's extent on ``Dataset.refresh()`` but never re-reads attributes, so a
reader that keeps the file open cannot watch a table's ``committed_rows`` attribute grow. The
writers therefore also keep each count in a one-element dataset (``committed/<table>`` in run.h5,
``committed/steps`` in a trajectory file, :func:`hpcrl.io.tables.set_live_count`), raised only
after every column's rows reached the file. :func:`follow` refreshes that count, then reads the
new rows: it never yields a row beyond what the writer vouched for, so never one that a resume
later cuts back as unfinished (a writer killed mid-flush leaves such rows; ``RunFile.open_append``
drops them). Rows past a checkpoint that ``hpcrl run --resume`` rolls back
(:func:`hpcrl.io.truncate_record`) were committed and are yielded; the resume notes them in
run.h5's ``resumed`` attribute.

A file written before the count datasets existed is followed by reopening it at every poll
(:func:`hpcrl.io.read_table`), which sees the attribute fresh each time.

API::

    for rows in follow(run_h5_or_run_dir, "episodes", poll_seconds=0.5, idle_seconds=None, columns=None):
        ...   # rows: column -> 1-D array of the rows committed since the last batch (never empty)
    for steps in follow_trajectory(traj_h5, fields=None, poll_seconds=0.5, idle_seconds=None):
        ...   # steps: field -> [new steps, ...]

Both end when the writer closes the file (after yielding its last rows), or after ``idle_seconds``
without a new row (None: wait for ever, e.g. across a killed writer's requeue).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from hpcrl.io.errors import RunFileError
from hpcrl.io.readers import _H5_ERRORS, _open, _retry, damage_error, read_table
from hpcrl.io.recovery import writer_has_open
from hpcrl.io.schema import RUN_FILE, TABLES, TRAJ_FIELD_NAMES
from hpcrl.io.tables import LIVE_GROUP
from hpcrl.io.traj_file import LIVE_STEPS


def follow(run_h5: str | Path, table: str, *, poll_seconds: float = 0.5, idle_seconds: float | None = None,
           columns: Sequence[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Yield ``table``'s rows of run.h5 in batches as the writer commits them (see the module docstring)."""
    if table not in TABLES:
        raise RunFileError(f"follow: no table {table!r} in the hpcrl schema; tables: {', '.join(TABLES)}")
    path = Path(run_h5)
    path = path / RUN_FILE if path.is_dir() else path
    names = list(columns) if columns is not None else list(TABLES[table].names)
    f = _retry(_open, path, "run", [table, LIVE_GROUP])
    try:
        try:
            missing = [c for c in names if f"{table}/{c}" not in f]
            if missing:
                raise RunFileError(f"{path}: table '{table}' is missing columns {', '.join(missing)}")
            counter = f.get(f"{LIVE_GROUP}/{table}")
            datasets = {c: f[f"{table}/{c}"] for c in names}
        except _H5_ERRORS as exc:
            raise damage_error(f, exc, table) from None
        if counter is None:  # a file from before the count datasets: reopen per poll
            f.close()
            yield from _follow_reopening(path, table, names, poll_seconds, idle_seconds)
            return
        yield from _follow_open(path, counter, datasets, poll_seconds, idle_seconds)
    finally:
        if f.id.valid:
            f.close()


def follow_trajectory(traj_h5: str | Path, fields: Sequence[str] | None = None, *, poll_seconds: float = 0.5,
                      idle_seconds: float | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Yield an actor's new trajectory steps in batches as its writer commits them."""
    path = Path(traj_h5)
    names = list(fields) if fields is not None else list(TRAJ_FIELD_NAMES)
    f = _retry(_open, path, "trajectory")
    try:
        missing = [k for k in names if k not in f]
        counter = f.get(f"{LIVE_GROUP}/{LIVE_STEPS}")
        if missing or counter is None:
            what = f"datasets {', '.join(missing)}" if missing else f"the live count {LIVE_GROUP}/{LIVE_STEPS}"
            raise RunFileError(f"{path}: cannot follow: missing trajectory {what} (written by an older hpcrl; "
                               "read it with hpcrl.io.read_trajectory)")
        yield from _follow_open(path, counter, {k: f[k] for k in names}, poll_seconds, idle_seconds)
    finally:
        f.close()


def _follow_open(path: Path, counter, datasets: dict, poll_seconds: float,
                 idle_seconds: float | None) -> Iterator[dict[str, np.ndarray]]:
    seen, last_new = 0, time.monotonic()
    while True:
        closed = not writer_has_open(path)  # looked at before the count: a count read after it is final
        counter.refresh()
        n = int(counter[0])
        if n > seen:
            for d in datasets.values():
                d.refresh()  # the columns reached the file before the count, so they hold n rows
            yield {name: d[seen:n] for name, d in datasets.items()}
            seen, last_new = n, time.monotonic()
        if closed or (idle_seconds is not None and time.monotonic() - last_new > idle_seconds):
            return
        time.sleep(poll_seconds)


def _follow_reopening(path: Path, table: str, names: list[str], poll_seconds: float,
                      idle_seconds: float | None) -> Iterator[dict[str, np.ndarray]]:
    seen, last_new = 0, time.monotonic()
    while True:
        closed = not writer_has_open(path)
        rows = read_table(path, table, names)
        n = len(rows[names[0]]) if names else 0
        if n > seen:
            yield {c: a[seen:n] for c, a in rows.items()}
            seen, last_new = n, time.monotonic()
        if closed or (idle_seconds is not None and time.monotonic() - last_new > idle_seconds):
            return
        time.sleep(poll_seconds)
