"""The weight tree over the node caches (hpcrl/runtime/transport/weight_tree.py): rank 0 serves a version to at
most ``fanout`` nodes, the relays the rest.

Under mpiexec on one machine, "nodes" are colours of ``comm.Split``; the program (tests/mpi_programs/node_cache.py)
checks every read (never torn, never older than the newest version rank 0 had when the read began), rank 0's fetch
counts per version and each relay's fills.
"""
import re

import pytest
from mpi_programs.launcher import run_mpi

from hpcrl.config import ConfigError, load_config
from hpcrl.runtime.transport.node_cache import wanted
from hpcrl.runtime.transport.weight_tree import depth, has_children, source_of


def _said(out: str) -> dict[str, object]:
    line = next(l for l in out.splitlines() if l.startswith("OK node_cache"))
    said: dict[str, object] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)\b(?!,)", line)}
    said["relay_fills"] = [int(x) for x in re.search(r"relay_fills=\[([\d, ]*)\]", line).group(1).split(",")]
    return said


def test_the_tree_numbers_sources_and_relays_as_a_heap():
    # fanout 2: nodes 0, 1 from rank 0; 2, 3 from node 0; 4, 5 from node 1; 6 from node 2
    assert [source_of(i, 2) for i in range(7)] == [-1, -1, 0, 0, 1, 1, 2]
    assert [has_children(i, 2, 7) for i in range(7)] == [True, True, True, False, False, False, False]
    assert [source_of(i, 3) for i in range(7)] == [-1, -1, -1, 0, 0, 0, 1]
    assert [depth(n, 2) for n in (1, 2, 3, 6, 7, 14, 15)] == [1, 1, 2, 2, 3, 3, 4]
    assert depth(1000, 16) == 3  # 16 + 256 + 4096 nodes within three fetches of rank 0


@pytest.mark.mpi
def test_seven_nodes_fetch_through_a_tree_of_fanout_two():
    """11 actors on 7 nodes, three levels: rank 0 serves a version at most twice (7 times without the tree), and
    each of the three relays (nodes 0, 1, 2) filled once per version at most, by whoever needed it first."""
    said = _said(run_mpi(12, "node_cache", 7, 1.5, 10_000, 1, 2, timeout=120))
    assert said["reads"] > 100 and said["versions"] > 100
    assert said["max_per_version"] == 2  # both first-level nodes fetched some version from rank 0, none more
    assert len(said["relay_fills"]) == 3 and min(said["relay_fills"]) > 0  # every relay served its children


@pytest.mark.mpi
@pytest.mark.slow
def test_a_wide_tree_of_fanout_three():
    said = _said(run_mpi(10, "node_cache", 7, 1.0, 50_000, 1, 3, timeout=120))
    assert said["max_per_version"] <= 3 and len(said["relay_fills"]) == 2


def test_a_tree_turns_the_node_caches_on():
    assert wanted("auto", ["node1", "node2"], tree_fanout=2)
    assert not wanted("auto", ["node1", "node2"])
    assert not wanted("off", ["node1", "node1"], tree_fanout=2)  # the config refuses this pair first (below)


@pytest.mark.parametrize("overrides, says", [
    (["launch.weight_tree=1"], "launch.weight_tree=1 would chain the nodes"),
    (["launch.weight_tree=2", "launch.node_weight_cache=off"], "needs the node caches it connects"),
    (["launch.weight_tree=4", "launch.runner=serial"], "launch.weight_tree=4: launch.runner=serial"),
])
def test_a_tree_it_cannot_build_is_refused_in_one_line(overrides, says):
    with pytest.raises(ConfigError, match=says) as err:
        load_config(None, overrides)
    assert "\n" not in str(err.value).strip()


def test_on_and_off_read_as_yaml_booleans_are_the_cache_modes():
    assert load_config(None, ["launch.node_weight_cache=off"]).launch.node_weight_cache == "off"
    assert load_config(None, ["launch.node_weight_cache=on"]).launch.node_weight_cache == "on"
