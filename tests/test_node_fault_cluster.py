"""Faults across nodes on the local cluster: a hung node is named and the job comes back by itself; a lost node
sends the job back onto the nodes left, with fewer actors.

One job of 6 ranks on 3 nodes that accepts 2 (``hpcrl submit --min-nodes 2``), two faults:

1. node3's ranks SIGSTOPped (a hung node Slurm still counts as up): rank 0's watchdog names a rank on node3
   within ``launch.watchdog_seconds`` and ends the job; the script, seeing a failure after a new checkpoint,
   requeues it, and it resumes on the 3 nodes.
2. Once the resumed job has checkpointed again, node3's ranks are killed and node3 is marked DOWN (and drained),
   as a node health check does when a node dies: Slurm ends the job (NODE_FAIL) and requeues it; the script starts
   on node1-2, counts 4 ranks instead of 6, and the ranks resume with 2 actors instead of 4 (``--fit-actors``).

The record must hold every key once. Slurm holds a requeued job for about 2 minutes (BeginTime); the test starts
it again in seconds (slurm_fixture.start_now). The budget, 8,000 steps, is about twice what the job has sampled
when node3 is lost (4,000-5,000 steps: both faults come at a start's first checkpoint).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from slurm_fixture import slurm  # noqa: F401 - slurm: the session fixture
from slurm_fixture import kill_pids, node_processes, scontrol, show_job, start_now, text_of, wait_for
from test_local_cluster import cluster, hpcrl, job_state  # noqa: F401 - cluster: the module fixture

from hpcrl.bench.soak import check_record
from hpcrl.io import read_table
from hpcrl.runtime.record.checkpoint import load_checkpoint

STEPS = 8000


# alone: it takes node3 down, which would end another Slurm test's job there
@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.alone
def test_a_hung_node_and_then_a_lost_node_each_bring_the_job_back(cluster, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    out = hpcrl("submit", "--site", "local-cluster", "--nodes", "3", "--min-nodes", "2", "--run-dir", str(run_dir),
                "-o", "actors.count=4", "-o", f"stop.total_env_steps={STEPS}", "-o", "stop.target_return=null",
                "-o", "io.checkpoint_every=10", "-o", "io.checkpoint_min_seconds=1",
                "-o", "launch.watchdog_warn_seconds=2", "-o", "launch.watchdog_seconds=6",
                # at most ~640 env steps/s (20 gradients of 0.02 s per 256-step batch): on an idle machine node2's
                # actors alone reached the budget during the hang's 6 s, before the watchdog (4.5 s for 8,000 steps)
                "-o", "debug.learner_delay_seconds=0.02")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().splitlines()[-1]
    log = run_dir.parent / "run.job" / f"slurm-{job_id}.out"
    stopped: list[int] = []
    try:
        # 1. a hung node
        wait_for(lambda: load_checkpoint(run_dir) is not None, 180, "the first checkpoint", poll=0.2)
        stopped = node_processes("node3", job_id)
        assert stopped, "no rank of the job on node3"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        since = time.monotonic()
        wait_for(lambda: "JobState=PENDING" in show_job(job_id), 90, f"job {job_id} to requeue itself")
        hung_seconds = time.monotonic() - since
        kill_pids(stopped)
        start_now(job_id)
        wait_for(lambda: "resuming" in text_of(log), 120, "the requeued job to resume")
        resumed_at = load_checkpoint(run_dir)["version"]
        wait_for(lambda: load_checkpoint(run_dir)["version"] > resumed_at, 120, "a checkpoint of the resumed job")
        # 2. a lost node
        victims = node_processes("node3", job_id)
        assert victims, "no rank of the resumed job on node3"
        kill_pids(victims)
        # DOWN ends the job (NODE_FAIL) and Slurm requeues it; DRAIN keeps node3 out of the next start (its
        # slurmd still answers, and ReturnToService=2 would otherwise give the node back at once)
        scontrol("update", "NodeName=node3", "State=DOWN", "Reason=hpcrl-test-node-lost")
        scontrol("update", "NodeName=node3", "State=DRAIN", "Reason=hpcrl-test-node-lost")
        wait_for(lambda: "JobState=PENDING" in show_job(job_id), 60, f"job {job_id} to be requeued")
        start_now(job_id)
        state = wait_for(lambda: job_state(job_id), 180, f"job {job_id} to finish on the nodes left")
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        subprocess.run(["scontrol", "update", "NodeName=node3", "State=RESUME"], capture_output=True, timeout=20)
    text = text_of(log)
    assert state == "COMPLETED", text[-3000:]
    assert "on node3) made no progress" in text, text[-4000:]
    assert hung_seconds < 60, f"the hung node ended the job only after {hung_seconds:.0f} s"
    assert "after writing a new checkpoint: requeue to resume from it" in text
    assert "2 node(s) this time: 4 ranks" in text and "actors.count 4 -> 2" in text, text[-3000:]
    assert f"stop.total_env_steps={STEPS} reached" in text
    last = load_checkpoint(run_dir)
    assert last["actors"] == 2 and last["env_steps"] >= STEPS
    assert check_record(run_dir) == []  # every key once, counters match the files
    assert "node3" in {n.decode() for n in read_table(run_dir / "run.h5", "rank_map")["node"]}  # the first starts'
