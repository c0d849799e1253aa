"""A rank killed while the job starts (before the prestart server forked it, before any progress line) is named in
hpcrl run's last line (issue 41 item 7): hydra's banner names only a PID, so the launcher notes each rank's process
while the ranks start."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hpcrl.runtime.runners.mpiexec import local_rank_pids

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.mpi
def test_a_rank_killed_before_the_prestart_server_took_it_is_named(tmp_path):
    run_dir = tmp_path / "run"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        "name": "start", "env": {"id": "CartPole-v1", "num_envs": 2}, "actors": {"count": 2, "fragment_length": 16},
        "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 64, "num_sgd_iter": 1},
        "stop": {"total_env_steps": 100_000}, "io": {"run_dir": str(run_dir)},
        "launch": {"runner": "mpi", "prestart": True, "timeout_seconds": 120, "startup_seconds": 60}}))
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True)
    killed = None
    try:
        deadline = time.monotonic() + 60
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            pids = local_rank_pids(run_dir)
            if len(pids) == 4:  # every rank's process (with prestart: its stand-in) has started
                time.sleep(0.5)  # the launcher looks every 0.2 s; the server is still importing torch
                os.kill(pids[3], signal.SIGKILL)  # the last actor
                killed = pids[3]
            time.sleep(0.02)
        assert killed is not None, "rank 3 never started"
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "[    " not in out, out[-2000:]  # killed before the ranks' first progress line
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 1, err[-3000:]
    assert last.startswith("hpcrl run: the MPI job failed") and "rank 3 (actor 1 on " in last, err[-3000:]
    assert "ended first" in last and "SIGKILL" in last, last
