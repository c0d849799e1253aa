"""HDF5 record of a run: schema (as data), run.h5 writer, per-actor trajectory writers, readers.

See docs/hdf5-schema.md for every table and column. Importing this package imports h5py and
numpy only.
"""
from hpcrl.io.errors import RecordWriteError, RunFileError
from hpcrl.io.readers import open_run_file, read_attrs, read_table, read_trajectories, read_trajectory
from hpcrl.io.rollback import record_counts, truncate_record
from hpcrl.io.run_file import RunFile
from hpcrl.io.run_lock import RunLock
from hpcrl.io.schema import SCHEMA_VERSION, TABLES, TrajLayout, traj_filename
from hpcrl.io.tables import Table
from hpcrl.io.traj_file import TrajectoryWriter

__all__ = [
    "SCHEMA_VERSION", "TABLES", "RecordWriteError", "RunFile", "RunFileError", "RunLock", "Table", "TrajLayout",
    "TrajectoryWriter", "open_run_file", "read_attrs", "read_table", "read_trajectories", "read_trajectory",
    "record_counts", "traj_filename", "truncate_record",
]
