"""Cut a run's record back to a checkpoint, for ``--resume``.

A checkpoint stores :func:`record_counts` (rows of every run.h5 table, steps of every
trajectory file) when it is taken. Rows written after it describe updates and samples that
the resumed job will redo (with other weights under the same version numbers), so resuming
first calls :func:`truncate_record` with those counts, with no writer open (before
``RunFile.open_append`` / ``TrajectoryWriter.open_append``).

A fragment is in two files written by two processes at different times: its steps in the
actor's trajectory file (buffered, written every ``io.flush_seconds``) and its row in run.h5's
``actors`` table (rank 0, from the actor's report, which is sent before the steps are flushed).
At a checkpoint either may be ahead of the other, so an actor's kept steps are the fragments
both hold: ``traj_steps[a]`` is the smaller of its file's committed steps and the steps its rows
report. :func:`truncate_record` cuts the file to that, and drops the actor's rows past it from
the ``actors`` table (rows of other actors keep their order); an actor's file that holds fewer
steps than the checkpoint counted (deleted, or cut short) is said in one line on stderr, and
its rows are cut to what the file holds. After a resume each actor's rows and file hold the same
fragments, so the actor numbers its next fragment from its file (steps / fragment steps). A file that cannot
be cut (cut short in bytes, damaged metadata) is one line naming it and what is wrong, with the way on: for an
actor's file, move it aside and resume again (that actor starts over from the checkpoint, as for a deleted file).

API::

    record_counts(run_dir, run_file=None) -> {"tables": {name: rows}, "traj_steps": {actor: steps}}
        # run_file: the parameter rank's open RunFile (flushed here first); otherwise run.h5 is read
    truncate_record(run_dir, counts: dict[str, int], traj_steps: dict[int, int])
        -> {"tables": {name: rows removed}, "traj_steps": {actor: steps removed},
            "lost_steps": {actor: steps the checkpoint counted that its file no longer holds}}
"""
from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

import h5py
import numpy as np

from hpcrl.io.errors import RunFileError
from hpcrl.io.h5format import APPEND_LIBVER
from hpcrl.io.readers import _read_trajectory_steps, _retry, read_row_counts, read_table
from hpcrl.io.recovery import clear_write_flags, stored_eof
from hpcrl.io.run_file import RunFile
from hpcrl.io.schema import NEVER_CUT, RUN_FILE, TABLES, TRAJ_DIR, traj_filename
from hpcrl.io.tables import COMMITTED_STEPS, Table
from hpcrl.io.traj_file import cut_trajectory, held_committed_steps

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
    """Committed rows of every run.h5 table (but :data:`~hpcrl.io.schema.NEVER_CUT`'s) and committed steps of
    every trajectory file.

    The parameter rank passes its open ``run_file`` (HDF5 cannot open a file a second time in the
    process that writes it); it is flushed first, so every row appended so far counts. The
    trajectory files belong to the actor processes and are read as an SWMR reader (their
    buffered steps are not counted); mid-job without the bounded check of :mod:`hpcrl.io.probe`
    (no child process per file at every checkpoint of the parameter rank).

    An actor's ``traj_steps`` are the fragments both its file and its ``actors`` rows hold: the
    smaller of the file's committed steps and the steps its rows report (module docstring).
    """
    run_dir = Path(run_dir)
    if run_file is not None:
        run_file.flush()
    tables = run_file.row_counts() if run_file is not None else read_row_counts(run_dir / RUN_FILE)
    tables = {name: rows for name, rows in tables.items() if name not in NEVER_CUT}
    if run_file is not None:
        reported = run_file.actor_steps()
    else:
        reported = _steps_by_actor(read_table(run_dir / RUN_FILE, "actors", ["actor", "steps"])
                                   if "actors" in tables else {"actor": np.zeros(0, int), "steps": np.zeros(0, int)})
    on_disk = {a: _on_disk_steps(p, checked=run_file is None) for a, p in trajectory_files(run_dir).items()}
    steps = {a: min(on_disk.get(a, 0), reported.get(a, 0)) for a in sorted(set(on_disk) | set(reported))}
    return {"tables": dict(tables), "traj_steps": steps}


def _on_disk_steps(path: Path, checked: bool) -> int:
    """Committed steps of a trajectory file: its writer's count when this process writes it (serial, sim),
    else read from the file."""
    held = held_committed_steps(path)
    return held if held is not None else _retry(_read_trajectory_steps, path, checked)


def _steps_by_actor(rows: Mapping[str, np.ndarray]) -> dict[int, int]:
    out: dict[int, int] = {}
    for actor, steps in zip(rows["actor"].tolist(), rows["steps"].tolist()):
        out[int(actor)] = out.get(int(actor), 0) + max(int(steps), 0)
    return out


