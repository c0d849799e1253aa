"""hpcrl.io.follow: a reader that keeps run.h5 open sees the committed rows grow, and no row past them."""
from __future__ import annotations

import json
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


# Writes run.h5 and node files (actors.reports: summary) on command, one JSON list a line, answering "ok":
# ["run", times] and ["node", relay, start_unix, times] append and flush episode rows (actor = relay, 0 for run.h5);
# ["half", relay, start_unix] makes a node file as NodeFile.create does but stops before SWMR, ["finish", relay]
# goes on from there; ["close"] closes the node files, then run.h5 (as a run does). run.h5's start_unix is 1000.
NODE_WRITER = textwrap.dedent("""
    import json, os, sys
    import h5py
    from hpcrl.io import RunFile
    from hpcrl.io.h5format import WRITE_LIBVER
    from hpcrl.io.node_file import NODE_TABLES, NodeFile, node_filename
    from hpcrl.io.schema import SCHEMA_VERSION, TABLES
    from hpcrl.io.tables import Table
    run_dir = sys.argv[1]
    run = RunFile.create(run_dir + "/run.h5", "", {"rank": [0, 1, 2], "role": [0, 1, 2]}, flush_seconds=0,
                         unix=lambda: 1000.0)
    nodes, half = {}, {}
    def rows(times, actor):
        return {"time": times, "actor": actor, "env_index": 0, "return": [10.0 * t for t in times], "length": 1}
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd[0] == "run":
            run.append("episodes", rows(cmd[1], 0))
            run.flush()
        elif cmd[0] == "node":
            relay, start, times = cmd[1:]
            if relay not in nodes:
                nodes[relay] = NodeFile.create(run_dir, relay, unix=lambda: start)
            nodes[relay].append("episodes", rows(times, relay))
            nodes[relay].flush()
        elif cmd[0] == "half":
            os.makedirs(run_dir + "/nodes", exist_ok=True)
            f = h5py.File(run_dir + "/" + node_filename(cmd[1]), "w", libver=WRITE_LIBVER, locking=False)
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["start_unix"] = cmd[2]
            f.attrs["relay"] = cmd[1]
            for name in NODE_TABLES:
                Table.create(f, TABLES[name])
            f.flush()
            half[cmd[1]] = f
        elif cmd[0] == "finish":
            f = half.pop(cmd[1])
            nodes[cmd[1]] = NodeFile(f)
            f.swmr_mode = True
        elif cmd[0] == "close":
            for node in nodes.values():
                node.close()
            run.close()
        print("ok", flush=True)
""")


class _Writer:
    def __init__(self, run_dir: Path):
        run_dir.mkdir()
        self.proc = subprocess.Popen([sys.executable, "-c", NODE_WRITER, str(run_dir)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def __call__(self, *cmd) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok", f"writer failed at {cmd}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def test_follow_joins_the_node_files_rows_on_run_h5s_clock(tmp_path):
    run_dir = tmp_path / "run"
    write = _Writer(run_dir)
    try:
        write("run", [1.0, 6.0])
        live = follow(run_dir, "episodes", poll_seconds=0.01, idle_seconds=10, columns=["time", "actor", "return"])
        untimed = follow(run_dir, "episodes", poll_seconds=0.01, idle_seconds=10, columns=["actor", "return"])
        assert next(live)["time"].tolist() == [1.0, 6.0]
        assert next(untimed)["actor"].tolist() == [0, 0]
        write("node", 7, 1002.5, [0.5, 3.0])  # node time t is run time t + 2.5
        write("run", [2.0, 3.0])
        batch = next(live)  # one batch: both files' new rows, by time (equal times: run.h5's first)
        assert batch["time"].tolist() == [2.0, 3.0, 3.0, 5.5]
        assert batch["actor"].tolist() == [0, 0, 7, 7]
        assert batch["return"].tolist() == [20.0, 30.0, 5.0, 30.0]
        other = next(untimed)  # sorted by the times it does not yield
        assert list(other) == ["actor", "return"]
        assert other["return"].tolist() == [20.0, 30.0, 5.0, 30.0]
        write("node", 7, 1002.5, [4.0])
        write("run", [7.0])
        write("close")  # the node files' writers close first, then run.h5's
        started = time.monotonic()
        rest = list(live)
        assert time.monotonic() - started < 5, "follow should end when run.h5's writer closes, not when idle"
        assert [b["time"].tolist() for b in rest] == [[6.5, 7.0]]
        assert [b["actor"].tolist() for b in rest] == [[7, 0]]
        assert [b["actor"].tolist() for b in untimed] == [[7, 0]]
    finally:
        write.close()
    final = read_table(run_dir, "episodes", ["time"])  # the same clock as read_table's
    assert sorted([1.0, 6.0, 2.0, 3.0, 3.0, 5.5, 6.5, 7.0]) == final["time"].tolist()


def test_follow_tries_a_node_file_it_cannot_open_yet_at_the_next_poll(tmp_path):
    run_dir = tmp_path / "run"
    write = _Writer(run_dir)
    try:
        write("run", [1.0])
        live = follow(run_dir, "episodes", poll_seconds=0.01, idle_seconds=10, columns=["time", "actor"])
        assert next(live)["time"].tolist() == [1.0]
        write("half", 9, 1001.0)  # its writer has not switched to SWMR: no reader can open it yet
        write("run", [2.0])
        assert next(live)["time"].tolist() == [2.0]
        write("finish", 9)
        write("node", 9, 1001.0, [0.5])
        batch = next(live)
        assert batch["time"].tolist() == [1.5] and batch["actor"].tolist() == [9]
        write("close")
        assert list(live) == []
    finally:
        write.close()


def test_read_table_of_a_live_run_checks_its_held_node_files_in_one_probe(tmp_path, monkeypatch):
    """A live summary run's node files are held by their writers: read_table checks their metadata in one child
    process, not one each (at hundreds of nodes, minutes), and joins their rows."""
    from hpcrl.io import probe, read_table

    calls = []
    check = probe.check
    monkeypatch.setattr(probe, "check", lambda items, *a, **k: (calls.append(len(items)), check(items, *a, **k))[1])
    run_dir = tmp_path / "run"
    write = _Writer(run_dir)
    try:
        write("run", [1.0])
        for relay in (3, 5, 7):
            write("node", relay, 1000.0 + relay, [1.0])
        rows = read_table(run_dir, "episodes", ["time", "actor"])
        assert rows["time"].tolist() == [1.0, 4.0, 6.0, 8.0] and rows["actor"].tolist() == [0, 3, 5, 7]
        assert calls.count(3) == 1 and max(calls) == 3  # the three node files together, none alone
    finally:
        write.close()
