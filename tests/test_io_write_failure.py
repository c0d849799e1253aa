"""A full disk ends the record's writers loudly: one RecordWriteError line, no destructor noise, no rows of fill values.

The disk is a 5 MB tmpfs mounted for this module (needs root; skipped with the reason otherwise).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcrl.io import read_table, read_trajectory

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    where = tmp_path_factory.mktemp("tmpfs")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(where)], capture_output=True, text=True)
    if proc.returncode != 0:
        reason = f"cannot mount a 5 MB tmpfs ({(proc.stderr or proc.stdout).strip() or 'mount failed'}); needs root"
        print(reason)
        pytest.skip(reason)
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


WRITE_UNTIL_FULL = textwrap.dedent("""
    import sys, numpy as np
    from hpcrl.io import RecordWriteError, RunFile, TrajectoryWriter, TrajLayout
    kind, path = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    if kind == "run":
        w = RunFile.create(path, "", {"rank": [0, 1, 2], "role": [0, 1, 2]}, compression="none")
        def add(i, k):
            w.append("episodes", {"time": np.arange(i, i + k, dtype="f8"), "actor": 0, "env_index": 0,
                                  "return": rng.normal(size=k), "length": 1, "env_steps": np.arange(i, i + k)})
        committed = lambda: w.row_counts()["episodes"]
    else:
        w = TrajectoryWriter(path, TrajLayout(obs_shape=(8,), num_envs=4), compression="none")
        def add(i, k):
            T = k // 4
            z = rng.normal(size=(T, 4))
            w.append_fragment(rng.normal(size=(T, 4, 8)), z, z, z, z, z, z, np.arange(i // 4, i // 4 + T))
        committed = lambda: w.committed
    i, k = 0, 2000
    try:
        for _ in range(100000):
            add(i, k)
            i += k
            w.flush()
    except RecordWriteError as exc:
        print("COMMITTED", committed(), flush=True)
        print("ERROR", exc, flush=True)
        try:
            add(i, k)
            w.flush()
        except RecordWriteError as again:
            print("AGAIN", again is exc, flush=True)
        w.close()  # a no-op now: nothing more reaches the file
        sys.exit(3)
    print("never full", flush=True)
""")


def _fill(kind: str, path: Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-c", WRITE_UNTIL_FULL, kind, str(path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = proc.stdout.splitlines()
    assert proc.returncode == 3, f"rc {proc.returncode}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}"
    assert "Exception ignored" not in proc.stderr and len(proc.stderr.splitlines()) < 5, proc.stderr[-3000:]
    error = next(line for line in lines if line.startswith("ERROR "))
    assert error == f"ERROR disk full at {path} (No space left on device); the record keeps what was flushed before"
    assert "AGAIN True" in lines  # every later call raises the same error
    return int(next(line for line in lines if line.startswith("COMMITTED ")).split()[1]), error


def test_full_disk_ends_run_h5_with_one_line_and_keeps_every_flushed_row(small_disk):
    path = small_disk / "run.h5"
    committed, _ = _fill("run", path)
    assert committed > 10000  # several flushes went through before the disk filled
    ep = read_table(path, "episodes")
    assert len(ep["time"]) == committed  # no row of fill values is claimed
    np.testing.assert_array_equal(ep["time"], np.arange(committed, dtype="f8"))
    np.testing.assert_array_equal(ep["env_steps"], np.arange(committed))
    assert np.isfinite(ep["return"]).all()
    assert read_table(path, "rank_map")["role"].tolist() == [0, 1, 2]
    with h5py.File(path, "r", swmr=True, locking=False) as f:  # as the schema doc says to read it
        assert int(f["episodes"].attrs["committed_rows"]) == committed
        assert min(f[f"episodes/{c}"].shape[0] for c in f["episodes"]) >= committed
    path.unlink()


def test_full_disk_ends_a_trajectory_file_with_one_line_and_keeps_every_flushed_step(small_disk):
    path = small_disk / "actor-00000.h5"
    committed, _ = _fill("traj", path)
    assert committed > 10000
    got = read_trajectory(path)
    assert got["obs"].shape == (committed, 8) and np.isfinite(got["obs"]).all()
    np.testing.assert_array_equal(got["policy_version"], np.arange(committed) // 4)
    assert got["env_index"][:8].tolist() == [0, 1, 2, 3] * 2
    path.unlink()
