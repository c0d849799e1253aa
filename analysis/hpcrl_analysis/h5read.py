"""Read an hpcrl run directory with h5py alone: live runs, killed runs, damaged runs, one-line errors.

A run directory holds run.h5 (tables, see docs/hdf5-schema.md in the hpcrl repository),
traj/actor-NNNNN.h5 and, with ``actors.reports: summary``, nodes/node-RRRRR.h5: each node's rows of the
``actors`` and ``episodes`` tables, whose times count from the node file's own ``start_unix``; they are
joined to run.h5's tables, shifted to its clock and sorted by time (:func:`join_node_files`).
The writers use SWMR: a file whose writer is running, or was killed, refuses a plain open
("already open for write"), so it is opened as an SWMR reader then. Such a
reader retries metadata whose checksum does not match for ever (HDF5 takes it for a block being
written), so a damaged file would hang it: before an SWMR open, this file runs itself as a child
process that reads every table's metadata and is killed after HPCRL_READ_TIMEOUT seconds (default
30). A plain open fails at once on damage. Either way a damaged file is one line naming the table.
A table is read up to its ``committed_rows`` attribute and the shortest column; rows whose
required columns hold fill values (never written) are left out. Each of these is reported in
``Run.notes``, and so is a trajectory file cut short, damaged or holding fewer steps than its rows report
(:func:`trajectory_notes`), so a run is called complete only when every table and file was whole.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

SUPPORTED_SCHEMA = 1
_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class AnalysisError(Exception):
    """One line naming the file and what is missing; printed without a traceback."""


def _truncated(path: Path) -> bool:
    """A v2/v3 superblock whose end-of-file address lies beyond the file size (file cut short)."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
    at = next((o for o in (0, 512, 1024, 2048) if head[o:o + 8] == _SIGNATURE), None)
    if at is None or head[at + 8] not in (2, 3):
        return False
    o = head[at + 9]
    base = int.from_bytes(head[at + 12: at + 12 + o], "little")
    eof = int.from_bytes(head[at + 12 + 2 * o: at + 12 + 3 * o], "little")
    return base + eof > path.stat().st_size


def open_h5(path: Path, what: str = "hpcrl run file", retries: int = 5) -> tuple[h5py.File, bool]:
    """Open read-only without file locking (Lustre); as an SWMR reader if a writer holds it.

    Returns (file, live): live is True when a writer has the file open or was killed with it open.
    """
    if not path.is_file():
        raise AnalysisError(f"{path}: no such file (expected an {what})")
    last = ""
    for attempt in range(retries):
        try:
            return h5py.File(path, "r", locking=False), False
        except OSError as exc:
            last = str(exc).splitlines()[0]
            if "signature not found" in last:
                break
            if "checksum" in last:  # a plain open reads the superblock once: damage, not a race
                raise AnalysisError(f"{path}: file is damaged ({last})")
            if "already open for write" in last:
                if _truncated(path):
                    last = "truncated file: superblock end of file lies beyond the file size"
                else:
                    check_metadata(path)
                    try:
                        return h5py.File(path, "r", swmr=True, locking=False), True
                    except OSError as exc2:
                        last = str(exc2).splitlines()[0]
        time.sleep(0.1 * (attempt + 1))  # a writer may be mid-flush
    why = "empty file" if path.stat().st_size == 0 else "truncated or not HDF5"
    raise AnalysisError(f"{path}: cannot be read as an {what} ({why}: {last})")


def _walk(f: h5py.File, at) -> None:
    """Read the metadata of every table (attributes, headers, chunk indexes), calling at(name) before each."""
    dict(f.attrs)
    for name in f:
        if name != "trajectories":  # the virtual view over the actors' files: never read here
            at(name)
            _touch(f[name])


def _touch(obj) -> None:
    dict(obj.attrs)
    if isinstance(obj, h5py.Group):
        for name in obj:
            _touch(obj[name])
    elif obj.chunks is not None:
        obj.id.get_num_chunks()  # visits every block of the chunk index
    else:
        obj.shape  # noqa: B018


