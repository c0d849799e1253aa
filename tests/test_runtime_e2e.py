"""The whole MPI job through `hpcrl run`: files written, a failing rank, SIGTERM then --resume.

Each test starts `hpcrl run` in a subprocess (which starts mpiexec itself) with a hard timeout
and a tiny config, so the file stays well under a minute on two busy cores.
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

from hpcrl.io import read_attrs, read_table, read_trajectory
from hpcrl.runtime.record.checkpoint import load_checkpoint

pytestmark = pytest.mark.mpi

TINY = {
    "name": "tiny",
    "env": {"id": "CartPole-v1", "num_envs": 2},
    "actors": {"count": 2, "fragment_length": 16},
    "learners": {"groups": 1, "ranks_per_group": 1},
    "algo": {"name": "ppo", "train_batch_size": 64, "minibatch_size": 32, "num_sgd_iter": 1},
    "stop": {"total_env_steps": 1500},
    "io": {"flush_seconds": 0.5, "checkpoint_every": 10},
    "launch": {"timeout_seconds": 120},
}


def write_config(tmp_path: Path, **sections) -> tuple[Path, Path]:
    cfg = {k: dict(v) if isinstance(v, dict) else v for k, v in TINY.items()}
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    run_dir = tmp_path / "run"
    cfg["io"]["run_dir"] = str(run_dir)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, run_dir


def hpcrl_run(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=cwd, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"hpcrl run {' '.join(args)} hung (> {timeout} s):\n{out[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.mark.slow
def test_short_run_writes_readable_files_with_every_table(tmp_path):
    # two learner groups of two ranks each: group allreduce, elastic activation, IS window
    path, run_dir = write_config(tmp_path, learners={"groups": 2, "ranks_per_group": 2, "min_active": 1},
                                 aggregation={"is_truncation": True}, stop={"total_env_steps": 800})
    res = hpcrl_run(str(path), timeout=150)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "hpcrl run summary" in res.stdout and str(run_dir / "run.h5") in res.stdout
    h5 = run_dir / "run.h5"
    attrs = read_attrs(h5)
    assert attrs["schema_version"] == 1 and "CartPole-v1" in attrs["config_yaml"]
    ranks = read_table(h5, "rank_map")
    assert list(ranks["role"]) == [0, 1, 1, 1, 1, 2, 2]
    episodes = read_table(h5, "episodes")
    assert len(episodes["return"]) > 0 and np.all(episodes["length"] >= 8)
    assert np.allclose(episodes["return"], episodes["length"])  # CartPole: +1 per step
    grads = read_table(h5, "gradients")
    updates = read_table(h5, "updates")
    admitted = grads["admitted"] == 1
    assert admitted.sum() == updates["num_gradients"].sum()  # every admitted gradient is in one update
    applied_at = grads["base_version"] + grads["staleness"]
    assert np.all(grads["staleness"][admitted] >= 0) and np.all(applied_at[admitted] < updates["version"][-1])
    assert set(np.unique(grads["group"])) <= {0, 1}
    assert np.array_equal(updates["version"], np.arange(1, len(updates["version"]) + 1))
    for g in (0, 1):  # each group's sequence numbers arrive once each, none lost
        seqs = np.sort(grads["seq"][grads["group"] == g])
        assert np.array_equal(seqs, np.arange(len(seqs)))
    activity = read_table(h5, "learner_activity")
    assert len(activity["group"]) > 0 and np.all(activity["compute_seconds"] > 0)
    rounds = read_table(h5, "rounds")
    assert len(rounds["round"]) >= 2 and np.isnan(rounds["threshold"][0])
    for a in (0, 1):
        traj = read_trajectory(run_dir / "traj" / f"actor-{a:05d}.h5")
        assert traj["obs"].shape[1:] == (4,) and len(traj["rewards"]) >= 16 * 2
        assert set(np.unique(traj["env_index"])) == {0, 1}
    assert load_checkpoint(run_dir)["version"] == updates["version"][-1]


@pytest.mark.slow
@pytest.mark.alone
def test_a_rank_that_raises_ends_the_job_within_seconds(tmp_path):
    path, run_dir = write_config(tmp_path, debug={"raise_on_rank": 3, "raise_after_seconds": 1.0},
                                 stop={"total_env_steps": 10_000_000})
    start = time.monotonic()
    res = hpcrl_run(str(path), timeout=90)
    elapsed = time.monotonic() - start
    assert res.returncode == 1
    assert "[rank 3]" in res.stdout and "failing on purpose" in res.stdout
    last = res.stdout.strip().splitlines()[-1]  # the launcher names the rank that failed first
    assert "hpcrl run: the MPI job failed" in last and "rank 3 (actor on " in last and "failing on purpose" in last
    assert elapsed < 60, f"took {elapsed:.1f} s to end"
    # the failing actor flushed its file, and the parameter rank's file is readable
    assert read_trajectory(run_dir / "traj" / "actor-00001.h5")["rewards"].size >= 0
    assert read_attrs(run_dir / "run.h5")["schema_version"] == 1


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_keeps_the_version_counter(tmp_path):
    path, run_dir = write_config(tmp_path, stop={"total_env_steps": 10_000_000})
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # wait until updates are on disk
            time.sleep(0.3)
            try:
                if len(read_table(run_dir / "run.h5", "updates")["version"]) >= 4:
                    break
            except Exception:
                pass
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, out[-3000:]  # EXIT_STOPPED: checkpointed, resume me
    assert "signal SIGTERM" in out
    ckpt = load_checkpoint(run_dir)
    stopped_at = ckpt["version"]
    assert stopped_at >= 4
    episodes_before = len(read_table(run_dir / "run.h5", "episodes")["return"])
    steps_before = len(read_trajectory(run_dir / "traj" / "actor-00000.h5")["rewards"])

    res = hpcrl_run("--resume", str(run_dir), "-o", f"stop.total_env_steps={ckpt['env_steps'] + 300}", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:]
    updates = read_table(run_dir / "run.h5", "updates")
    versions = updates["version"]
    assert np.all(np.diff(versions) == 1), "the version counter restarted or skipped"
    assert versions[-1] > stopped_at
    assert len(read_table(run_dir / "run.h5", "episodes")["return"]) > episodes_before
    assert len(read_trajectory(run_dir / "traj" / "actor-00000.h5")["rewards"]) > steps_before
    assert len(read_attrs(run_dir / "run.h5")["resumed_unix"]) == 1
    assert load_checkpoint(run_dir)["version"] == versions[-1]


def _holder_pid(path: Path) -> int | None:
    """PID of the process holding ``path`` open: a rank itself, also under launch.prestart (the server's child
    then, not the stand-in mpiexec started, which cannot pass SIGSTOP on). Rank 0 holds run.h5, actor a
    traj/actor-0000a.h5."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == str(path) for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:  # another user's process, or one that just ended
            continue
    return None


