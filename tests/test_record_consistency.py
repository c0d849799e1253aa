"""The actors table and the trajectory files hold the same fragments, after a kill -9 and --resume, and
when a trajectory file is deleted during a run or before a resume.

An actor reports a fragment (its row in run.h5's ``actors`` table) before its steps are flushed to
``traj/actor-NNNNN.h5``; at a checkpoint the table is ahead of the files by up to ``io.flush_seconds``
of sampling. Before the fix a resume cut the files to their checkpointed steps and the table to its
checkpointed rows, so the table counted fragments no file held (85,376 vs 80,000 steps in a soak).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpcrl.cli import main as cli_main
from hpcrl.io import TrajectoryWriter, TrajLayout, read_table, read_trajectory, traj_filename
from hpcrl.runtime.record.checkpoint import load_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from test_runtime_serial import tiny  # noqa: E402


def _steps_agree(run_dir: Path, actors: int) -> None:
    """Every actor's rows report exactly the steps its file holds, and its fragments are numbered 0..n-1."""
    rows = read_table(run_dir / "run.h5", "actors")
    for a in range(actors):
        mine = rows["actor"] == a
        on_file = len(read_trajectory(run_dir / traj_filename(a), ["rewards"])["rewards"])
        assert int(rows["steps"][mine].sum()) == on_file, f"actor {a}: table {rows['steps'][mine].sum()} vs file {on_file}"
        frags = np.sort(rows["fragment"][mine])
        assert np.array_equal(frags, np.arange(len(frags))), f"actor {a}: fragments {frags}"


@pytest.mark.slow
def test_after_kill_9_and_resume_the_actors_table_counts_the_steps_the_files_hold(tmp_path, capfd):
    run_dir = tmp_path / "run"
    # trajectory files flushed every 4 s, checkpoints every 0.3 s: at every checkpoint the table is ahead. The kill
    # comes 1 s after a flush (the one that wrote the deleted file again), 3 s before the next, so the last
    # checkpoint before it holds fragments no file held yet even on a loaded machine (with 2 s flushes a flush
    # could land just before it)
    data = tiny(run_dir, stop={"total_env_steps": 10_000_000},
                io={"flush_seconds": 4.0, "checkpoint_every": 1, "checkpoint_min_seconds": 0.3})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    err = open(tmp_path / "first.err", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", str(tmp_path / "cfg.yaml")],
                            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    deleted = run_dir / traj_filename(0)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (deleted.is_file() and (run_dir / "checkpoints/latest.pt").is_file()):
            time.sleep(0.2)
        deleted.unlink()  # during the run: the actor writes it again from its open file at its next flush
        while time.monotonic() < deadline and not deleted.is_file():
            time.sleep(0.2)
        assert deleted.is_file(), "the deleted trajectory file was not written again"
        time.sleep(1.0)  # more checkpoints, each with fragments reported but not yet flushed
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err.seek(0)
    first = err.read()
    assert (f"hpcrl: actor 0: {deleted} was deleted while the run went on; written again from the open file "
            in first and "none lost" in first), first[-3000:]
    ckpt = load_checkpoint(run_dir)
    assert sum(ckpt["record"]["traj_steps"].values()) > 0
    rows, n = read_table(run_dir / "run.h5", "actors"), ckpt["record"]["tables"]["actors"]
    reported = {a: int(rows["steps"][:n][rows["actor"][:n] == a].sum()) for a in (0, 1)}
    # what the resume must reconcile: rows at the checkpoint for fragments whose steps no file held then
    assert any(reported[a] > ckpt["record"]["traj_steps"][a] for a in (0, 1)), (reported, ckpt["record"])

    lost_file = run_dir / traj_filename(1)
    lost = ckpt["record"]["traj_steps"][1]
    lost_file.unlink()  # before the resume: its steps are gone, and its rows must go too
    capfd.readouterr()  # the resume in this process (the serial runner needs none of its own)
    assert cli_main(["run", "--resume", str(run_dir), "-o", f"stop.total_env_steps={ckpt['env_steps'] + 300}"]) == 0
    stderr = capfd.readouterr().err
    warning = [line for line in stderr.splitlines() if str(lost_file) in line]
    assert warning == [f"hpcrl: --resume: {lost_file} is missing, not the {lost:,} the checkpoint counted: {lost:,} "
                       "steps of actor 1 are lost (its rows past them leave the actors table; the actor goes on from "
                       "what the file holds)"], stderr[-3000:]
    _steps_agree(run_dir, 2)


def test_a_trajectory_file_deleted_or_replaced_while_written_is_written_again_with_every_step(tmp_path, capfd):
    path = tmp_path / "traj" / "actor-00003.h5"
    w = TrajectoryWriter(path, TrajLayout(obs_shape=(4,), num_envs=2), actor=3, compression="none")

    def fragment(v: int) -> None:
        z = np.zeros((8, 2))
        w.append_fragment(np.full((8, 2, 4), v), z, z, z, z, z, z, v)

    fragment(0)
    w.flush()
    path.unlink()
    fragment(1)
    w.flush()
    assert capfd.readouterr().err == (f"hpcrl: actor 3: {path} was deleted while the run went on; written again from "
                                      "the open file (32 steps kept, none lost)\n")
    os.replace(path, tmp_path / "elsewhere.h5")
    path.write_bytes(b"not ours")
    fragment(2)
    w.close()
    assert "replaced by another file" in capfd.readouterr().err
    got = read_trajectory(path)
    np.testing.assert_array_equal(got["policy_version"], np.repeat([0, 1, 2], 16))
    assert got["obs"][-1].tolist() == [2.0] * 4