def check_metadata(path: Path) -> None:
    """Read run.h5's metadata as an SWMR reader in a child process within HPCRL_READ_TIMEOUT seconds;
    AnalysisError naming the table it could not read, or was still reading at the limit."""
    text = os.environ.get("HPCRL_READ_TIMEOUT") or "30"
    try:
        limit = float(text)
    except ValueError:
        limit = 0.0
    if not limit > 0:
        raise AnalysisError(f"HPCRL_READ_TIMEOUT={text!r}: expected seconds > 0")
    cmd = [sys.executable, str(Path(__file__).resolve()), str(path)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    start, ready_at = time.monotonic(), None
    while True:  # the limit counts once the child has loaded h5py ("ready"; at most 60 s)
        try:
            out = proc.communicate(timeout=0.05 if ready_at is None else max(ready_at + limit - time.monotonic(), 0))[0]
            code = proc.returncode
            break
        except subprocess.TimeoutExpired as exc:
            now = time.monotonic()
            if ready_at is None and b"ready" in (exc.stdout or b""):
                ready_at = now
            if now >= (ready_at + limit if ready_at is not None else start + 60):
                proc.kill()
                out, code = proc.communicate()[0], None
                break
    lines = out.decode(errors="replace").splitlines()
    if "ready" not in lines:
        if code is None:
            raise AnalysisError(f"{path}: not read: the process that checks it first did not start within 60 s")
        return  # no child ran (no h5py for this interpreter ...): read unchecked
    if lines[-1] == "ok":
        return
    report = json.loads(lines[-1]) if lines[-1].startswith("{") else {"table": ""}
    if code is None:
        why = (f"HDF5 still reading its metadata after {limit:g} s: as a reader of a file a writer holds, it retries "
               "a block whose checksum does not match for ever; HPCRL_READ_TIMEOUT sets the limit")
    else:
        why = report.get("error") or f"reading it ended the process, exit code {code}"
    where = f"table '{report['table']}'" if report["table"] else "file"
    raise AnalysisError(f"{path}: {where} is damaged ({why})")


def _check_child(path: str) -> int:
    """The child of :func:`check_metadata`: prints ready, then a JSON line per table, then ok (or the error)."""
    print("ready", flush=True)
    report = {"table": ""}

    def at(name: str) -> None:
        report["table"] = name
        print(json.dumps(report), flush=True)

    print(json.dumps(report), flush=True)
    try:
        with h5py.File(path, "r", swmr=True, locking=False) as f:
            _walk(f, at)
    except Exception as exc:  # noqa: BLE001  (any failure is the answer)
        report["error"] = _first_line(exc)
        print(json.dumps(report), flush=True)
        return 1
    print("ok", flush=True)
    return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass
class Run:
    """Everything the analysis needs from one run directory, as numpy arrays."""

    path: Path
    label: str
    attrs: dict
    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What was missing or partial (reported, not fatal)."""
    cache: dict = field(default_factory=dict, repr=False)

    def table(self, name: str) -> dict[str, np.ndarray]:
        return self.tables.get(name, {})

    def rows(self, name: str) -> int:
        t = self.tables.get(name) or {}
        return len(next(iter(t.values()))) if t else 0


TABLE_NAMES = ("rank_map", "updates", "gradients", "episodes", "learner_activity", "rounds", "actors")
OPTIONAL_TABLES = ("eval_episodes", "learner_cycles", "parameter_load", "elastic_events", "policy_map", "actor_scaling",
                   "actor_parks", "actor_joins", "weight_fetches", "allocations")
"""Tables a run has only when it used the feature (eval.episodes > 0, algo.sharing, algo.actor_scaling,
actors.elastic) or
when its hpcrl wrote them (the learner cycle profile, parameter load, elastic events and weight fetches came
later; allocations only inside a batch job): no note when absent."""
REQUIRED = {  # columns every real row fills (docs/hdf5-schema.md, "required"); a fill value there = never written
    "rank_map": ("rank", "role"),
    "updates": ("time", "version", "round", "num_gradients"),
    "gradients": ("time", "group", "seq", "base_version", "admitted", "reason"),
    "episodes": ("time", "actor", "env_index", "return", "length"),
    "learner_activity": ("time_start", "time_end", "group", "compute_seconds"),
    "rounds": ("round", "start", "duration"),
    "actors": ("time", "actor", "fragment"),
    "eval_episodes": ("time", "round", "policy_version", "env_index", "return", "length"),
    "learner_cycles": ("time", "group", "seq", "cycle_seconds"),
    "parameter_load": ("time", "interval_seconds", "gradients"),
    "elastic_events": ("time", "group", "action", "reason"),
    "policy_map": ("round", "agent", "old_policy", "new_policy", "reason"),
    "actor_scaling": ("round", "active"),
    "actor_parks": ("time", "actor", "reason"),
    "actor_joins": ("time", "actor", "action", "reason"),
    "weight_fetches": ("version", "actor_fetches", "actor_bytes", "learner_fetches", "learner_bytes"),
    "allocations": ("time", "scheduler", "job_id"),
}


def _is_fill(d: h5py.Dataset, values: np.ndarray) -> np.ndarray:
    """Where a required column holds its dataset's fill value, if that is one no real row holds (NaN, -1)."""
    fill = d.fillvalue
    if values.dtype.kind == "f" and np.isnan(fill):
        return np.isnan(values)
    if values.dtype.kind in "iu" and fill == -1:
        return values == -1
    return np.zeros(len(values), bool)


def _read_group(f: h5py.File, name: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """A table's columns and what was wrong with it (empty when the table is whole)."""
    g = f[name]
    cols = [c.decode() if isinstance(c, bytes) else str(c) for c in g.attrs.get("columns", list(g.keys()))]
    cols = [c for c in cols if c in g]
    lengths = [g[c].shape[0] for c in cols]
    n = min(lengths, default=0)  # columns cut to the shortest
    problems = []
    if "committed_rows" in g.attrs and int(g.attrs["committed_rows"]) < n:
        n = int(g.attrs["committed_rows"])
    if max(lengths, default=0) > n:
        problems.append(f"table '{name}': {max(lengths) - n} rows past the {n} fully written left out")
    data = {c: g[c][:n] for c in cols}
    unwritten = np.zeros(n, bool)
    for c in REQUIRED.get(name, ()):
        if c in data:
            unwritten |= _is_fill(g[c], data[c])
    if unwritten.any():
        problems.append(f"table '{name}': {int(unwritten.sum())} of {n} rows hold fill values (never written), left out")
        data = {c: v[~unwritten] for c, v in data.items()}
    return data, problems


def trajectory_notes(run_dir: Path, actors: dict[str, np.ndarray]) -> list[str]:
    """What is wrong with the run's traj/actor-NNNNN.h5 files: cut short (fewer bytes than the superblock's end of
    file), not HDF5, damaged, or holding fewer steps than the actor's rows in the 'actors' table report. A file a
    writer holds is only checked for its size. Empty when every file is whole."""
    notes = []
    for path in sorted((run_dir / "traj").glob("actor-*.h5")):
        name = f"trajectory file traj/{path.name}"
        size = path.stat().st_size
        if size == 0:
            notes.append(f"{name} is empty")
            continue
        eof = _stored_eof(path)
        if eof is None:
            notes.append(f"{name} is not an HDF5 file")
            continue
        if eof > size:
            notes.append(f"{name} is cut short ({size:,} of {eof:,} bytes): its steps are not all there")
            continue
        try:
            with h5py.File(path, "r", locking=False) as f:
                held = f.attrs.get("committed_steps")
        except OSError as exc:
            if "already open for write" not in str(exc):
                notes.append(f"{name} is damaged ({_first_line(exc)})")
            continue
        try:
            actor = int(path.stem.split("-")[1])
        except (IndexError, ValueError):
            continue
        if held is not None and len(actors.get("actor", ())) and "steps" in actors:
            reported = int(np.maximum(actors["steps"][actors["actor"] == actor], 0).sum())
            if int(held) < reported:
                notes.append(f"{name} holds {int(held):,} steps, fewer than the {reported:,} its rows in "
                             "table 'actors' report")
    return notes


def _stored_eof(path: Path) -> int | None:
    """The end-of-file address a v2/v3 superblock records (the size the file must have); the file's own size for
    older superblocks; None without an HDF5 signature."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
    at = next((o for o in (0, 512, 1024, 2048) if head[o:o + 8] == _SIGNATURE), None)
    if at is None:
        return None
    if head[at + 8] not in (2, 3):
        return path.stat().st_size
    o = head[at + 9]
    base = int.from_bytes(head[at + 12: at + 12 + o], "little")
    return base + int.from_bytes(head[at + 12 + 2 * o: at + 12 + 3 * o], "little")


def _label(attrs: dict, path: Path) -> str:
    text = attrs.get("config_yaml", "")
    try:
        import yaml  # optional: only to name the run nicely
        cfg = yaml.safe_load(text) or {}
        policy = (cfg.get("aggregation") or {}).get("policy")
        name = cfg.get("name") or path.name
        return f"{name} ({policy})" if policy else str(name)
    except Exception:
        return path.name


def load_run(run_dir: str | Path, label: str | None = None) -> Run:
    """Read every table of RUN_DIR/run.h5 (or the run.h5 path itself), with the node files' rows joined."""
    path = Path(run_dir)
    h5 = path / "run.h5" if path.is_dir() else path
    run = _read_retrying(h5, "hpcrl run file", lambda f, live, at: _read_run(f, live, at, h5, label))
    join_node_files(run)
    run.notes += trajectory_notes(h5.parent, run.table("actors"))
    return run


def _read_retrying(path: Path, what: str, read):
    """``read(f, live, at)`` on ``path`` opened by :func:`open_h5` (``at["table"]``: what is being read, for the
    message when h5py fails). Damaged metadata is one line naming the table; while a writer holds the file, a
    failure may be a race with its flush, so the file is read again first."""
    for attempt in range(5):
        f, live = open_h5(path, what)
        at = {"table": ""}
        try:
            with f:
                return read(f, live, at)
        except (OSError, KeyError, RuntimeError) as exc:
            if live and attempt < 4:
                time.sleep(0.2)
                continue
            where = f"table '{at['table']}'" if at["table"] else "file"
            raise AnalysisError(f"{path}: {where} is damaged ({_first_line(exc)})") from None
    raise AssertionError("unreachable")


def _read_run(f: h5py.File, live: bool, at: dict, h5: Path, label: str | None) -> Run:
    if "schema_version" not in f.attrs:
        raise AnalysisError(f"{h5}: not an hpcrl run file (no schema_version attribute)")
    version = int(f.attrs["schema_version"])
    if version > SUPPORTED_SCHEMA:
        raise AnalysisError(f"{h5}: schema_version {version} is newer than this script's {SUPPORTED_SCHEMA}; "
                            "use the analysis folder of the hpcrl that wrote it")
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    run = Run(h5.parent, label or _label(attrs, h5.parent), attrs)
    if live:
        run.notes.append("writer still running or killed: data up to its last flush")
    present = set(f)  # the root group's links
    for table in TABLE_NAMES + OPTIONAL_TABLES:
        if table in present:
            at["table"] = table
            run.tables[table], problems = _read_group(f, table)
            run.notes += problems
        elif table in TABLE_NAMES:
            run.notes.append(f"table '{table}' missing")
    at["table"] = ""
    if "episodes" not in present:
        raise AnalysisError(f"{h5}: table 'episodes' is missing (not a complete hpcrl run file)")
    return run


NODE_TABLES = ("actors", "episodes")
"""The tables whose rows a node file holds (hpcrl.io.node_file)."""
_NODE_NAME = re.compile(r"node-(\d+)\.h5")


def node_files(run_dir: Path) -> list[Path]:
    """RUN_DIR/nodes/node-RRRRR.h5 in relay order."""
    folder = run_dir / "nodes"
    found = [(int(m.group(1)), p) for p in (folder.glob("node-*.h5") if folder.is_dir() else ())
             if (m := _NODE_NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def join_node_files(run: Run) -> None:
    """Add each node file's ``actors`` and ``episodes`` rows to the run's: a node file's time ``t`` is run.h5's
    ``t + node start_unix - run start_unix``; the rows are sorted stably by time (equal times: run.h5's first,
    then the nodes' in relay order). What was wrong with a node file goes to ``run.notes``."""
    paths = node_files(run.path)
    if not paths:
        return
    if "start_unix" not in run.attrs:
        raise AnalysisError(f"{run.path / 'run.h5'}: no start_unix attribute, so its node files' rows "
                            "cannot be put on its clock")
    parts = {name: [run.tables[name]] if run.tables.get(name) else [] for name in NODE_TABLES}
    live = 0
    for path in paths:
        start, tables, notes, held = _read_retrying(path, "hpcrl node file", _read_node)
        live += held
        run.notes += [f"node file nodes/{path.name}: {note}" for note in notes]
        for name, rows in tables.items():
            if rows:
                parts[name].append({**rows, "time": rows["time"] + (start - float(run.attrs["start_unix"]))})
    if live:
        run.notes.append(f"{live} node file{'s' if live > 1 else ''}: writer still running or killed: "
                         "data up to its last flush")
    for name, tables in parts.items():
        if not tables:
            continue
        columns = [c for c in tables[0] if all(c in t for t in tables)]
        order = np.argsort(np.concatenate([t["time"] for t in tables]), kind="stable")
        run.tables[name] = {c: np.concatenate([t[c] for t in tables])[order] for c in columns}


def _read_node(f: h5py.File, live: bool, at: dict) -> tuple[float, dict, list[str], bool]:
    """A node file's start_unix, its tables, what was wrong with them, and whether a writer holds it."""
    if "start_unix" not in f.attrs:
        raise AnalysisError(f"{f.filename}: not an hpcrl node file (no start_unix attribute)")
    present = set(f)
    tables, notes = {}, []
    for name in NODE_TABLES:
        if name not in present:
            notes.append(f"table '{name}' missing")
            continue
        at["table"] = name
        tables[name], problems = _read_group(f, name)
        notes += problems
    at["table"] = ""
    return float(f.attrs["start_unix"]), tables, notes, live


if __name__ == "__main__":  # the child of check_metadata
    sys.exit(_check_child(sys.argv[1]))
