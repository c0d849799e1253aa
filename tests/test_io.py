"""hpcrl.io: tables round-trip, resume, readers beside a live writer, killed writers, the VDS, bad files."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcrl.errors import ConfigError
from hpcrl.io import (RunFile, RunFileError, TrajectoryWriter, TrajLayout, open_run_file, read_attrs, read_table,
                      read_trajectories, read_trajectory)
from hpcrl.io.schema import SCHEMA_VERSION, TABLES, TRAJ_FIELD_NAMES, render_markdown, traj_filename

REPO = Path(__file__).resolve().parents[1]
RANK_MAP = {"rank": [0, 1, 2, 3], "role": [0, 1, 2, 2], "group": [-1, 0, -1, -1], "index": [0, 0, 0, 1],
            "node": ["n0"] * 4}


def random_rows(spec, n, rng):
    rows = {}
    for c in spec.columns:
        kind = np.dtype(c.dtype).kind
        if kind == "f":
            rows[c.name] = rng.normal(size=n).astype(c.dtype)
        elif kind == "S":
            rows[c.name] = np.array([f"h{i}".encode() for i in range(n)], dtype=c.dtype)
        else:
            rows[c.name] = rng.integers(0, 100, size=n).astype(c.dtype)
    return rows


def test_every_table_round_trips_with_units(tmp_path):
    rng = np.random.default_rng(0)
    written = {}
    with RunFile.create(tmp_path / "run.h5", "name: t\n", RANK_MAP) as run:
        for name, spec in TABLES.items():
            if name == "rank_map":
                continue
            written[name] = [random_rows(spec, 5, rng), random_rows(spec, 3, rng)]
            for rows in written[name]:
                run.append(name, rows)
        assert len(run.table("updates")) == 8 and run.table("updates").pending == 8
    for name, parts in written.items():
        got = read_table(tmp_path / "run.h5", name)
        assert list(got) == list(TABLES[name].names)
        for col in got:
            np.testing.assert_array_equal(got[col], np.concatenate([p[col] for p in parts]))
    rank_map = read_table(tmp_path, "rank_map")  # a run directory works too
    assert rank_map["role"].tolist() == [0, 1, 2, 2] and rank_map["node"][0] == b"n0"
    attrs = read_attrs(tmp_path / "run.h5")
    assert attrs["schema_version"] == SCHEMA_VERSION and attrs["config_yaml"] == "name: t\n"
    with h5py.File(tmp_path / "run.h5", "r") as f:
        assert f["gradients/queue_seconds"].attrs["units"] == "s"
        assert list(f["gradients/reason"].attrs["codes"])[:2] == ["admitted", "too_stale"]
        assert f["updates/time"].compression == "gzip" and f["updates/time"].maxshape == (None,)


def test_append_list_of_dicts_fills_optional_and_rejects_mistakes(tmp_path):
    with RunFile.create(tmp_path / "run.h5", "", RANK_MAP, compression="lzf") as run:
        run.append("episodes", [{"time": 1.0, "actor": 0, "env_index": 2, "return": 10.0, "length": 10},
                                {"time": 2.0, "actor": 1, "env_index": 0, "return": 20.0, "length": 20}])
        with pytest.raises(ValueError, match="required column 'length'"):
            run.append("episodes", {"time": 1.0, "actor": 0, "env_index": 0, "return": 1.0})
        with pytest.raises(ValueError, match="unknown columns"):
            run.append("episodes", {"time": 1.0, "actor": 0, "env_index": 0, "return": 1.0, "length": 1, "x": 1})
        with pytest.raises(ValueError, match="one length"):
            run.append("episodes", {"time": [1.0, 2.0], "actor": [0, 1, 2], "env_index": 0, "return": 1.0, "length": 1})
    ep = read_table(tmp_path / "run.h5", "episodes")
    assert ep["return"].tolist() == [10.0, 20.0] and ep["policy_version"].tolist() == [-1, -1]
    with pytest.raises(ConfigError, match="io.compression"):
        RunFile.create(tmp_path / "x.h5", "", RANK_MAP, compression="zstd")


def test_resume_appends_to_the_same_tables(tmp_path):
    path = tmp_path / "run.h5"
    with RunFile.create(path, "", RANK_MAP, compression="none") as run:
        run.append("updates", {"time": [1.0, 2.0], "version": [1, 2], "round": 0, "num_gradients": 1})
        start = run.start_unix
    with RunFile.open_append(path) as run:
        assert run.start_unix == start and len(run.table("updates")) == 2
        run.append("updates", {"time": 3.0, "version": 3, "round": 1, "num_gradients": 2})
    up = read_table(path, "updates")
    assert up["version"].tolist() == [1, 2, 3] and up["num_gradients"].tolist() == [1, 1, 2]
    assert len(read_attrs(path)["resumed_unix"]) == 1
    assert len(read_table(path, "rank_map")["rank"]) == 4  # the rank map is not duplicated


def test_resume_adds_an_optional_column_the_file_was_made_without_and_refuses_a_required_one(tmp_path):
    path = tmp_path / "run.h5"
    load = {"time": 1.0, "interval_seconds": 0.5, "gradients": 3}
    with RunFile.create(path, "", RANK_MAP, compression="none") as run:
        run.append("parameter_load", load)
    with h5py.File(path, "a") as f:  # as a file made before the column was in the schema
        del f["parameter_load/cpu_seconds"]
    with RunFile.open_append(path) as run:
        run.append("parameter_load", {**load, "time": 2.0, "cpu_seconds": 0.25})
    rows = read_table(path, "parameter_load")
    assert rows["time"].tolist() == [1.0, 2.0] and np.isnan(rows["cpu_seconds"][0]) and rows["cpu_seconds"][1] == 0.25
    with h5py.File(path, "a") as f:
        assert "cpu_seconds" in list(f["parameter_load"].attrs["columns"])
        del f["parameter_load/gradients"]
    with pytest.raises(RunFileError, match="parameter_load' is missing columns: gradients"):
        RunFile.open_append(path)


WRITER = textwrap.dedent("""
    import sys, time
    from hpcrl.io import RunFile
    run = RunFile.create(sys.argv[1], "", {"rank": [0, 1, 2], "role": [0, 1, 2]})
    n = 0
    for i in range(int(sys.argv[2])):
        run.append("episodes", {"time": [n, n + 1], "actor": 0, "env_index": 0, "return": [n, n + 1], "length": 1})
        n += 2
        run.flush()
        print("flushed", n, flush=True)
        time.sleep(float(sys.argv[3]))
    run.append("episodes", {"time": -1.0, "actor": 0, "env_index": 0, "return": -1.0, "length": 1})
    print("unflushed", flush=True)
    time.sleep(60)
