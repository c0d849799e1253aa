"""The node weight cache (hpcrl/runtime/transport/node_cache.py): one fetch from rank 0 per node and version.

Under mpiexec on one machine, "nodes" are colours of ``comm.Split`` (the cache's ``Split_type`` keeps each
whole); the program (tests/mpi_programs/node_cache.py) checks every read (never torn, never older than the
newest version rank 0 had when the read began) and rank 0's fetch counts per version. The run on the local
Slurm cluster, with real nodes, is tests/test_local_cluster_node_cache.py.
"""
import re

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