def _children(pid: int) -> list[int]:
    """PIDs of the processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def _rank_pid(run_dir: Path, rank: int) -> int | None:
    """PID of MPI rank ``rank`` of the job writing ``run_dir`` (its command line names the run
    directory; Hydra sets PMI_RANK and gives each rank a session of its own)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if b"hpcrl.runtime.runners.mpi" in cmd and str(run_dir).encode() in cmd and f"PMI_RANK={rank}".encode() in env:
            return int(entry.name)
    return None


@pytest.mark.slow
@pytest.mark.alone
def test_watchdog_names_a_stopped_actor_and_ends_the_job(tmp_path):
    path, run_dir = write_config(tmp_path, stop={"total_env_steps": 10_000_000},
                                 launch={"watchdog_warn_seconds": 3, "watchdog_seconds": 8, "timeout_seconds": 120,
                                         "prestart": False})  # SIGSTOP must reach the rank itself, not a stand-in
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    stopped = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and stopped is None:
            time.sleep(1.0)
            try:
                ready = len(read_table(run_dir / "run.h5", "updates")["version"]) >= 5
            except Exception:
                ready = False
            if ready:
                stopped = _rank_pid(run_dir, 3)
        assert stopped is not None, "rank 3 not found"
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        out, _ = proc.communicate(timeout=90)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 1, out[-3000:]
    assert "warning: rank 3 (actor on " in out and "has made no progress" in out
    last = out.strip().splitlines()[-1]
    assert "rank 3 (actor on " in last and "made no progress" in last, last
    assert "Traceback" not in out, out[-3000:]  # one line naming the silent rank, not rank 0's traceback
    assert elapsed < 60
    read_table(run_dir / "run.h5", "updates")  # the record stays readable


@pytest.mark.slow
@pytest.mark.alone
def test_a_job_whose_ranks_never_report_progress_is_ended(tmp_path):
    """The role loops' watchdog starts once every rank runs; a rank stuck before that (here: no job
    starts in 0.3 s) is caught by launch.startup_seconds in the launcher."""
    path, run_dir = write_config(tmp_path, launch={"startup_seconds": 0.3, "timeout_seconds": 120})
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "no progress within launch.startup_seconds=0.3" in res.stderr and "\n" not in res.stderr.strip()
    assert time.monotonic() - start < 30
    time.sleep(1.0)
    assert all(_rank_pid(run_dir, r) is None for r in range(4)), "a rank outlived the job"