def truncate_record(run_dir: str | Path, counts: Mapping[str, int], traj_steps: Mapping[int, int]) -> dict[str, dict]:
    """Cut run.h5's tables to ``counts`` rows and each listed trajectory file to ``traj_steps`` steps.

    Never lengthens: a table holding fewer rows than ``counts`` (writes lost after the checkpoint counted
    them, an older copy) is refused in one line before anything is cut; tables and actors not named are
    left as they are (rows a killed writer left uncommitted are dropped from every file opened). The
    ``actors`` table then keeps, of each listed actor, only the rows of the fragments its file still holds
    (module docstring); a file holding fewer steps than ``traj_steps`` says (deleted, cut short) is one
    line on stderr.
    Returns what was removed. Run it with no writer open on these files (the run lock held).
    """
    run_dir = Path(run_dir)
    unknown = sorted(set(counts) - set(TABLES))
    if unknown:
        raise RunFileError(f"truncate_record: no table {unknown[0]!r} in the hpcrl schema; tables: {', '.join(TABLES)}")
    removed_rows: dict[str, int] = {}
    if not counts:
        return {"tables": removed_rows, **_cut_trajectories(run_dir, traj_steps, None)}
    path = run_dir / RUN_FILE
    if not path.is_file():
        raise RunFileError(f"{path}: no such run file to truncate")
    where = None  # the table being cut, for the message when it is damaged
    try:
        with _open_for_cutting(path) as f:
            tables = {}
            for name in counts:
                if name not in f:
                    raise RunFileError(f"{path}: table '{name}' is missing")
                where = name
                tables[name] = Table.open(f, TABLES[name])
            where = None
            _check_not_behind(path, {name: (tables[name].committed, int(rows)) for name, rows in counts.items()})
            for name, rows in counts.items():
                where = name
                removed_rows[name] = tables[name].cut(int(rows))
            where = "actors"
            actors = tables.get("actors")
            reported = _steps_by_actor(actors.read_written(("actor", "steps"))) if actors is not None else None
            where = None
            cut = _cut_trajectories(run_dir, traj_steps, reported)
            if actors is not None:
                where = "actors"
                removed_rows["actors"] += _keep_fragments_on_file(actors, cut.pop("kept"))
    except RunFileError:
        raise
    except _DAMAGE as exc:
        raise _record_damaged(path, where, exc) from None
    cut.pop("kept", None)
    return {"tables": removed_rows, **cut}


def _check_not_behind(path: Path, rows: Mapping[str, tuple[int, int]]) -> None:
    """Refuse (one line, the way on) when a table holds fewer rows than the checkpoint counted: writes made before
    the checkpoint did not reach the file (a node that crashed before the page cache reached the disk, an older
    copy put back), and resuming from that checkpoint would leave a gap in the record. Nothing is cut then."""
    behind = [(name, have, want) for name, (have, want) in rows.items() if have < want]
    if not behind:
        return
    name, have, want = behind[0]
    folder = path.parent / "checkpoints"
    raise RunFileError(
        f"--resume: {path} table '{name}' holds {have:,} rows, fewer than the {want:,} the checkpoint counted "
        f"({len(behind)} table{'s' if len(behind) > 1 else ''} behind it: writes before the checkpoint did not "
        "reach the file, or it is an older copy), so resuming from it would leave a gap; go on from an earlier "
        f"checkpoint the file still holds: mv {folder / 'latest.pt'} {folder / 'latest.pt.ahead'} && "
        f"hpcrl run --resume {path.parent} (it takes previous.pt), or put back the newer run.h5")


def check_not_cut_short(run_dir: str | Path) -> None:
    """Before a resume starts its ranks: run.h5 or an actor's file shorter than its superblock says (a copy or a
    full disk cut it) is the one-line RunFileError :func:`truncate_record` would raise, with the way on. Reads
    each file's first 4 KB and changes nothing."""
    run_dir = Path(run_dir)
    files = [(run_dir / RUN_FILE, None), *((p, a) for a, p in trajectory_files(run_dir).items())]
    for path, actor in files:
        stored = stored_eof(path) if path.is_file() else None
        if stored is not None and stored > path.stat().st_size:
            exc = OSError("truncated file")
            raise _record_damaged(path, None, exc) if actor is None else _trajectory_damaged(path, actor, exc)


_DAMAGE = (OSError, KeyError, RuntimeError, ValueError)
"""What h5py raises on a file it cannot read or write as its metadata says (checksums, a file cut short)."""


