"""The node weight cache (hpcrl/runtime/transport/node_cache.py): one fetch from rank 0 per node and version.

Under mpiexec on one machine, "nodes" are colours of ``comm.Split`` (the cache's ``Split_type`` keeps each
whole); the program (tests/mpi_programs/node_cache.py) checks every read (never torn, never older than the
newest version rank 0 had when the read began) and rank 0's fetch counts per version. The run on the local
Slurm cluster, with real nodes, is tests/test_local_cluster_node_cache.py.
"""
import re
from pathlib import Path

import pytest
from mpi_programs.launcher import run_mpi

from hpcrl.runtime.placement import node_weight_caches as wanted


def _said(out: str) -> dict[str, int]:
    line = next(l for l in out.splitlines() if l.startswith("OK node_cache"))
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


@pytest.mark.mpi
@pytest.mark.slow
def test_two_nodes_of_three_actors_fetch_each_version_at_most_twice():
    said = _said(run_mpi(7, "node_cache", 2, 1.5, 10_000, 1, timeout=80))
    assert said["nodes"] == 2 and said["reads"] > 100 and said["versions"] > 100
    assert said["max_per_version"] == 2  # both nodes fetched some version; none fetched it more often


@pytest.mark.mpi
@pytest.mark.slow
def test_without_the_cache_each_actor_fetches_for_itself():
    # what the count measures: the same six actors reading the board straight fetch a version up to six times
    # (more with the probe reads that count too)
    said = _said(run_mpi(7, "node_cache", 2, 1.0, 10_000, 0, timeout=80))
    assert said["max_per_version"] > 2


@pytest.mark.mpi
def test_an_actor_waiting_on_its_nodes_fetcher_beats_its_heartbeat():
    """An actor stopped while it fetched for its node must be the one a watchdog names, not its neighbours."""
    assert "OK node_cache_wait beats=" in run_mpi(3, "node_cache_wait", timeout=60)


def test_auto_turns_the_cache_on_when_a_node_holds_several_actors():
    assert wanted("auto", ["node1", "node1", "node2"])
    assert not wanted("auto", ["node1", "node2", "node3"])
    assert wanted("on", ["node1"]) and not wanted("off", ["node1", "node1"])
    with pytest.raises(ValueError, match="launch.node_weight_cache"):
        wanted("yes", ["node1"])


def test_in_virtual_time_a_nodes_actors_cross_rank_0s_link_once_a_version(tmp_path):
    """The sim runner prices the cache as built: on a network slow enough that a weight copy over rank 0's link takes
    milliseconds, 8 actor ranks of one node wait for one such copy a version with the cache, for 8 without it."""
    import numpy as np
    import yaml

    from hpcrl.config import build_config
    from hpcrl.io import read_table
    from hpcrl.runtime.plan import make_plan
    from hpcrl.runtime.runners import sim

    profile = tmp_path / "slow-link.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "slow-link", "description": "rank 0 and a learner on one node, 8 actors on another, a 10 MB/s link",
        "nodes": [{"name": "a", "count": 1, "cores": 2, "gpus": 0, "cpu_speed": 1.0, "price_per_hour": 0.0},
                  {"name": "b", "count": 1, "cores": 8, "gpus": 0, "cpu_speed": 1.0, "price_per_hour": 0.0}],
        "network": {"latency_seconds": 0.0, "bytes_per_second": 1.0e7},
        "oversubscribe": False, "start_seconds": 0.0,
        "costs": yaml.safe_load((Path(sim.__file__).parents[2] / "cluster_profiles" / "this-machine.yaml")
                                .read_text())["costs"]}))
    waits = {}
    for mode in ("on", "off"):
        run_dir = tmp_path / mode
        cfg = build_config({"env": {"id": "CartPole-v1", "num_envs": 4}, "actors": {"count": 8, "fragment_length": 16},
                            "algo": {"name": "ppo", "train_batch_size": 256, "minibatch_size": 128, "num_sgd_iter": 1},
                            "stop": {"max_rounds": 4}, "io": {"tensorboard": False, "run_dir": str(run_dir)},
                            "launch": {"runner": "sim", "profile": str(profile), "node_weight_cache": mode}})
        result = sim.run(make_plan(cfg), run_dir)
        assert result.stop_reason.startswith("stop.max_rounds"), result.message
        synced = read_table(run_dir / "run.h5", "actors")["weight_sync_seconds"]
        waits[mode] = float(np.sum(synced))
    # a copy of CartPole's 9,156 floats is 3.7 ms over the link; without the cache every actor's read of a version
    # makes one and they queue on the link
    assert waits["on"] < 0.4 * waits["off"], waits