""")


def _start_writer(path, flushes, pause):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(flushes), str(pause)],
                            stdout=subprocess.PIPE, text=True, env=env)


def test_reader_while_a_writer_process_is_writing(tmp_path):
    path = tmp_path / "run.h5"
    proc = _start_writer(path, 40, 0.02)
    try:
        assert proc.stdout.readline().startswith("flushed")
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ep = read_table(path, "episodes", columns=["time", "return"])
            assert np.array_equal(ep["time"], np.arange(len(ep["time"]))), "rows out of order or torn"
            seen.append(len(ep["time"]))
            if seen[-1] >= 80:
                break
        assert seen == sorted(seen) and seen[-1] == 80 and len(set(seen)) > 1
    finally:
        proc.kill()
        proc.wait()


def test_file_of_a_killed_writer_holds_everything_flushed(tmp_path):
    path = tmp_path / "run.h5"
    proc = _start_writer(path, 3, 0.0)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[-1].startswith("unflushed")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    ep = read_table(path, "episodes")
    assert ep["time"].tolist() == list(range(6)) and len(ep["return"]) == 6
    data = path.read_bytes()  # a killed writer's file that was also cut short: one line, quickly
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(RunFileError, match="truncated"):
        read_table(tmp_path / "cut.h5", "episodes")
    with RunFile.open_append(path) as run:  # resume clears the killed writer's flags
        run.append("episodes", {"time": 6.0, "actor": 0, "env_index": 0, "return": 6.0, "length": 1})
    assert read_table(path, "episodes")["time"].tolist() == list(range(7))
    with h5py.File(path, "r") as f:  # closed cleanly: any plain reader opens it again
        assert f["episodes/time"].shape == (7,)


def _fragment(rng, T, N, obs_shape, base):
    return dict(obs=base + rng.normal(size=(T, N, *obs_shape)).astype("f4"),
                actions=rng.integers(0, 2, size=(T, N)), rewards=np.ones((T, N)),
                terminated=np.zeros((T, N), bool), truncated=np.zeros((T, N), bool),
                behaviour_logp=np.full((T, N), -0.7), values=np.zeros((T, N)), policy_version=np.arange(T))


def test_trajectory_files_and_virtual_view(tmp_path):
    rng = np.random.default_rng(1)
    layout = TrajLayout(obs_shape=(4,), action_shape=(), action_dtype="i8", num_envs=3)
    run = RunFile.create(tmp_path / "run.h5", "", RANK_MAP, traj_layout=layout)
    with h5py.File(tmp_path / "run.h5", "r", locking=False) as f:
        assert f["trajectories/obs"].shape == (2, 0, 4)  # sources do not exist yet
    frags = {0: [_fragment(rng, 5, 3, (4,), 0.0), _fragment(rng, 5, 3, (4,), 0.0)], 1: [_fragment(rng, 5, 3, (4,), 100.0)]}
    for actor, fs in frags.items():
        with TrajectoryWriter(tmp_path / traj_filename(actor), layout, compression="gzip", actor=actor) as w:
            for fr in fs:
                w.append_fragment(**fr)
    run.close()
    one = read_trajectory(tmp_path / traj_filename(0))
    assert list(one) == list(TRAJ_FIELD_NAMES) and one["obs"].shape == (30, 4)
    # time-major: step t*N + n is time t of env n
    np.testing.assert_array_equal(one["obs"][:15].reshape(5, 3, 4), frags[0][0]["obs"])
    assert one["env_index"][:6].tolist() == [0, 1, 2, 0, 1, 2] and one["policy_version"][:6].tolist() == [0, 0, 0, 1, 1, 1]
    with h5py.File(tmp_path / "run.h5", "r", locking=False) as f:
        obs, pv = f["trajectories/obs"][()], f["trajectories/policy_version"][()]
    assert obs.shape == (2, 30, 4)
    np.testing.assert_array_equal(obs[0], one["obs"])
    np.testing.assert_array_equal(obs[1, :15], frags[1][0]["obs"].reshape(15, 4))
    assert np.isnan(obs[1, 15:]).all() and (pv[1, 15:] == -1).all() and (pv >= 0).sum() == 45
    # the view grows with the source after a resume, without touching run.h5
    with TrajectoryWriter.open_append(tmp_path / traj_filename(1)) as w:
        assert w.num_steps == 15
        w.append_fragment(**_fragment(rng, 10, 3, (4,), 200.0))
    with h5py.File(tmp_path / "run.h5", "r", locking=False) as f:
        assert f["trajectories/obs"].shape == (2, 45, 4) and (f["trajectories/policy_version"][()] >= 0).sum() == 75
    with pytest.raises(ValueError, match="obs must have shape"):
        TrajectoryWriter(tmp_path / "bad.h5", layout).append_fragment(**_fragment(rng, 5, 2, (3,), 0.0))


def test_killed_actor_leaves_a_readable_trajectory_file(tmp_path):
    code = textwrap.dedent("""
        import sys, time, numpy as np
        from hpcrl.io import TrajectoryWriter, TrajLayout
        w = TrajectoryWriter(sys.argv[1], TrajLayout(obs_shape=(2,), num_envs=2))
        z = np.zeros((4, 2))
        for i in range(3):
            w.append_fragment(np.zeros((4, 2, 2)), z, z, z, z, z, z, i)
            w.flush()
        w.append_fragment(np.zeros((4, 2, 2)), z, z, z, z, z, z, 9)
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "a.h5")], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().startswith("ready")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    got = read_trajectory(tmp_path / "a.h5", ["policy_version"])
    assert got["policy_version"].tolist() == [0] * 8 + [1] * 8 + [2] * 8


