"""One weight fetch per node per version, on the local Slurm cluster (scripts/local_cluster.sh): real nodes.

6 ranks on 3 nodes in launch order: node1 holds the parameter rank and the learner, node2 and node3 two actors
each. The actors read the weight board through their node's NodeWeightCache (on by default: each node holds
several actors), so rank 0 serves each version at most twice (run.h5 ``weight_fetches``), not four times, and
each actor still acts with the newest version it could see.

With ``launch.weight_tree=2`` and 7 actors, the actors fill all three nodes (3 ranks a node): node1's and node2's
fetch from rank 0, node3's through the relay of node1's actor (transport/weight_tree.py), over the nodes' TCP. Rank
0 then serves each version at most twice for three actor nodes.
"""
from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
from slurm_fixture import slurm, wait_for  # noqa: F401 - slurm: the session fixture
from test_local_cluster import cluster, hpcrl, job_state  # noqa: F401 - cluster: the module fixture

from hpcrl.io import read_table

CONFIG = ["-o", "actors.count=4",
          "-o", "stop.total_env_steps=3000", "-o", "stop.target_return=null", "-o", "io.tensorboard=false"]


def run_on_three_nodes(tmp_path: Path, environ: dict[str, str] | None = None, config: list[str] = CONFIG) -> Path:
    """The job through hpcrl submit's script (sbatch passes ``environ`` on to the ranks); its run directory."""
    run_dir = tmp_path / "run"
    script = hpcrl("submit", "--site", "local-cluster", "--nodes", "3", "--run-dir", str(run_dir), "--dry-run",
                   *config)
    assert script.returncode == 0, script.stderr
    (tmp_path / "job.sh").write_text(script.stdout)
    out = subprocess.run(["sbatch", "--parsable", "job.sh"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env={**os.environ, **(environ or {})})
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    state = wait_for(lambda: job_state(job_id), 840, f"job {job_id} to finish")
    log = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    return run_dir


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(900)  # the job itself takes about a minute; the rest is room for other jobs in the queue
def test_two_actor_nodes_of_three_fetch_each_version_at_most_twice(cluster, tmp_path):  # noqa: F811
    check_one_fetch_per_node(run_on_three_nodes(tmp_path) / "run.h5")


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_actor_nodes_through_a_tree_of_fanout_two_cost_rank_0_two_fetches_a_version(cluster, tmp_path):  # noqa: F811
    config = [*CONFIG, "-o", "actors.count=7", "-o", "launch.weight_tree=2", "-o", "stop.total_env_steps=6000"]
    check_one_fetch_per_node(run_on_three_nodes(tmp_path, config=config) / "run.h5",
                             {"node1": 1, "node2": 3, "node3": 3}, at_most=2)


def check_one_fetch_per_node(record: Path, nodes: dict[str, int] | None = None, at_most: int = 2) -> None:
    """Rank 0 served each version at most ``at_most`` times (and some version that often) to the actors on
    ``nodes`` (default: two on node2, two on node3), and each actor acted with the newest version it could see."""
    ranks = read_table(record, "rank_map")
    actor_nodes = Counter(n.decode() for role, n in zip(ranks["role"], ranks["node"]) if role == 2)
    assert actor_nodes == (nodes or {"node2": 2, "node3": 2}), actor_nodes

    fetches = read_table(record, "weight_fetches")
    updates = read_table(record, "updates")
    with h5py.File(record, "r", swmr=True, locking=False) as f:
        version_bytes = 4 * int(f.attrs["num_params"])
    versions = np.asarray(fetches["version"])
    assert list(versions) == list(range(versions.size)) and versions.size == updates["version"].max() + 1
    per_version = np.asarray(fetches["actor_fetches"])
    assert per_version.max() == at_most, np.bincount(per_version)  # some version that often, none more
    assert (np.asarray(fetches["actor_bytes"]) == per_version * version_bytes).all()
    assert np.asarray(fetches["learner_fetches"]).sum() > 0  # the learners read the board straight

    # every actor acts with the newest version it could see: a version published (its updates row is written
    # after the publish) before an actor handed over a fragment is no newer than its next fragment's
    actors = read_table(record, "actors")
    published_at = np.maximum.accumulate(np.asarray(updates["time"]))  # the updates rows in version order
    published = np.asarray(updates["version"])
    for a in range(sum(actor_nodes.values())):
        mine = np.flatnonzero(np.asarray(actors["actor"]) == a)
        mine = mine[np.argsort(np.asarray(actors["fragment"])[mine])]
        times, used = np.asarray(actors["time"])[mine], np.asarray(actors["policy_version"])[mine]
        assert (np.diff(used) >= 0).all(), f"actor {a} went back to an older version"
        for t_before, v in zip(times[:-1], used[1:]):
            seen = published[published_at < t_before - 1e-3]
            assert v >= (seen.max() if seen.size else 0), (a, v, seen.max())
