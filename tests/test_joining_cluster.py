"""Joining ranks on the local cluster (scripts/local_cluster.sh), issue 26 items 1 and 2.

learners.elastic=jobs: a job starts with learner group 0, group 1 is activated, its joining rank starts on
another node as a batch job of its own, pushes gradients that are admitted, then the group parks and the job
ends; the job's own 5 ranks (parameter, two group roots, two actors) run on one node, and each join is a
one-node job that ``hpcrl analyze`` bills beside it. (The test takes ``how``: steps runs the same way, with
the allocation holding one more node per group; the suite runs steps in the actor test.)

actors.elastic=steps: each actor's sampler runs as a job step on a spare node of the allocation and ends
when its actor parks.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from slurm_fixture import slurm, wait_for  # noqa: F401 - slurm: the session fixture
from test_joining import events
from test_local_cluster import cluster, hpcrl, job_state, sacct_rows  # noqa: F401 - cluster: the module fixture

from hpcrl.io import read_table

# group 1 active after round 1, parked after round 30 (its join, a batch job that starts its rank, takes most of
# those rounds on two loaded cores: the rounds go on meanwhile), the run ends 3 rounds later
SCHEDULE = str([1] + [2] * 29 + [1]).replace(" ", "")
CONFIG = ["-o", "learners.groups=2", "-o", "learners.ranks_per_group=2",
          "-o", "algo.minibatch_size=64", "-o", f"debug.active_groups={SCHEDULE}", "-o", "stop.max_rounds=34",
          "-o", "stop.total_env_steps=10000000", "-o", "stop.target_return=null", "-o", "io.log_seconds=1"]


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
# jobs only: learners.elastic=steps starts its ranks through the same Joiner and srun line as the actor test below
# (a step per spare node, checked in sacct), and test_joining.py checks the groups' side of steps on one machine
@pytest.mark.parametrize("how", ["jobs"])
@pytest.mark.alone
def test_a_group_joins_on_another_node_and_its_step_or_job_ends_when_it_parks(cluster, tmp_path, how):
    nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N"], capture_output=True, text=True,
                           timeout=20).stdout.split()
    if len(set(nodes)) < 3:
        pytest.skip(f"needs a 3-node local cluster (nodes: {nodes})")
    run_dir = tmp_path / "run"
    script = hpcrl("submit", "--site", "local-cluster", "--nodes", "1", "--run-dir", str(run_dir), "--dry-run",
                   "-o", f"learners.elastic={how}", *CONFIG)
    assert script.returncode == 0, script.stderr
    if how == "steps":  # 1 node for the ranks, 2 for the joining steps
        assert "#SBATCH --nodes=3" in script.stdout and "--nodes=1 " in script.stdout
    else:
        assert "#SBATCH --nodes=1" in script.stdout
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

    if how == "steps":  # sacct: the job's own step on its node, each group's joining step on another node, ended
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
        return

    # jobs: each join a one-node job of its own, recorded beside the job and billed with it
    jobs = [j.decode() for j in read_table(run_dir / "run.h5", "allocations")["job_id"]]
    assert jobs[0] == job_id and len(jobs) == 3, jobs  # the run's job, group 0's join, group 1's join

    def accounted():
        rows = {j: sacct_rows(j).get(j, {}) for j in jobs}
        return rows if all(r.get("State") == "COMPLETED" for r in rows.values()) else None

    rows = wait_for(accounted, 60, f"sacct to report jobs {jobs}")
    for j in jobs[1:]:
        assert rows[j]["NNodes"] == "1" and rows[j]["NodeList"] not in own, rows
    out = hpcrl("analyze", str(run_dir), "--out", str(tmp_path / "analysis"), "--no-html", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = (tmp_path / "analysis" / "summary.md").read_text()
    billed = sum(int(rows[j]["ElapsedRaw"]) * int(rows[j]["NNodes"]) for j in jobs)
    assert f"| billed node-seconds (sacct) | {billed:,} |" in summary, summary[:3000]


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
def test_actor_samplers_run_as_job_steps_on_nodes_of_their_own_and_end_when_their_actor_parks(cluster, tmp_path):
    """actors.elastic=steps (issue 26 item 2): each actor's sampler is a job step on a node of the allocation that
    holds none of the job's ranks (one per actor: 3 nodes for 1 + 2); actor 1 parks after round 12, its step ends
    while actor 0 samples on (to round 20), and every fragment is in the record and the trajectory files once."""
    from test_actor_joining import assert_each_fragment_once, joins

    nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N"], capture_output=True, text=True,
                           timeout=20).stdout.split()
    if len(set(nodes)) < 3:
        pytest.skip(f"needs a 3-node local cluster (nodes: {nodes})")
    run_dir = tmp_path / "run"
    schedule = str([2] * 12 + [1]).replace(" ", "")
    script = hpcrl("submit", "--site", "local-cluster", "--nodes", "1", "--run-dir", str(run_dir), "--dry-run",
                   "-o", "actors.elastic=steps", "-o", "actors.fragment_length=32", "-o", "env.num_envs=2",
                   "-o", f"debug.active_actors={schedule}", "-o", "stop.max_rounds=20",
                   "-o", "stop.total_env_steps=10000000", "-o", "stop.target_return=null")
    assert script.returncode == 0, script.stderr
    assert "#SBATCH --nodes=3" in script.stdout and "--nodes=1 " in script.stdout
    (tmp_path / "job.sh").write_text(script.stdout)
    out = subprocess.run(["sbatch", "--parsable", "job.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    state = wait_for(lambda: job_state(job_id), 300, f"job {job_id} to finish")
    assert state == "COMPLETED", (tmp_path / f"slurm-{job_id}.out").read_text()[-3000:]

    got = joins(run_dir / "run.h5")
    assert got[0] == got[1] == [("joined", "job_step"), ("left", "job_step")], got
    rows = read_table(run_dir / "run.h5", "actor_joins")
    left = {int(a): t for a, act, t in zip(rows["actor"], rows["action"], rows["time"]) if act == 4}
    assert left[1] < left[0], rows  # actor 1's sampler left when it parked, actor 0's at the end
    assert_each_fragment_once(run_dir)
    own = {n.decode() for n in read_table(run_dir / "run.h5", "rank_map")["node"]}
    assert len(own) == 1, own

    def accounted():
        rows = sacct_rows(job_id)
        steps = {k: v for k, v in rows.items() if k.startswith(f"{job_id}.") and k.split(".")[1].isdigit()
                 and k != f"{job_id}.0"}
        return steps if len(steps) >= 2 and rows.get(job_id, {}).get("State") == "COMPLETED" else None

    steps = wait_for(accounted, 60, f"sacct to report job {job_id}'s steps")
    assert len({row["NodeList"] for row in steps.values()} | own) == 3, steps  # a node each, not the job's own
    assert all(row["State"] == "COMPLETED" and row["NNodes"] == "1" for row in steps.values()), steps
