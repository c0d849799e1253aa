"""The session fixture for tests that need Slurm: use the one answering sinfo, or start the local cluster."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "local_cluster.sh"


def sinfo_ok() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="session")
def slurm():
    """A running Slurm; the local cluster (3 nodes) is started here, and stopped at the end, only if none was running."""
    if sinfo_ok():
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("no Slurm running and not root: start one with `sudo scripts/local_cluster.sh start`")
    start = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    if start.returncode != 0:
        pytest.skip(f"scripts/local_cluster.sh start failed: {start.stderr.strip().splitlines()[-1:]}")
    conf = subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True).stdout.split("=", 1)[1].strip()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf  # in case /etc/slurm/slurm.conf belongs to someone else
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    """predicate()'s first true value, polled every ``poll`` s; AssertionError naming ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def show_job(job_id: str) -> str:
    """scontrol's view of the job (its state while pending, which test_local_cluster.job_state leaves out)."""
    return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=20).stdout


def scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, capture_output=True, timeout=20)


def node_processes(node: str, job_id: str, step: str | None = "0") -> list[int]:
    """The pids of job ``job_id`` in node's network namespace: the ranks of its step ``step`` there (not slurmd,
    not other jobs'); step None: every process of the job there, its slurmstepds and batch script too."""
    pids = subprocess.run(["ip", "netns", "pids", f"hpcrl-{node}"], capture_output=True, text=True, timeout=10)
    mine = []
    for pid in pids.stdout.split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if step is None and cmdline.startswith(f"slurmstepd: [{job_id}.".encode()):
            mine.append(int(pid))
        elif f"SLURM_JOB_ID={job_id}".encode() in environ and (step is None or f"SLURM_STEP_ID={step}".encode()
                                                               in environ):
            mine.append(int(pid))
    return mine


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def start_now(job_id: str) -> None:
    """Start the requeued job in two seconds (Slurm holds a requeued job for about 2 minutes: BeginTime),
    once its last run has left every node (a start while a node is still completing it, or within the second its
    credential was revoked, is refused: 'Job credential revoked')."""
    def settled() -> bool:  # every node idle, or out (the lost node): none still completing the last run
        rows = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=20).stdout
        nodes = [row.split() for row in rows.splitlines() if row.strip()]
        # ... and no slurmstepd of the last run left on a node: Slurm counts a node idle while the last run's step
        # daemon still waits out KillWait, and a start then (the same step id) fails ("mpi/pmi2: failed to send
        # temp kvs to compute nodes")
        return "JobState=PENDING" in show_job(job_id) and all(
            state.lower().rstrip("*~#!%$@^-") in ("idle", "drained", "down") for _, state in nodes) and not any(
            node_processes(node, job_id, step=None) for node, _ in nodes)

    wait_for(settled, 60, f"job {job_id}'s last run to leave the nodes")
    release(job_id)


def release(job_id: str) -> None:
    """Start the requeued job in about two seconds, on any Slurm (start_now, on the local cluster, first waits for
    its last run to leave the nodes; a run that ended by itself, as on the walltime warning, has left)."""
    # not "now": slurmd revokes the last run's credential with a one-second timestamp, and a start within that
    # second is killed as "Job credential revoked" (seen in a run: requeued at 41:43.240, restarted and killed at 41:43.444)
    scontrol("update", f"JobId={job_id}", "StartTime=now+2")
    time.sleep(2.2)
    # a begin time that passes starts nothing until the scheduler's next pass (up to a minute, sched_interval):
    # an update that makes the job eligible does, so ask again, now, until it runs

    def started() -> bool:
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True, timeout=20)
        return "JobState=PENDING" not in show_job(job_id)

    wait_for(started, 60, f"job {job_id} to start again", poll=1.0)


def text_of(path: Path) -> str:
    return path.read_text() if path.exists() else ""
