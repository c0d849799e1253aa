"""hpcrl.io.follow: a reader that keeps run.h5 open sees the committed rows grow, and no row past them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hpcrl.io import RunFile, RunFileError, follow, follow_trajectory, read_table, read_trajectory

RANK_MAP = {"rank": [0, 1, 2], "role": [0, 1, 2]}

# Commits 40 batches of 7 episode rows (time = row index), then starts a flush it never finishes, as a
# writer killed mid-flush does: every column grows and holds rows, the committed count does not.
WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from hpcrl.io import RunFile
    run = RunFile.create(sys.argv[1], "", {"rank": [0, 1, 2], "role": [0, 1, 2]}, flush_seconds=0)
    for b in range(40):
        t = np.arange(7 * b, 7 * b + 7, dtype="f8")
        run.append("episodes", {"time": t, "actor": 0, "env_index": 0, "return": t, "length": 1})
        run.flush()
        time.sleep(0.02)
    table = run.table("episodes")
    for d in table._columns.values():  # the first half of Table.flush, then the kill
        d.resize(400, axis=0)
        d[280:400] = -5.0
        d.flush()
    print("UNFINISHED", flush=True)
    time.sleep(60)
""")


def _concat(batches: list[dict]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.mark.slow
def test_follow_never_yields_rows_a_resume_cuts_back(tmp_path):
    path = tmp_path / "run.h5"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not path.exists() or path.stat().st_size == 0:
            assert proc.poll() is None and time.monotonic() < deadline, "writer did not start"
            time.sleep(0.05)
        time.sleep(0.2)  # the writer creates its tables before it turns SWMR on
        batches, rows = [], 0
        live = follow(path, "episodes", poll_seconds=0.01, idle_seconds=30, columns=["time", "return"])
        for batch in live:  # while the writer commits
            batches.append(batch)
            rows += len(batch["time"])
            if rows >= 280:
                break
        live.close()
        assert len(batches) > 1, "the follower should have seen the table grow in several batches"
        assert proc.stdout.readline().strip() == "UNFINISHED"  # 120 more rows in every column, not committed
        after = _concat(list(follow(path, "episodes", poll_seconds=0.01, idle_seconds=0.5, columns=["time"])))
    finally:
        proc.kill()
        proc.wait()
    seen = _concat(batches)
    assert seen["time"].tolist() == list(range(280))  # every committed row once, in order
    assert after["time"].tolist() == list(range(280))  # none of the 120 unfinished
    with RunFile.open_append(path):  # the resume cuts the unfinished rows
        pass
    final = read_table(path, "episodes", ["time", "return"])
    assert len(final["time"]) == 280
    np.testing.assert_array_equal(seen["return"], final["return"])


@pytest.mark.slow
def test_follow_a_serial_run_to_its_end(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", "--runner", "serial", "-o", "stop.total_env_steps=5000",
                             "-o", f"io.run_dir={run_dir}", "-o", "io.flush_seconds=0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "traj" / "actor-00000.h5").exists():
            assert proc.poll() is None, proc.stdout.read()[-2000:]
            assert time.monotonic() < deadline, "no trajectory file after 60 s"
            time.sleep(0.05)
        time.sleep(0.3)
        episodes = list(follow(run_dir, "episodes", poll_seconds=0.05, idle_seconds=60))
        steps = list(follow_trajectory(run_dir / "traj" / "actor-00000.h5", ["policy_version", "rewards"],
                                       poll_seconds=0.05, idle_seconds=60))
        assert proc.wait(60) == 0, proc.stdout.read()[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert len(episodes) > 1, "the run's episodes should arrive in several batches while it runs"
    seen = _concat(episodes)
    final = read_table(run_dir, "episodes")
    assert len(seen["time"]) == len(final["time"]) > 0
    for name in final:
        np.testing.assert_array_equal(seen[name], final[name])
    traj = _concat(steps)
    assert (traj["policy_version"] >= 0).all()
    np.testing.assert_array_equal(traj["rewards"], read_trajectory(run_dir / "traj" / "actor-00000.h5", ["rewards"])["rewards"])


def test_follow_names_a_table_it_does_not_know(tmp_path):
    path = tmp_path / "run.h5"
    RunFile.create(path, "", RANK_MAP).close()
    with pytest.raises(RunFileError, match="no table 'episode' in the hpcrl schema; tables: "):
        next(follow(path, "episode"))


def test_follow_a_file_from_before_the_live_counts(tmp_path):
    import h5py

    path = tmp_path / "run.h5"
    with RunFile.create(path, "", RANK_MAP) as run:
        run.append("episodes", {"time": np.arange(5.0), "actor": 0, "env_index": 0, "return": 1.0, "length": 1})
    with h5py.File(path, "a", locking=False) as f:
        del f["committed"]
    batches = list(follow(Path(path), "episodes", poll_seconds=0.01))
    assert _concat(batches)["time"].tolist() == [0, 1, 2, 3, 4]