def _episodes(n, start=0):
    return {"time": np.arange(start, start + n, dtype="f8"), "actor": 0, "env_index": 0, "return": 1.0, "length": 1}


def test_rows_past_committed_rows_are_never_claimed(tmp_path):
    path = tmp_path / "run.h5"
    with RunFile.create(path, "", RANK_MAP) as run:
        run.append("episodes", _episodes(10))
        run.flush()
        assert run.row_counts()["episodes"] == 10 and run.row_counts()["updates"] == 0
    with h5py.File(path, "a", locking=False) as f:  # a flush cut short: columns grew, the data never came
        assert int(f["episodes"].attrs["committed_rows"]) == 10
        for c in f["episodes"]:
            f["episodes"][c].resize(15, axis=0)
        assert np.isnan(f["episodes/time"][10:]).all()
    assert read_table(path, "episodes")["time"].tolist() == list(range(10))
    with h5py.File(path, "a", locking=False) as f:  # a file from before the attribute: fill rows still dropped
        del f["episodes"].attrs["committed_rows"]
    assert read_table(path, "episodes", ["env_steps"])["env_steps"].tolist() == [-1] * 10
    with RunFile.open_append(path) as run:  # resume cuts the unwritten rows and keeps appending after them
        assert len(run.table("episodes")) == 10
        run.append("episodes", _episodes(1, 10))
    assert read_table(path, "episodes")["time"].tolist() == list(range(11))
    with h5py.File(path, "a", locking=False) as f:  # mid-flush columns of unequal length: the shortest of all counts
        f["episodes/return"].resize(7, axis=0)
    assert len(read_table(path, "episodes", ["time"])["time"]) == 7


