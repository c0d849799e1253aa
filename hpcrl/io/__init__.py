"""HDF5 record of a run: schema (as data), run.h5 writer, per-actor trajectory writers, readers.

See docs/hdf5-schema.md for every table and column. The names below are imported on first
use, so ``hpcrl.io.run_lock`` or ``hpcrl.io.schema`` do not import h5py (the launcher and the
learner ranks never need it).
"""
from importlib import import_module

_WHERE = {
    "RecordDamagedError": "errors", "RecordWriteError": "errors", "RunFileError": "errors",
    "follow": "follow", "follow_trajectory": "follow",
    "convert_file": "convert", "convert_run": "convert",
    "open_run_file": "readers", "read_attrs": "readers", "read_table": "readers",
    "read_trajectories": "readers", "read_trajectory": "readers",
    "record_counts": "rollback", "truncate_record": "rollback",
    "RunFile": "run_file", "RunLock": "run_lock",
    "SCHEMA_VERSION": "schema", "TABLES": "schema", "TrajLayout": "schema", "traj_filename": "schema",
    "Table": "tables", "TrajectoryWriter": "traj_file",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'hpcrl.io' has no attribute {name!r}")
    value = getattr(import_module(f"hpcrl.io.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
