"""A node's ranks killed under srun end the job within seconds, with the default watchdog (1,800 s).

One job of 6 ranks on 3 nodes that accepts 2 (``hpcrl submit --min-nodes 2``). Once it has checkpointed, node2's
ranks are SIGKILLed (the node stays up in Slurm's eyes: an OOM kill, a crashed node agent). srun
(``--kill-on-bad-exit=1``, hpcrl.launchers.Srun) ends the other ranks at once; the script names the node and its
ranks, requeues the job without node2 (ExcNodeList) and the next start resumes on node1 and node3 with 2 actors.
Without the flag the ranks left wait for the watchdog. The record must hold every key once.
"""
from __future__ import annotations

import re
import subprocess
import time

import pytest
from slurm_fixture import slurm  # noqa: F401 - slurm: the session fixture
from slurm_fixture import kill_pids, node_processes, show_job, start_now, text_of, wait_for
from test_local_cluster import cluster, hpcrl, job_state  # noqa: F401 - cluster: the module fixture

from hpcrl.bench.soak import check_record
from hpcrl.runtime.record.checkpoint import has_checkpoint

STEPS = 3000  # about 3 s of the job on 3 nodes: the first start is killed a second in, at its first checkpoint
ENDED_WITHIN = 30  # seconds from the kill to the first start's end (issue 41)


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
def test_killed_node_ends_the_job_at_once_and_it_resumes_without_that_node(cluster, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    out = hpcrl("submit", "--site", "local-cluster", "--nodes", "3", "--min-nodes", "2", "--run-dir", str(run_dir),
                "-o", "actors.count=4", "-o", f"stop.total_env_steps={STEPS}", "-o", "stop.target_return=null",
                "-o", "io.checkpoint_every=5", "-o", "io.checkpoint_min_seconds=0.5")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().splitlines()[-1]
    log = run_dir.parent / "run.job" / f"slurm-{job_id}.out"
    try:
        wait_for(lambda: has_checkpoint(run_dir), 120, "the first checkpoint", poll=0.1)
        victims = node_processes("node2", job_id)
        assert victims, "no rank of the job on node2"
        kill_pids(victims)
        killed = time.monotonic()
        wait_for(lambda: "JobState=PENDING" in show_job(job_id), ENDED_WITHIN + 30, f"job {job_id} to requeue",
                 poll=0.2)
        ended = time.monotonic() - killed
        first = text_of(log)
        start_now(job_id)
        resumed = time.monotonic()
        state = wait_for(lambda: job_state(job_id), 120, f"job {job_id} to finish on the nodes left")
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=20)  # a failed check leaves no job behind
    text = text_of(log)
    print(f"first start ended {ended:.1f} s after the kill; the second ran {time.monotonic() - resumed:.1f} s")
    assert ended < ENDED_WITHIN, f"the job ended {ended:.0f} s after node2's ranks were killed\n{first[-3000:]}"
    assert "reached" not in first, first[-3000:]  # node2's ranks were killed while the run ran, not in its drain
    assert re.search(r"^hpcrl: ranks [0-9,-]+ on node2 were killed \(Killed\)", first, re.M), first[-3000:]
    assert re.search(r"^hpcrl: requeueing job \d+ .* without node2, where ranks [0-9,-]+ were killed: it resumes on "
                     r"the nodes left \(ExcNodeList=node2\)$", first, re.M), first[-3000:]
    assert state == "COMPLETED", text[-3000:]
    assert re.search(r"\bNodeList=node\[1,3\]", show_job(job_id)), show_job(job_id)
    assert "2 node(s) this time: 4 ranks" in text and "actors.count 4 -> 2" in text, text[-3000:]
    assert f"stop.total_env_steps={STEPS} reached" in text
    assert check_record(run_dir) == []  # every key once, counters match the files