@pytest.mark.slow
def test_kill_9_of_the_parameter_rank_then_resume_keeps_every_key_once(tmp_path):
    # the first checkpoint after 10 updates, the next one 10 updates and 2 s later (the default
    # checkpoint_min_seconds): the kill lands 2 updates past the first (checkpoint_every 200 waited for 200 updates)
    path, run_dir = write_config(tmp_path, stop={"total_env_steps": 10_000_000},
                                 io={"checkpoint_every": 10, "flush_seconds": 0.2})
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # a checkpoint, then updates on disk past it
            time.sleep(0.3)
            try:
                ckpt = load_checkpoint(run_dir) if (run_dir / "checkpoints" / "latest.pt").is_file() else None
                done = ckpt and len(read_table(run_dir / "run.h5", "updates")["version"]) > ckpt["version"] + 2
            except Exception:
                done = False
            if done:
                break
        os.kill(_rank_pid(run_dir, 0), signal.SIGKILL)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, out[-3000:]
    # the launcher names the rank that died (hydra's banner shows only a PID) and nothing prints a traceback
    assert "failed (exit code 9): rank 0 (parameter on " in out and "(SIGKILL)" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    ckpt = load_checkpoint(run_dir)
    res = hpcrl_run("--resume", str(run_dir), "-o", f"stop.total_env_steps={ckpt['env_steps'] + 300}", timeout=150)
    assert res.returncode == 0, res.stdout[-3000:]
    h5 = run_dir / "run.h5"
    versions = read_table(h5, "updates")["version"]
    assert np.array_equal(versions, np.arange(1, len(versions) + 1))
    grads = read_table(h5, "gradients")
    assert np.array_equal(np.sort(grads["seq"]), np.arange(len(grads["seq"])))  # one group: each seq once
    assert np.array_equal(read_table(h5, "rounds")["round"], np.arange(len(read_table(h5, "rounds")["round"])))
    actors = read_table(h5, "actors")
    for a in (0, 1):
        frags = np.sort(actors["fragment"][actors["actor"] == a])
        assert np.array_equal(frags, np.arange(len(frags)))
    assert '"discarded"' in str(read_attrs(h5)["resumed"][0])


def _nice(pid: int) -> int:
    """The scheduling priority offset of a process (field 19 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


@pytest.mark.slow
@pytest.mark.alone
def test_actor_ranks_yield_the_cores_to_the_gradient_path(tmp_path):
    """launch.actor_nice: actor ranks run that much nicer than the parameter and learner ranks. The job is
    stopped (SIGTERM) once every rank's niceness was read, rather than run for a fixed wall time. Under
    launch.prestart (the default) the ranks are the prestart server's children: rank 0 holds run.h5, the actors
    their trajectory files, and the fourth child is the learner."""
    path, run_dir = write_config(tmp_path, stop={"total_env_steps": 10_000_000},
                                 launch={"actor_nice": 7, "timeout_seconds": 120})
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    nice = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(nice) < 4:
            time.sleep(0.2)
            try:
                if not len(read_table(run_dir / "run.h5", "updates")["version"]):
                    continue
                parameter = _holder_pid(run_dir / "run.h5")
                actors = [_holder_pid(run_dir / "traj" / f"actor-{a:05d}.h5") for a in (0, 1)]
                ranks = _children(int(Path(f"/proc/{parameter}/stat").read_text().rsplit(")", 1)[1].split()[1]))
                learners = [pid for pid in ranks if pid != parameter and pid not in actors]
                if None in actors or len(ranks) != 4 or len(learners) != 1:
                    continue
                nice = {"parameter": _nice(parameter), "learner": _nice(learners[0]),
                        "actor 0": _nice(actors[0]), "actor 1": _nice(actors[1])}
            except Exception:  # the file is being created, a rank is starting or ending
                continue
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, out[-3000:]  # stopped by the SIGTERM, with a checkpoint
    assert len(nice) == 4, f"ranks seen: {nice}"
    assert {nice[r] - nice["parameter"] for r in ("actor 0", "actor 1")} == {7}, nice
    assert nice["learner"] == nice["parameter"], nice


@pytest.mark.slow
def test_ctrl_c_stops_with_a_checkpoint_and_says_sigint_and_a_second_one_says_how_to_go_on(tmp_path):
    """One Ctrl-C: the ranks checkpoint and the summary says SIGINT (they are sent SIGTERM); two: the job is
    killed at once and the last line still says how to resume (it said 'the MPI job failed (exit code -9)')."""
    for presses in (1, 2):
        (tmp_path / str(presses)).mkdir()
        path, run_dir = write_config(tmp_path / str(presses), stop={"total_env_steps": 10_000_000},
                                     io={"checkpoint_every": 5})
        proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", str(path)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not (run_dir / "checkpoints" / "latest.pt").is_file():
                time.sleep(0.3)
            for _ in range(presses):
                proc.send_signal(signal.SIGINT)
                time.sleep(0.3)
            out, _ = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 3, out[-3000:]  # EXIT_STOPPED
        last = out.strip().splitlines()[-1]
        if presses == 1:
            assert "stopped because                signal SIGINT" in out and "stopped by SIGINT with a checkpoint" in last
        else:
            assert "ended by a second Ctrl-C" in last and f"hpcrl run --resume {run_dir}" in last, last
