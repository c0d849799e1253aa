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

With ``actors.reports: summary`` the ``actors`` and ``episodes`` rows of the fragments are in the nodes' files
(``nodes/node-RRRRR.h5``, :mod:`hpcrl.io.node_file`) as well as run.h5: the checkpoint counts each node file's rows
too (as the parameter rank heard them in the nodes' summaries), and an actor's reported steps are those of its rows
in run.h5 and in the node files. :func:`truncate_record` cuts each node file as it cuts run.h5's tables.

API::

    record_counts(run_dir, run_file=None, nodes=None, node_steps=None)
        -> {"tables": {name: rows}, "traj_steps": {actor: steps}, "nodes": {relay: {"actors": rows, "episodes": rows}}}
        # run_file: the parameter rank's open RunFile (flushed here first), with what it heard of the node files;
        # otherwise run.h5 and the node files are read
    truncate_record(run_dir, counts: dict[str, int], traj_steps: dict[int, int], nodes=None)
        -> {"tables": {name: rows removed}, "traj_steps": {actor: steps removed},
            "lost_steps": {actor: steps the checkpoint counted that its file no longer holds},
            "nodes": {relay: {"actors": rows removed, "episodes": rows removed}}}
"""
from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import h5py
import numpy as np

from hpcrl.io.errors import RunFileError
from hpcrl.io.h5format import APPEND_LIBVER
from hpcrl.io.node_file import NODE_TABLES, node_filename, node_files
from hpcrl.io.readers import _read_node_counts, _read_table, _read_trajectory_steps, _retry, read_row_counts
from hpcrl.io.recovery import clear_write_flags, stored_eof
from hpcrl.io.run_file import RunFile
from hpcrl.io.schema import NEVER_CUT, RUN_FILE, TABLES, TRAJ_DIR, numbered_files, traj_filename
from hpcrl.io.tables import COMMITTED_STEPS, Table
from hpcrl.io.traj_file import cut_trajectory, held_committed_steps



def trajectory_files(run_dir: str | Path) -> dict[int, Path]:
    """Actor index -> its traj/actor-NNNNN.h5, for the files that exist."""
    return numbered_files(Path(run_dir) / TRAJ_DIR, "actor")


def record_counts(run_dir: str | Path, run_file: RunFile | None = None,
                  nodes: Mapping[int, Mapping[str, int]] | None = None,
                  node_steps: Mapping[int, int] | None = None) -> dict[str, dict]:
    """Committed rows of every run.h5 table (but :data:`~hpcrl.io.schema.NEVER_CUT`'s) and of every node file,
    and committed steps of every trajectory file.

    The parameter rank passes its open ``run_file`` (HDF5 cannot open a file a second time in the
    process that writes it); it is flushed first, so every row appended so far counts. The
    trajectory files belong to the actor processes and are read as an SWMR reader (their
    buffered steps are not counted); mid-job without the bounded check of :mod:`hpcrl.io.probe`
    (no child process per file at every checkpoint of the parameter rank).

    The node files are written by the nodes' relays: the parameter rank passes ``nodes`` (relay -> each node
    file's committed rows, as its last summary from that node said) and ``node_steps`` (actor -> the steps its
    rows in the node files report) and opens none of them; without ``run_file`` they are read from the files
    (as an SWMR reader, checked).

    An actor's ``traj_steps`` are the fragments both its file and its ``actors`` rows hold: the
    smaller of the file's committed steps and the steps its rows (run.h5's and the node files') report
    (module docstring).
    """
    run_dir = Path(run_dir)
    if run_file is not None:
        run_file.flush()
        tables, reported = run_file.row_counts(), run_file.actor_steps()
        nodes = {int(r): {name: int(rows.get(name, 0)) for name in NODE_TABLES} for r, rows in (nodes or {}).items()}
        node_steps = {int(a): int(steps) for a, steps in (node_steps or {}).items()}
    else:
        tables = read_row_counts(run_dir / RUN_FILE)
        # run.h5's own rows (read_table would join the node files' too)
        reported = (_steps_by_actor(_retry(_read_table, run_dir / RUN_FILE, "actors", ["actor", "steps"]))
                    if "actors" in tables else {})
        nodes, node_steps = _read_node_counts_of(run_dir)
    tables = {name: rows for name, rows in tables.items() if name not in NEVER_CUT}
    for actor, steps in node_steps.items():
        reported[actor] = reported.get(actor, 0) + steps
    on_disk = {a: _on_disk_steps(p, checked=run_file is None) for a, p in trajectory_files(run_dir).items()}
    steps = {a: min(on_disk.get(a, 0), reported.get(a, 0)) for a in sorted(set(on_disk) | set(reported))}
    return {"tables": dict(tables), "traj_steps": steps, "nodes": nodes}


def _read_node_counts_of(run_dir: Path) -> tuple[dict[int, dict[str, int]], dict[int, int]]:
    """Each node file's committed rows per table, and per actor the steps its rows in them report."""
    nodes, steps = {}, {}
    for relay, path in node_files(run_dir).items():
        nodes[relay], rows = _retry(_read_node_counts, path)
        for actor, n in _steps_by_actor(rows).items():
            steps[actor] = steps.get(actor, 0) + n
    return nodes, steps


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


def truncate_record(run_dir: str | Path, counts: Mapping[str, int], traj_steps: Mapping[int, int],
                    nodes: Mapping[int, Mapping[str, int]] | None = None) -> dict[str, dict]:
    """Cut run.h5's tables to ``counts`` rows, each node file's tables to its ``nodes`` rows and each listed
    trajectory file to ``traj_steps`` steps.

    Never lengthens: a table holding fewer rows than ``counts`` or ``nodes`` says (writes lost after the
    checkpoint counted them, an older copy), or a node file gone that the checkpoint counted rows in, is refused
    in one line before anything is cut; run.h5's tables and actors not named are left as they are (rows a killed
    writer left uncommitted are dropped from every file opened). A node file that ``nodes`` does not list was
    started after the checkpoint: it is cut to no rows. When ``counts`` names the ``actors`` table, the actors
    tables (run.h5's and the node files') then keep, of each listed actor, only the rows of the fragments its
    file still holds (module docstring, :func:`_fragments_on_file`); a file holding fewer steps than
    ``traj_steps`` says (deleted, cut short) is one line on stderr.
    Returns what was removed. Run it with no writer open on these files (the run lock held).
    """
    run_dir = Path(run_dir)
    unknown = sorted(set(counts) - set(TABLES))
    if unknown:
        raise RunFileError(f"truncate_record: no table {unknown[0]!r} in the hpcrl schema; tables: {', '.join(TABLES)}")
    targets = _node_targets(run_dir, nodes or {})
    path = run_dir / RUN_FILE
    if counts and not path.is_file():
        raise RunFileError(f"{path}: no such run file to truncate")
    removed_rows: dict[str, int] = {}
    removed_nodes: dict[int, dict[str, int]] = {}
    at: tuple[Path, str | None] = (path, None)  # the file and table being cut, for the message when it is damaged
    try:
        with ExitStack() as files:
            tables: dict[str, Table] = {}
            if counts:
                f = files.enter_context(_open_for_cutting(path))
                for name in counts:
                    if name not in f:
                        raise RunFileError(f"{path}: table '{name}' is missing")
                    at = (path, name)
                    tables[name] = Table.open(f, TABLES[name])
            node_tables: dict[int, dict[str, Table]] = {}
            for relay, (node_path, _) in targets.items():
                at = (node_path, None)
                f = files.enter_context(_open_for_cutting(node_path))
                node_tables[relay] = {}
                for name in NODE_TABLES:
                    at = (node_path, name)
                    node_tables[relay][name] = Table.open(f, TABLES[name])
            _check_not_behind(path, {name: (tables[name].committed, int(rows)) for name, rows in counts.items()},
                              run_dir)
            for relay, (node_path, rows) in targets.items():
                _check_not_behind(node_path, {name: (node_tables[relay][name].committed, rows[name])
                                              for name in NODE_TABLES}, run_dir)
            for name, rows in counts.items():
                at = (path, name)
                removed_rows[name] = tables[name].cut(int(rows))
            for relay, (node_path, rows) in targets.items():
                removed_nodes[relay] = {}
                for name in NODE_TABLES:
                    at = (node_path, name)
                    removed_nodes[relay][name] = node_tables[relay][name].cut(rows[name])
            # an older checkpoint counted no actors rows: the trajectory files are cut to traj_steps alone
            actors = ([(None, path, tables["actors"])] + [(r, targets[r][0], node_tables[r]["actors"]) for r in targets]
                      if "actors" in tables else [])
            written = []
            for _, table_path, table in actors:
                at = (table_path, "actors")
                written.append(table.read_written(("actor", "steps")))
            reported = _steps_by_actor({c: np.concatenate([w[c] for w in written]) for c in ("actor", "steps")}
                                       ) if actors else None
            cut = _cut_trajectories(run_dir, traj_steps, reported)
            kept = cut.pop("kept")
            for (relay, table_path, table), keep in zip(actors, _fragments_on_file(written, kept) if actors else ()):
                at = (table_path, "actors")
                dropped = _drop_rows(table, keep)
                if relay is None:
                    removed_rows["actors"] += dropped
                else:
                    removed_nodes[relay]["actors"] += dropped
    except RunFileError:
        raise
    except _DAMAGE as exc:
        raise _record_damaged(at[0], at[1], exc, run_dir) from None
    return {"tables": removed_rows, **cut, "nodes": removed_nodes}


def _node_targets(run_dir: Path, nodes: Mapping[int, Mapping[str, int]]) -> dict[int, tuple[Path, dict[str, int]]]:
    """Relay -> (its node file, the rows of each table to cut it to), for the node files on disk: the
    checkpoint's ``nodes``, or none for a file it does not list (started after it). A listed file that is
    gone though the checkpoint counted rows in it is refused in one line, before anything is cut."""
    nodes = {int(relay): rows for relay, rows in nodes.items()}
    on_disk = node_files(run_dir)
    gone = [(relay, rows) for relay, rows in sorted(nodes.items())
            if relay not in on_disk and any(int(rows.get(name, 0)) for name in NODE_TABLES)]
    if gone:
        relay, rows = gone[0]
        raise RunFileError(
            f"--resume: {run_dir / node_filename(relay)} is missing, though the checkpoint counted "
            f"{int(rows.get('actors', 0)):,} rows of table 'actors' and {int(rows.get('episodes', 0)):,} of table "
            f"'episodes' in it "
            f"({len(gone)} node file{'s' if len(gone) > 1 else ''} missing), so resuming from it would leave a gap; "
            f"put the file back and resume again (without it the record cannot go on; the checkpointed policy still "
            f"plays and exports: hpcrl eval {run_dir}, hpcrl export {run_dir})")
    return {relay: (path, {name: int((nodes.get(relay) or {}).get(name, 0)) for name in NODE_TABLES})
            for relay, path in on_disk.items()}


def _check_not_behind(path: Path, rows: Mapping[str, tuple[int, int]], run_dir: Path) -> None:
    """Refuse (one line, the way on) when a table of ``path`` (run.h5 or a node file) holds fewer rows than the
    checkpoint counted: writes made before the checkpoint did not reach the file (a node that crashed before the
    page cache reached the disk, an older copy put back), and resuming from that checkpoint would leave a gap in the
    record. Nothing is cut then."""
    behind = [(name, have, want) for name, (have, want) in rows.items() if have < want]
    if not behind:
        return
    name, have, want = behind[0]
    folder = run_dir / "checkpoints"
    raise RunFileError(
        f"--resume: {path} table '{name}' holds {have:,} rows, fewer than the {want:,} the checkpoint counted "
        f"({len(behind)} table{'s' if len(behind) > 1 else ''} behind it: writes before the checkpoint did not "
        "reach the file, or it is an older copy), so resuming from it would leave a gap; go on from an earlier "
        f"checkpoint the file still holds: mv {folder / 'latest.pt'} {folder / 'latest.pt.ahead'} && "
        f"hpcrl run --resume {run_dir} (it takes previous.pt), or put back the newer {path.name}")


def check_not_cut_short(run_dir: str | Path) -> None:
    """Before a resume starts its ranks: run.h5, a node file or an actor's file shorter than its superblock says
    (a copy or a full disk cut it) is the one-line RunFileError :func:`truncate_record` would raise, with the way
    on. Reads each file's first 4 KB and changes nothing."""
    run_dir = Path(run_dir)
    files = [(run_dir / RUN_FILE, None), *((p, None) for p in node_files(run_dir).values()),
             *((p, a) for a, p in trajectory_files(run_dir).items())]
    for path, actor in files:
        stored = stored_eof(path) if path.is_file() else None
        if stored is not None and stored > path.stat().st_size:
            exc = OSError("truncated file")
            raise _record_damaged(path, None, exc, run_dir) if actor is None else _trajectory_damaged(path, actor, exc)


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


def _record_damaged(path: Path, table: str | None, exc: BaseException, run_dir: Path | None = None) -> RunFileError:
    """run.h5 (or a node file of ``run_dir``) cannot be cut back for --resume: what is wrong, and the ways on."""
    run_dir, what = run_dir or path.parent, _what_is_wrong(path, table, exc)
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


def _fragments_on_file(parts: Sequence[Mapping[str, np.ndarray]], kept: Mapping[int, int]) -> list[np.ndarray]:
    """Which rows of each part to keep: ``parts`` are the ``actor`` and ``steps`` columns of the actors tables, run.h5's
    first, then the node files' in relay order; each actor in ``kept`` loses its rows whose fragments lie past the
    steps its file keeps. An actor's steps add up through the parts in that order, which is the order of its rows
    when it stays on one node (what a resume with the same ranks per node gives)."""
    sizes = [len(p["actor"]) for p in parts]
    actors = np.concatenate([np.asarray(p["actor"], dtype=np.int64) for p in parts])
    steps = np.maximum(np.concatenate([np.asarray(p["steps"], dtype=np.int64) for p in parts]), 0)
    keep = np.ones(len(actors), dtype=bool)
    for actor, limit in kept.items():
        mine = actors == actor
        reach = np.cumsum(np.where(mine, steps, 0))  # the actor's steps up to and including each row
        keep &= ~mine | (reach <= limit)
    return np.split(keep, np.cumsum(sizes)[:-1])


def _drop_rows(table: Table, keep: np.ndarray) -> int:
    """Drop the committed rows of ``table`` where ``keep`` is False (the others keep their order); rows dropped."""
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