def test_steps_past_committed_steps_are_never_claimed(tmp_path):
    path = tmp_path / "a.h5"
    layout = TrajLayout(obs_shape=(2,), num_envs=2)
    with TrajectoryWriter(path, layout) as w:
        w.append_fragment(**_fragment(np.random.default_rng(0), 3, 2, (2,), 0.0))
    with h5py.File(path, "a", locking=False) as f:
        assert int(f.attrs["committed_steps"]) == 6
        for k in TRAJ_FIELD_NAMES:
            f[k].resize(9, axis=0)
    assert read_trajectory(path)["policy_version"].tolist() == [0, 0, 1, 1, 2, 2]
    with h5py.File(path, "a", locking=False) as f:  # a file from before the attribute
        del f.attrs["committed_steps"]
    assert len(read_trajectory(path, ["obs"])["obs"]) == 6
    with TrajectoryWriter.open_append(path) as w:
        assert w.num_steps == 6
    with h5py.File(path, "r", locking=False) as f:
        assert f["obs"].shape == (6, 2) and int(f.attrs["committed_steps"]) == 6


def test_trajectory_view_reads_after_an_actor_was_killed(tmp_path):
    layout = TrajLayout(obs_shape=(2,), num_envs=2)
    RunFile.create(tmp_path / "run.h5", "", RANK_MAP, traj_layout=layout).close()
    with TrajectoryWriter(tmp_path / traj_filename(0), layout, actor=0) as w:
        w.append_fragment(**_fragment(np.random.default_rng(0), 4, 2, (2,), 0.0))
    code = textwrap.dedent("""
        import sys, time, numpy as np
        from hpcrl.io import TrajectoryWriter, TrajLayout
        w = TrajectoryWriter(sys.argv[1], TrajLayout(obs_shape=(2,), num_envs=2), actor=1)
        z = np.zeros((4, 2))
        w.append_fragment(np.ones((4, 2, 2)), z, z, z, z, z, z, 7)
        w.flush()
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / traj_filename(1))], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().startswith("ready")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    with h5py.File(tmp_path / "run.h5", "r", locking=False) as f:  # HDF5's behaviour the readers work around
        with pytest.raises((OSError, RuntimeError), match="already open for write"):
            f["trajectories/policy_version"][()]
    pv = read_trajectories(tmp_path / "run.h5", ["policy_version"])["policy_version"]
    assert pv.shape == (2, 8) and pv[0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and pv[1].tolist() == [7] * 8
    with open_run_file(tmp_path) as f:
        assert (f["trajectories/obs"][1] == 1).all()


def test_truncated_foreign_and_missing_files_give_one_line(tmp_path):
    with RunFile.create(tmp_path / "run.h5", "", RANK_MAP) as run:
        run.append("episodes", {"time": np.arange(100.0), "actor": 0, "env_index": 0, "return": 1.0, "length": 1})
    data = (tmp_path / "run.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 3])
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = 1
    (tmp_path / "text.h5").write_text("hello")
    with h5py.File(tmp_path / "partial.h5", "w") as f:
        f.attrs["schema_version"] = SCHEMA_VERSION
    cases = {"cut.h5": "truncated or not HDF5", "foreign.h5": "not an hpcrl run file", "text.h5": "truncated or not HDF5",
             "partial.h5": "table 'episodes' is missing", "nothere.h5": "no such file"}
    for name, expected in cases.items():
        with pytest.raises(RunFileError) as info:
            read_table(tmp_path / name, "episodes")
        msg = str(info.value)
        assert str(tmp_path / name) in msg and expected in msg and "\n" not in msg, msg
    with pytest.raises(RunFileError, match="no such run file"):
        RunFile.open_append(tmp_path / "nothere.h5")
    with pytest.raises(RunFileError, match="schema_version"):
        RunFile.open_append(tmp_path / "foreign.h5")


def test_schema_doc_is_in_sync():
    doc = REPO / "docs" / "hdf5-schema.md"
    assert doc.read_text() == render_markdown(), "run: python -m hpcrl.io.schema > docs/hdf5-schema.md"
