"""End to end through a real Slurm on one node: hpcrl submit, and requeue on the walltime warning.

The session fixture uses the Slurm that answers ``sinfo``, or starts the local cluster with
scripts/local_cluster.sh (as root) and stops it afterwards; it never stops a Slurm it did not start.
These jobs run on one node (site local-slurm); tests/test_local_cluster.py spans nodes, and runs the Parsl
workflow (the same Parsl config, hpcrl/sites/parsl_configs/local_cluster.py, serves local-slurm: a one-node
block is the same path). Training budgets are tiny: these tests check the plumbing, not the learning.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from slurm_fixture import release, slurm, wait_for  # noqa: F401 - slurm: the session fixture

STEPS = 4000  # the warning comes 1-2 s into the run, at 1,500-3,000 steps (at the actor's pace below)
# 3 ranks (the fewest a run can have); no reward target, so every job stops on its step budget (the
# default job reaches 475 within 40K steps, which would end a resumed 30K-step job early). The first status
# line with steps comes 0.5 s in (rank 0's stats come every 0.5 s); the actor naps 0.05 s a fragment (128 steps),
# so that on an idle machine (4,000 steps/s without it) the run does not reach its budget before the warning
SMALL = ["-o", "actors.count=1", "-o", "io.log_seconds=0.5", "-o", "stop.target_return=null",
         "-o", "debug.slow_actor=0", "-o", "debug.slow_actor_seconds=0.05"]

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]


def job_field(job_id: str, name: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=20).stdout
    m = re.search(rf"\b{name}=(\S+)", out)
    return m[1] if m else ""


def submit(run_dir: Path, *overrides: str) -> str:
    out = subprocess.run([sys.executable, "-m", "hpcrl", "submit", "--site", "local-slurm", "--run-dir", str(run_dir),
                          *SMALL, *overrides], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def finished(job_id: str) -> str:
    state = job_field(job_id, "JobState")
    return state if state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"} else ""


def episodes_recorded(run_dir: Path) -> int:
    with h5py.File(run_dir / "run.h5", "r", locking=False) as f:
        return len(f["episodes/return"])


def test_walltime_warning_checkpoints_requeues_and_resumes(slurm, tmp_path):
    """hpcrl submit's job, warned of its walltime, checkpoints, requeues itself and resumes from the checkpoint to
    its budget: COMPLETED with exit code 0:0, its HDF5 record, trajectory file and checkpoint written (a job run
    straight through is test_local_cluster.py's, there across two nodes)."""
    run_dir = tmp_path / "run"
    job_id = submit(run_dir, "-o", f"stop.total_env_steps={STEPS}")
    log_path = tmp_path / "run.job" / f"slurm-{job_id}.out"

    def training() -> bool:
        return log_path.exists() and re.search(r"steps [1-9]\d*", log_path.read_text()) is not None

    wait_for(training, 240, "training to start", poll=0.2)
    # what #SBATCH --signal=B:USR1@120 does before the walltime: USR1 to the batch shell only
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_id], check=True, timeout=20)
    # requeued: back to PENDING with one restart (on the way it passes through states like COMPLETING)
    wait_for(lambda: job_field(job_id, "Restarts") == "1" and job_field(job_id, "JobState") == "PENDING",
             120, "the job to be requeued")
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
    # Slurm holds a requeued job about two minutes (Reason=BeginTime); start it again in a few seconds (its ranks
    # have left: they stopped on the warning before the requeue)
    release(job_id)
    wait_for(lambda: "hpcrl: resuming" in log_path.read_text(), 240, "the requeued job to start again")
    state = wait_for(lambda: finished(job_id), 300, "the resumed job to finish")
    log = log_path.read_text()
    assert state == "COMPLETED" and job_field(job_id, "ExitCode") == "0:0", log[-3000:]
    first, _, second = log.partition("hpcrl: resuming")
    assert re.search(r"stopped because +signal SIGUSR1", first) and "requeueing job" in first  # label width varies
    assert second, "the requeued job did not resume from the checkpoint"
    resumed_at = int(re.search(r"steps (\d+)", second)[1])
    assert resumed_at > 0  # it went on from the checkpoint, not from step 0
    assert f"stop.total_env_steps={STEPS} reached" in second
    assert episodes_recorded(run_dir) > 0
    assert (run_dir / "traj" / "actor-00000.h5").is_file()
