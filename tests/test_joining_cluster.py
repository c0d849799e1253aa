"""learners.elastic=steps on the local cluster (scripts/local_cluster.sh): a job starts with learner group 0,
group 1 is activated, its joining rank starts as a Slurm job step on another node of the allocation,
pushes gradients that are admitted, then the group parks and the step ends (issue 26 item 1).

The job's own 5 ranks (parameter, two group roots, two actors) run on one node; the allocation holds two
more, one per group that can be active at once, where the groups' joining ranks run as steps.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from slurm_fixture import slurm, wait_for  # noqa: F401 - slurm: the session fixture
from test_joining import events
from test_local_cluster import cluster, hpcrl, job_state, sacct_rows  # noqa: F401 - cluster: the module fixture

from hpcrl.io import read_table

SCHEDULE = "[1,2,2,2,2,2,2,2,2,2,2,2,2,2,2,1]"  # group 1 active after round 1, parked after round 15
CONFIG = ["-o", "learners.elastic=steps", "-o", "learners.groups=2", "-o", "learners.ranks_per_group=2",
          "-o", "algo.minibatch_size=64", "-o", f"debug.active_groups={SCHEDULE}", "-o", "stop.max_rounds=26",
          "-o", "stop.total_env_steps=10000000", "-o", "stop.target_return=null", "-o", "io.log_seconds=1"]


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
def test_a_group_joins_as_a_job_step_on_another_node_and_its_step_ends_when_it_parks(cluster, tmp_path):
    nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N"], capture_output=True, text=True,
                           timeout=20).stdout.split()
    if len(set(nodes)) < 3:
        pytest.skip(f"needs a 3-node local cluster (nodes: {nodes})")
    run_dir = tmp_path / "run"
    script = hpcrl("submit", "--site", "local-cluster", "--nodes", "1", "--run-dir", str(run_dir), "--dry-run",
                   *CONFIG)
    assert script.returncode == 0, script.stderr
    assert "#SBATCH --nodes=3" in script.stdout and "--nodes=1 " in script.stdout  # 1 for the ranks, 2 for joins
    (tmp_path / "job.sh").write_text(script.stdout)
    out = subprocess.run(["sbatch", "--parsable", "job.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    state = wait_for(lambda: job_state(job_id), 300, f"job {job_id} to finish")
    log = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert state == "COMPLETED", log[-3000:]

    # the record: group 1 activated, joined, pushed admitted gradients (each once), parked, left
    mine = [(a, r) for g, a, r in events(run_dir / "run.h5") if g == 1]
    assert mine[0] == ("activate", "scheduled") and ("joined", "job_step") in mine, mine
    assert mine.index(("park", "scheduled")) < mine.index(("left", "job_step")), mine
    grads = read_table(run_dir / "run.h5", "gradients")
    seq = grads["seq"][grads["group"] == 1]
    assert grads["admitted"][grads["group"] == 1].sum() > 0
    assert len(np.unique(seq)) == len(seq) and seq.max() == len(seq) - 1
    own = {n.decode() for n in read_table(run_dir / "run.h5", "rank_map")["node"]}
    assert len(own) == 1, own

    # sacct: the job's own step on its node, each group's joining step on another node, ended
    def accounted():
        rows = sacct_rows(job_id)
        joins = {k: v for k, v in rows.items() if k.startswith(f"{job_id}.") and k.split(".")[1].isdigit()
                 and k != f"{job_id}.0"}
        done = rows.get(job_id, {}).get("State") == "COMPLETED" and len(joins) >= 2
        return (rows, joins) if done else None

    rows, joins = wait_for(accounted, 60, f"sacct to report job {job_id}'s steps")
    assert rows[f"{job_id}.0"]["NodeList"] in own, rows
    for key, row in joins.items():
        assert row["State"] == "COMPLETED" and row["NodeList"] not in own and row["NNodes"] == "1", (key, row)
