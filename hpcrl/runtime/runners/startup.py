"""Start-up time: seconds from the ``hpcrl run`` command to the first environment step.

The launcher notes when its process started (:func:`process_start_unix`); after the job it
reads the first environment step from the record and adds both to run.h5 as the attributes
``command_unix`` and ``startup_seconds`` (:func:`record_startup`). The first step is the start
of the earliest fragment an actor reported after the command: the row's time minus its
sampling and transport seconds (an upper bound by the few milliseconds an actor
spends writing the fragment to its trajectory file).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

_IMPORTED_UNIX = time.time()


def process_start_unix() -> float:
    """When this process was started (Unix s, 10 ms resolution on Linux), else when this module was imported."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat(5)
    except (OSError, ValueError, IndexError):
        return _IMPORTED_UNIX
    return time.time() - (uptime - started_after_boot)


def first_step_unix(run_h5: str | Path, after: float = 0.0) -> float | None:
    """Unix time of the first environment step of a fragment reported after ``after``, or None."""
    from hpcrl.io import read_attrs, read_table

    start = float(read_attrs(run_h5)["start_unix"])
    rows = read_table(run_h5, "actors", ["time", "sample_seconds", "transport_wait_seconds"])
    began = (start + rows["time"] - rows["sample_seconds"] - rows["transport_wait_seconds"])
    began = began[(start + rows["time"] >= after) & (began == began)]  # NaN-free rows of this job
    return float(began.min()) if began.size else None


def record_startup(run_dir: str | Path, command_unix: float) -> float | None:
    """Add ``command_unix`` and ``startup_seconds`` to RUN_DIR/run.h5; the seconds, or None without a fragment."""
    import h5py

    from hpcrl.io.h5format import APPEND_LIBVER
    from hpcrl.io.recovery import writer_has_open

    path = Path(run_dir) / "run.h5"
    try:
        if writer_has_open(path):  # its writer was killed (a rank, or the job ended by a watchdog): it may hold a
            return None  # half-written block, on which a reader waits (HDF5 retries it); a resume clears the flags
        first = first_step_unix(path, after=command_unix)
        if first is None:
            return None
        seconds = max(0.0, first - command_unix)
        with h5py.File(path, "r+", libver=APPEND_LIBVER, locking=False) as f:
            f.attrs["command_unix"] = command_unix
            f.attrs["startup_seconds"] = seconds
    except (OSError, KeyError, ValueError):  # no record (a failed job): nothing to add
        return None
    return seconds
