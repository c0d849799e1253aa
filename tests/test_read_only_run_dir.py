"""A run directory that turns read-only: the run ends, the launcher gives the lock back in one line, and
``--resume`` there is refused in one line; no traceback from either.

The directory is made read-only for real: it is bind-mounted onto itself and that mount is remounted
read-only (root can write through chmod, and a mount with files open for writing cannot be remounted
read-only). New opens through the path fail with EROFS, as on a file system that turned read-only;
files the job already holds open keep their descriptors on the writable mount below. Needs root;
skipped with the reason otherwise.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def read_only(tmp_path):
    """``make(path)``: bind-mount ``path`` onto itself read-only (unmounted at teardown)."""
    mounted: list[Path] = []

    def make(path: Path) -> None:
        for cmd in (["mount", "--bind", str(path), str(path)], ["mount", "-o", "remount,ro,bind", str(path)]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                reason = f"cannot make a read-only bind mount ({(proc.stderr or proc.stdout).strip() or 'mount failed'})"
                print(reason)
                pytest.skip(reason)
            if cmd[1] == "--bind":
                mounted.append(path)

    probe = tmp_path / "probe"
    probe.mkdir()
    make(probe)
    assert subprocess.run(["touch", str(probe / "x")], capture_output=True).returncode != 0
    yield make
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _hpcrl(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hpcrl", "run", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                            start_new_session=True)


def _communicate(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"hpcrl run did not end within {timeout} s:\n{out[-2000:]}\n{err[-3000:]}") from None


@pytest.mark.slow
def test_a_run_dir_that_turns_read_only_ends_the_run_and_the_resume_in_one_line_each(tmp_path, read_only):
    run_dir = tmp_path / "run"
    cfg = {"name": "ro", "env": {"id": "CartPole-v1", "num_envs": 2}, "actors": {"count": 1, "fragment_length": 16},
           "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 32, "num_sgd_iter": 1},
           "stop": {"total_env_steps": 10**9, "max_wall_seconds": 120},
           "io": {"run_dir": str(run_dir), "flush_seconds": 0.5, "checkpoint_every": 5, "tensorboard": False},
           "launch": {"runner": "serial"}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = _hpcrl("cfg.yaml", cwd=tmp_path)
    deadline = time.time() + 60
    while not (run_dir / "checkpoints" / "latest.pt").is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert (run_dir / "checkpoints" / "latest.pt").is_file(), proc.poll()
    read_only(run_dir)  # the next checkpoint cannot be written
    _, err = _communicate(proc, 60)
    assert proc.returncode == 1, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1] == (f"hpcrl: cannot remove the run lock {run_dir / 'run.lock'} (Read-only file system); it names "
                         "this process, so the next run or --resume of the directory takes it over"), err[-3000:]
    assert lines[-2].startswith("hpcrl run: ") and "Read-only file system" in lines[-2], err[-3000:]
    assert "run_lock.py" not in err  # the lock is given back without a traceback

    resume = _hpcrl("--resume", str(run_dir), cwd=tmp_path)
    _, err = _communicate(resume, 60)
    assert resume.returncode == 2, err
    assert err.strip().splitlines() == [
        f"hpcrl run: error: run directory {run_dir} cannot be written (Read-only file system): a run or --resume "
        f"writes its record there, so it cannot take the run lock ({run_dir / 'run.lock'})"], err
