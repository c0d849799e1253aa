"""launch.placement across the local cluster's nodes: the roles land where the placement says, whatever the
launch order (tests/test_placement.py checks the rule itself)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurm_fixture import slurm, wait_for  # noqa: F401 - slurm: the session fixture
from test_local_cluster import cluster, hpcrl, job_state  # noqa: F401 - cluster: the module fixture

from hpcrl.io import read_table

ROLE = {0: "parameter", 1: "learner", 2: "actor"}


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
def test_learners_first_apart_puts_the_learners_on_the_second_node(cluster, tmp_path):  # noqa: F811
    """6 ranks on 2 nodes (3 each, srun's block order): in launch order the two learners would share node1 with
    the parameter rank; learners_first with parameter: apart moves them to node2 and gives node1's other ranks
    to actors."""
    run_dir = tmp_path / "run"
    script = hpcrl("submit", "--site", "local-cluster", "--nodes", "2", "--run-dir", str(run_dir), "--dry-run",
                   "-o", "learners.groups=2", "-o", "algo.minibatch_size=128", "-o", "actors.count=3",
                   "-o", "launch.placement.roles=learners_first", "-o", "launch.placement.parameter=apart",
                   "-o", "stop.total_env_steps=1000", "-o", "stop.target_return=null")  # where ranks run, not how far
    assert script.returncode == 0, script.stderr
    (tmp_path / "job.sh").write_text(script.stdout)
    out = subprocess.run(["sbatch", "--parsable", "job.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    state = wait_for(lambda: job_state(job_id), 300, f"job {job_id} to finish")
    log = Path(tmp_path / f"slurm-{job_id}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    ranks = read_table(run_dir / "run.h5", "rank_map")
    where = {r: (ROLE[int(role)], node.decode(), int(world))
             for r, role, node, world in zip(ranks["rank"], ranks["role"], ranks["node"], ranks["world_rank"])}
    assert where[0] == ("parameter", "node1", 0)
    assert {node for role, node, _ in where.values() if role == "learner"} == {"node2"}, where
    assert sorted(node for role, node, _ in where.values() if role == "actor") == ["node1", "node1", "node2"]
    assert sorted(world for _, _, world in where.values()) == list(range(6))
    assert [world for r, (_, _, world) in sorted(where.items())] != list(range(6))  # the ranks were reordered
