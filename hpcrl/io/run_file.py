"""``run.h5``: the parameter rank's record of a run (one writer, the parameter rank).

SWMR, deliberately. A plain HDF5 file read while its writer flushes can show a column whose
new extent is on disk before its data (tests/test_io.py caught readers seeing garbage that
way); SWMR orders the writes so a reader sees a consistent file at every moment. So: every
table and the trajectory view are created first, then ``swmr_mode = True``; afterwards
only appends (resize + write) happen. Rows are buffered in memory and reach the file only
in :meth:`RunFile.flush` (every ``cfg.io.flush_seconds`` through :meth:`maybe_flush`, and at
close), so a killed job leaves the file as of its last flush. Readers open with
``swmr=True, locking=False`` (:mod:`hpcrl.io.readers`); a plain ``h5py.File(path, "r")``
refuses a file whose writer is running or was killed ("file is already open for write"),
so scripts should pass ``swmr=True`` too. Each table's ``committed_rows`` attribute says how
many rows are fully written (see :mod:`hpcrl.io.tables`). A failed write (disk full ...)
raises :class:`~hpcrl.io.errors.RecordWriteError` once and ends the writer. Resuming after
a kill clears the superblock's write flags first (:mod:`hpcrl.io.recovery`). The file format is HDF5 1.10's (:mod:`hpcrl.io.h5format`).
SWMR needs POSIX write ordering: local disks, Lustre and GPFS give it; NFS does not (keep
run directories off NFS home directories). Writers open with ``locking=False`` too: on
Lustre and NFS, HDF5's file locks fail with "unable to lock file"; setting
``HDF5_USE_FILE_LOCKING=FALSE`` in the job script does the same for other HDF5 tools
(h5dump, h5ls, a user's own h5py scripts).

``trajectories/<field>`` are virtual datasets ``[num_actors, steps, ...]`` over the actors'
``traj/actor-NNNNN.h5`` files with an unlimited step axis: they are created once (the
source files need not exist yet) and grow with the sources without touching run.h5;
rows shorter than the longest actor are padded with NaN / -1 (``policy_version >= 0``
marks real steps). A concatenated [all steps] view would need a rewrite at every flush
(unlimited mappings cannot be placed one after another), so it is not offered.

API::

    run = RunFile.create(path, config_yaml: str, rank_map: dict[str, array-like], compression="gzip",
                         *, traj_layout: TrajLayout | None = None, num_actors: int | None = None,
                         flush_seconds: float = 5.0)
        # rank_map columns: schema.TABLES["rank_map"] (rank, role required; role 0/1/2 =
        # parameter/learner/actor); num_actors defaults to the count of role 2 rows.
        # traj_layout given: the trajectories/ view is created now (it cannot be added once SWMR is on,
        # except by open_append(path, traj_layout=...)).
    run = RunFile.open_append(path, flush_seconds=5.0, *, traj_layout=None, num_actors=None)
        # resume: same file, tables keep growing
    run.now() -> float                     # seconds since run start (the value for every `time` column)
    run.table(name) -> Table               # name in schema.TABLES; run.table("updates").append({...})
    run.append(name, rows) -> int          # same as run.table(name).append(rows)
    run.flush()                            # tables -> file, then h5py flush; RecordWriteError if that fails
    run.row_counts() -> dict[str, int]     # committed rows per table (call flush first to include the buffer)
    run.actor_steps() -> dict[int, int]    # committed env steps per actor in the actors table (read incrementally)
    run.maybe_flush(now=None) -> bool      # flush if flush_seconds passed (now: any clock, default monotonic)
    run.close()                            # flush and close; also a context manager
"""
from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import h5py
import numpy as np

import hpcrl
from hpcrl.io.errors import RunFileError, record_write_error
from hpcrl.io.h5format import APPEND_LIBVER, WRITE_LIBVER
from hpcrl.io.recovery import clear_write_flags
from hpcrl.io.schema import SCHEMA_VERSION, TABLES, TRAJ_FIELDS, TrajLayout, fill_value, traj_filename
from hpcrl.io.tables import FlushTimer, TimedFlushFile, Table, abandon_file, filter_kwargs