def _what_is_wrong(path: Path, table: str | None, exc: BaseException) -> str:
    """``is cut short (N of M bytes)`` or ``is damaged (table 'x': HDF5's first line)``."""
    stored = stored_eof(path)
    size = path.stat().st_size
    if stored is not None and stored > size:
        return f"is cut short ({size:,} of {stored:,} bytes)"
    text = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"is damaged ({f'table {table!r}: ' if table else ''}{first})"


def _record_damaged(path: Path, table: str | None, exc: BaseException) -> RunFileError:
    """run.h5 cannot be cut back for --resume: what is wrong, and the ways on."""
    run_dir, what = path.parent, _what_is_wrong(path, table, exc)
    again = "if a copy cut it short, copy it again and resume; else " if what.startswith("is cut short") else ""
    return RunFileError(
        f"--resume: {path} {what}, so the record cannot go on from the checkpoint; {again}the run cannot go on in "
        f"{run_dir} (its checkpointed policy still plays and exports: hpcrl eval {run_dir}, hpcrl export {run_dir})")


def _trajectory_damaged(path: Path, actor: int, exc: BaseException) -> RunFileError:
    """An actor's file cannot be cut back for --resume: what is wrong, and the way on from the checkpoint."""
    run_dir = path.parent.parent
    return RunFileError(
        f"--resume: {path} {_what_is_wrong(path, None, exc)}, so actor {actor}'s trajectories cannot go on in it; "
        f"to resume from the checkpoint without them: mv {path} {path}.damaged && hpcrl run --resume {run_dir} "
        f"(actor {actor} starts a new file, its rows leave the actors table; run.h5 and the other files go on)")


def _cut_trajectories(run_dir: Path, traj_steps: Mapping[int, int], reported: Mapping[int, int] | None) -> dict:
    """Cut each listed actor's file to its ``traj_steps`` (and to the steps its ``actors`` rows report, when
    ``reported`` is given: a checkpoint of an older hpcrl counted the file alone); one line for each file that
    holds fewer steps than the checkpoint counted. Steps removed, lost and kept per actor."""
    removed, kept, lost = {}, {}, {}
    for actor, steps in traj_steps.items():
        actor, steps, path = int(actor), int(steps), run_dir / traj_filename(int(actor))
        target = steps if reported is None else min(steps, reported.get(actor, 0))
        if not path.is_file():
            removed[actor], kept[actor] = 0, 0
        else:
            try:
                with _open_for_cutting(path) as f:
                    removed[actor] = cut_trajectory(f, target)
                    kept[actor] = int(f.attrs[COMMITTED_STEPS])
            except RunFileError:
                raise
            except _DAMAGE as exc:
                raise _trajectory_damaged(path, actor, exc) from None
        if kept[actor] < target:
            lost[actor] = target - kept[actor]
            why = "is missing" if not path.is_file() else f"holds {kept[actor]:,} steps"
            print(f"hpcrl: --resume: {path} {why}, not the {target:,} the checkpoint counted: "
                  f"{lost[actor]:,} steps of actor {actor} are lost (its rows past them leave the actors table; "
                  "the actor goes on from what the file holds)", file=sys.stderr, flush=True)
    return {"traj_steps": removed, "lost_steps": lost, "kept": kept}


def _keep_fragments_on_file(table: Table, kept: Mapping[int, int]) -> int:
    """Drop the rows of each actor in ``kept`` whose fragments lie past the steps its file keeps (the
    other rows keep their order); returns the rows dropped."""
    rows = table.read_written(("actor", "steps"))
    actors, steps = rows["actor"].astype(np.int64), np.maximum(rows["steps"].astype(np.int64), 0)
    keep = np.ones(len(actors), dtype=bool)
    for actor, limit in kept.items():
        mine = actors == actor
        reach = np.cumsum(np.where(mine, steps, 0))  # the actor's steps up to and including each row
        keep &= ~mine | (reach <= limit)
    if keep.all():
        return 0
    first = int(np.argmin(keep))  # rows before the first dropped one stay where they are
    tail = table.read_written(table.spec.names, first)
    table.cut(first)
    table.append({name: col[keep[first:]] for name, col in tail.items()})
    table.flush()
    return int((~keep).sum())


def _open_for_cutting(path: Path) -> h5py.File:
    """Open for appending (a killed writer's flags cleared first); h5py's error when it cannot (the callers name
    the file, what is wrong and the way on)."""
    if (stored := stored_eof(path)) is not None and stored > path.stat().st_size:
        raise OSError("truncated file")  # before clear_write_flags, which would take the cut size for the end
    clear_write_flags(path)  # a killed writer left them; nobody writes the file now
    return h5py.File(path, "a", libver=APPEND_LIBVER, locking=False)
