"""Read an hpcrl run directory with h5py alone: live runs, killed runs, one-line errors.

A run directory holds run.h5 (tables, see docs/hdf5-schema.md in the hpcrl repository) and
traj/actor-NNNNN.h5. The writers use SWMR: a file whose writer is running, or was killed,
refuses a plain open ("already open for write"), so it is opened as an SWMR reader then.
A table is read up to its ``committed_rows`` attribute and the shortest column; rows whose
required columns hold fill values (never written) are left out. Each of these is reported in
``Run.notes``, so a run is called complete only when every table was whole.
"""
from __future__ import annotations

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
            if "already open for write" in last:
                if _truncated(path):
                    last = "truncated file: superblock end of file lies beyond the file size"
                else:
                    try:
                        return h5py.File(path, "r", swmr=True, locking=False), True
                    except OSError as exc2:
                        last = str(exc2).splitlines()[0]
        time.sleep(0.1 * (attempt + 1))  # a writer may be mid-flush
    why = "empty file" if path.stat().st_size == 0 else "truncated or not HDF5"
    raise AnalysisError(f"{path}: cannot be read as an {what} ({why}: {last})")


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
                   "actor_parks")
"""Tables a run has only when it used the feature (eval.episodes > 0, algo.sharing, algo.actor_scaling) or
when its hpcrl wrote them (the learner cycle profile, parameter load and elastic events came later): no note
when absent."""
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
    """Read every table of RUN_DIR/run.h5 (or the run.h5 path itself)."""
    path = Path(run_dir)
    h5 = path / "run.h5" if path.is_dir() else path
    for attempt in range(5):
        try:
            f, live = open_h5(h5)
            with f:
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
                for name in TABLE_NAMES:
                    if name in f:
                        run.tables[name], problems = _read_group(f, name)
                        run.notes += problems
                    else:
                        run.notes.append(f"table '{name}' missing")
                for name in OPTIONAL_TABLES:
                    if name in f:
                        run.tables[name], problems = _read_group(f, name)
                        run.notes += problems
                if "episodes" not in f:
                    raise AnalysisError(f"{h5}: table 'episodes' is missing (not a complete hpcrl run file)")
                return run
        except OSError as exc:  # raced a flush while reading data: read again
            if attempt == 4:
                raise AnalysisError(f"{h5}: cannot be read ({str(exc).splitlines()[0]})") from None
            time.sleep(0.2)
    raise AssertionError("unreachable")
