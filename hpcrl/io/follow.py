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

For ``actors`` and ``episodes``, :func:`follow` also follows the run's node files (``nodes/node-RRRRR.h5``,
``actors.reports: summary``; :mod:`hpcrl.io.node_file`) as they appear, each by its own count, and yields
their rows with run.h5's: times shifted to run.h5's clock as :func:`hpcrl.io.read_table` shifts them, a batch
with rows of several files sorted stably by time (run.h5's rows, then the nodes' in relay order). A node file
that cannot be opened yet (its writer has not switched to SWMR) is tried again at the next poll.

API::

    for rows in follow(run_h5_or_run_dir, "episodes", poll_seconds=0.5, idle_seconds=None, columns=None):
        ...   # rows: column -> 1-D array of the rows committed since the last batch (never empty);
              # actors and episodes: run.h5's new rows and the node files', by time
    for steps in follow_trajectory(traj_h5, fields=None, poll_seconds=0.5, idle_seconds=None):
        ...   # steps: field -> [new steps, ...]

Both end when the writer closes the file (after yielding its last rows, the node files' too: their
writers close first), or after ``idle_seconds`` without a new row from any file (None: wait for ever,
e.g. across a killed writer's requeue).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from hpcrl.io.errors import RunFileError
from hpcrl.io.node_file import NODE_TABLES, node_files
from hpcrl.io.readers import (_H5_ERRORS, _open, _retry, _Transient, check_held_together, damage_error, read_table,
                               start_unix)
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
    joined = table in NODE_TABLES  # node files may hold its rows: time is read to sort them
    read = [*names, "time"] if joined and "time" not in names else names
    f = _retry(_open, path, "run", [table, LIVE_GROUP])
    try:
        try:
            missing = [c for c in read if f"{table}/{c}" not in f]
            if missing:
                raise RunFileError(f"{path}: table '{table}' is missing columns {', '.join(missing)}")
            counter = f.get(f"{LIVE_GROUP}/{table}")
            datasets = {c: f[f"{table}/{c}"] for c in read}
        except _H5_ERRORS as exc:
            raise damage_error(f, exc, table) from None
        if counter is None:  # a file from before the count datasets: reopen per poll
            f.close()
            yield from _follow_reopening(path, table, names, poll_seconds, idle_seconds)
            return
        if joined:
            yield from _follow_joined(path, f, table, names, _Source(counter, datasets), poll_seconds, idle_seconds)
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


class _Source:
    """One file of a joined table: its live count, its columns (``time`` among them), the rows already yielded,
    and what its times add to be on run.h5's clock (None: run.h5 itself)."""

    def __init__(self, counter, datasets: dict, shift: float | None = None, file=None):
        self.counter, self.datasets, self.shift, self.file = counter, datasets, shift, file
        self.seen = 0

    def committed(self) -> int:
        self.counter.refresh()
        return int(self.counter[0])

    def read(self, names: list[str], n: int) -> dict[str, np.ndarray]:
        """Rows ``seen:n`` of columns ``names`` (times on run.h5's clock); they are then seen."""
        out = {}
        for c in names:
            d = self.datasets[c]
            d.refresh()  # the columns reached the file before the count, so they hold n rows
            out[c] = d[self.seen:n]
        if self.shift is not None and "time" in out:
            out["time"] = out["time"] + self.shift
        self.seen = n
        return out


def _follow_joined(path: Path, run, table: str, names: list[str], own: _Source, poll_seconds: float,
                   idle_seconds: float | None) -> Iterator[dict[str, np.ndarray]]:
    """:func:`_follow_open` over run.h5's table and the node files' (opened as they appear): one batch per poll."""
    nodes: dict[int, _Source] = {}
    start: list[float] = []  # run.h5's start_unix, read when the first node file is found
    last_new = time.monotonic()
    try:
        while True:
            closed = not writer_has_open(path)  # before the counts: the node files' writers closed before it
            found = {relay: p for relay, p in node_files(path.parent).items() if relay not in nodes}
            if found and not start:
                start.append(start_unix(run, "its node files' rows cannot be put on its clock"))
            checked = check_held_together(list(found.values()), [table, LIVE_GROUP])
            for relay, node_path in found.items():
                source = _node_source(node_path, table, list(own.datasets), start[0], closed, node_path in checked)
                if source is not None:
                    nodes[relay] = source
            counts = [(s, s.committed()) for s in (own, *(nodes[r] for r in sorted(nodes)))]
            new = [(s, n) for s, n in counts if n > s.seen]
            if len(new) == 1:
                yield new[0][0].read(names, new[0][1])
            elif new:
                read = names if "time" in names else [*names, "time"]
                parts = [s.read(read, n) for s, n in new]
                order = np.argsort(np.concatenate([p["time"] for p in parts]), kind="stable")
                yield {c: np.concatenate([p[c] for p in parts])[order] for c in names}
            if new:
                last_new = time.monotonic()
            if closed or (idle_seconds is not None and time.monotonic() - last_new > idle_seconds):
                return
            time.sleep(poll_seconds)
    finally:
        for source in nodes.values():
            source.file.close()


def _node_source(path: Path, table: str, columns: list[str], run_start: float, final: bool,
                 checked: bool) -> _Source | None:
    """A node file's table to follow, or None while it cannot be opened yet (its writer is creating it).
    ``final``: run.h5's writer has closed, so the node file's has: a failure is the file's and raises.
    ``checked``: :func:`hpcrl.io.readers.check_held_together` read its metadata already."""
    groups = [table, LIVE_GROUP]
    try:
        if final:
            f = _retry(_open, path, "node", groups, False, not checked)
        else:
            f = _open(path, "node", groups, checked=not checked)
    except (RunFileError, _Transient):
        if final:
            raise
        return None
    try:
        try:
            missing = [c for c in columns if f"{table}/{c}" not in f]
            counter = f.get(f"{LIVE_GROUP}/{table}")
            datasets = {c: f[f"{table}/{c}"] for c in columns if c not in missing}
        except _H5_ERRORS as exc:
            raise damage_error(f, exc, table) from None
        node_start = start_unix(f, "not an hpcrl node file")
        if missing or counter is None:
            what = f"columns {', '.join(missing)}" if missing else f"the live count {LIVE_GROUP}/{table}"
            raise RunFileError(f"{path}: table '{table}' is missing {what}")
    except RunFileError:
        f.close()
        if final:
            raise
        return None
    return _Source(counter, datasets, float(node_start) - run_start, f)


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