TRAJ_GROUP = "trajectories"


class RunFile(TimedFlushFile):
    def __init__(self, file: h5py.File, compression: str, flush_seconds: float,
                 unix: Callable[[], float] = time.time):
        self.file = file
        self._unix = unix
        self.path = Path(file.filename)
        self.compression = compression
        self.start_unix = float(file.attrs["start_unix"])
        self._tables: dict[str, Table] = {}
        self._timer = FlushTimer(flush_seconds)
        self._actor_steps: dict[int, int] = {}
        self._actor_rows = 0  # rows of the actors table summed into _actor_steps

    @classmethod
    def create(cls, path: str | Path, config_yaml: str, rank_map: Mapping[str, object], compression: str = "gzip",
               *, traj_layout: TrajLayout | None = None, num_actors: int | None = None,
               flush_seconds: float = 5.0, attrs: Mapping[str, object] | None = None,
               unix: Callable[[], float] = time.time) -> "RunFile":
        """A new run.h5; ``attrs`` are extra file attributes (e.g. ``runner``), written before SWMR starts;
        ``unix``: the run's clock (seconds since the epoch; a simulated run's is virtual)."""
        filter_kwargs(compression)  # validate before creating anything
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        f = h5py.File(path, "w", libver=WRITE_LIBVER, locking=False)
        try:
            now = unix()
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["hpcrl_version"] = hpcrl.__version__
            f.attrs["created"] = _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(timespec="seconds")
            f.attrs["start_unix"] = now
            f.attrs["config_yaml"] = config_yaml
            f.attrs["resumed_unix"] = np.zeros(0, "f8")
            f.attrs["compression"] = compression
            for key, value in (attrs or {}).items():
                f.attrs[key] = value
            run = cls(f, compression, flush_seconds, unix)
            for spec in TABLES.values():
                run._tables[spec.name] = Table.create(f, spec, compression)
            run.table("rank_map").append(dict(rank_map))
            if traj_layout is not None:
                roles = np.asarray(rank_map["role"])
                run._add_trajectory_view(traj_layout, int((roles == 2).sum()) if num_actors is None else num_actors)
            f.flush()
        except (OSError, RuntimeError) as exc:  # disk full at creation: one line, no destructor noise
            abandon_file(f)
            raise record_write_error(path, exc) from None
        except BaseException:
            abandon_file(f)
            raise
        run.flush()
        with run._writing():
            f.swmr_mode = True
        return run

    @classmethod
    def open_append(cls, path: str | Path, flush_seconds: float = 5.0, *, traj_layout: TrajLayout | None = None,
                    num_actors: int | None = None, note: str = "",
                    rank_map: Mapping[str, object] | None = None, unix: Callable[[], float] = time.time) -> "RunFile":
        """Reopen run.h5 to resume; ``note`` (e.g. what was cut back to the checkpoint, as JSON) is appended
        to the ``resumed`` attribute, one entry per resume beside ``resumed_unix``. A resumed job with
        more ranks (more actors) passes its ``rank_map``: the rows of ranks not listed yet are appended,
        and the trajectories view is widened to ``num_actors`` files (before SWMR starts: new
        datasets cannot be made after)."""
        path = Path(path)
        if not path.is_file():
            raise RunFileError(f"{path}: no such run file to resume")
        try:
            clear_write_flags(path)  # a killed writer left them; nobody else writes this file
            f = h5py.File(path, "a", libver=APPEND_LIBVER, locking=False)
        except (OSError, ValueError) as exc:
            raise RunFileError(f"{path}: cannot reopen for appending ({str(exc).splitlines()[0]})") from None
        version = f.attrs.get("schema_version")
        if version is None or int(version) != SCHEMA_VERSION:
            f.close()
            raise RunFileError(f"{path}: schema_version {version} cannot be resumed by schema {SCHEMA_VERSION}")
        run = cls(f, str(f.attrs.get("compression", "gzip")), flush_seconds, unix)
        with run._writing():  # a full disk here is a RecordWriteError like any later write
            f.attrs["resumed_unix"] = np.append(np.asarray(f.attrs.get("resumed_unix", []), "f8"), unix())
            notes = [str(n) for n in np.atleast_1d(f.attrs.get("resumed", np.array([], dtype=object)))]
            f.attrs["resumed"] = np.array([*notes, note], dtype=h5py.string_dtype())
            for spec in TABLES.values():
                if spec.name not in f:  # a table added to the schema after the file was made
                    run._tables[spec.name] = Table.create(f, spec, run.compression)
                    continue
                try:
                    run._tables[spec.name] = Table.open(f, spec, run.compression)
                except KeyError as exc:
                    f.close()
                    raise RunFileError(f"{path}: {exc.args[0]}") from None
            if rank_map is not None:
                known = len(run.table("rank_map").read()["rank"])
                new = {k: list(v)[known:] for k, v in rank_map.items()}
                if new["rank"]:
                    run.table("rank_map").append(new)
                    run.table("rank_map").flush()
            roles = run.table("rank_map").read()["role"]
            actors = int((roles == 2).sum()) if num_actors is None else num_actors
            if traj_layout is not None and (TRAJ_GROUP not in f or int(f[TRAJ_GROUP].attrs["num_actors"]) < actors):
                run._add_trajectory_view(traj_layout, actors)
            f.flush()
            f.swmr_mode = True
        return run

    def now(self) -> float:
        """Seconds since the run started (kept across resumes)."""
        return self._unix() - self.start_unix

    def table(self, name: str) -> Table:
        try:
            return self._tables[name]
        except KeyError:
            raise KeyError(f"no table {name!r}; tables: {', '.join(TABLES)}") from None

    def append(self, name: str, rows) -> int:
        self.check_writable()
        return self.table(name).append(rows)

    def row_counts(self) -> dict[str, int]:
        """Committed rows of every table (what a reader sees after the last flush)."""
        return {name: t.committed for name, t in self._tables.items()}

    def actor_steps(self) -> dict[int, int]:
        """Env steps per actor that the committed rows of the ``actors`` table report (their fragments' steps);
        only rows committed since the last call are read."""
        rows = self.table("actors").read_written(("actor", "steps"), self._actor_rows)
        for actor, steps in zip(rows["actor"].tolist(), rows["steps"].tolist()):
            self._actor_steps[actor] = self._actor_steps.get(actor, 0) + max(int(steps), 0)
        self._actor_rows += len(rows["actor"])
        return dict(self._actor_steps)

    def _add_trajectory_view(self, layout: TrajLayout, num_actors: int) -> None:
        """Create trajectories/<field> [num_actors, steps, ...] over traj/actor-NNNNN.h5 (sources may not exist yet)."""
        if TRAJ_GROUP in self.file:
            del self.file[TRAJ_GROUP]
        group = self.file.create_group(TRAJ_GROUP)
        group.attrs["num_actors"] = num_actors
        unlimited = h5py.h5s.UNLIMITED
        for fld in TRAJ_FIELDS:
            dtype, shape = layout.field_dtype(fld), layout.field_shape(fld)
            vds = h5py.VirtualLayout(shape=(num_actors, 1, *shape), maxshape=(num_actors, None, *shape), dtype=dtype)
            full = (slice(None),) * len(shape)
            for a in range(num_actors):
                src = h5py.VirtualSource(traj_filename(a), fld.name, shape=(1, *shape), maxshape=(None, *shape), dtype=dtype)
                vds[(a, slice(0, unlimited), *full)] = src[(slice(0, unlimited), *full)]
            d = group.create_virtual_dataset(fld.name, vds, fillvalue=fill_value(dtype))
            d.attrs["units"] = fld.unit
            d.attrs["description"] = f"{fld.meaning} [actor, step]; padding NaN / -1"

    def flush(self) -> None:
        """Write every table's buffered rows, then flush the HDF5 file to disk; RecordWriteError if that fails."""
        with self._writing():
            for t in self._tables.values():
                t.flush()
            self.file.flush()
