"""The weight tree over the node caches (hpcrl/runtime/transport/weight_tree.py): rank 0 serves a version to at
most ``fanout`` nodes, the relays the rest.

Under mpiexec on one machine, "nodes" are colours of ``comm.Split``; the program (tests/mpi_programs/node_cache.py)
checks every read (never torn, never older than the newest version rank 0 had when the read began), rank 0's fetch
counts per version and each relay's fills.
"""
import re
from pathlib import Path

import pytest
import torch
from mpi_programs.launcher import run_mpi

from hpcrl.config import ConfigError, load_config
from hpcrl.runtime.placement import node_weight_caches as wanted
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


def _sim_tree(nodes: int, fanout: int):
    from hpcrl.runtime.transport.sim import SimWeightTree, TransportPrices, _Charges
    from hpcrl.runtime.virtual_time import VirtualWorld

    prices = TransportPrices(push=float, receive=float, publish=float, fetch=float, fragment_send=0.0, report=0.0,
                             link_times=lambda a, b, nbytes: (0.0, 1e-3))
    leaders = [10 * (i + 1) for i in range(nodes)]  # node i's first actor is rank 10 (i + 1), its second 10 (i + 1) + 1
    node_of = {r + k: i for i, r in enumerate(leaders) for k in (0, 1)}
    return SimWeightTree(_Charges(VirtualWorld(), prices), fanout, leaders, node_of)


def test_the_sim_tree_fills_each_stale_relay_once_from_the_top():
    tree = _sim_tree(7, 2)
    assert sorted(tree.links) == [0, 1, 2]  # the nodes with children keep relays
    tree.fetch(70, version=3, floats=10)  # node 6 reads from relay 2, which reads from 0, which reads from rank 0
    assert tree.held == [3, -1, 3, -1, -1, -1, -1] and tree.fills == 2
    tree.fetch(71, version=3, floats=10)  # node 6's other actor: its source holds version 3 already
    tree.fetch(40, version=3, floats=10)  # node 3: relay 0 holds it
    assert tree.fills == 2
    tree.fetch(20, version=3, floats=10)  # node 1 keeps a relay: fills its own from rank 0
    tree.fetch(50, version=4, floats=10)  # node 4 reads a newer version through relay 1
    assert tree.held == [3, 4, 3, -1, -1, -1, -1] and tree.fills == 4
    assert not tree.reads(0) and tree.reads(71)  # rank 0 and the learners read the board straight


@pytest.mark.slow
def test_a_sim_job_on_five_small_nodes_runs_through_a_tree(tmp_path):
    """Virtual time, on-policy sync (the weights do not depend on timing): 4 actor nodes of 2 actors, a tree of
    fanout 2 (nodes 2 and 3 through node 0's relay) trains the same weights as every node fetching from rank 0."""
    import yaml

    from hpcrl.cli import main as cli_main
    from hpcrl.runtime.record.checkpoint import load_checkpoint

    root = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((root / "hpcrl" / "cluster_profiles" / "this-machine.yaml").read_text())
    profile.update(name="five-small-nodes", oversubscribe=False,
                   nodes=[{"name": "small", "count": 5, "cores": 2, "gpus": 0, "cpu_speed": 1.0, "price_per_hour": 0.0}])
    (tmp_path / "five.yaml").write_text(yaml.safe_dump(profile))
    job = ["actors.count=8", "env.num_envs=2", "actors.fragment_length=16", "actors.on_policy=true",
           "aggregation.policy=sync", "algo.train_batch_size=256", "algo.minibatch_size=128", "algo.num_sgd_iter=2",
           "stop.max_rounds=3", "io.tensorboard=false", f"launch.profile={tmp_path / 'five.yaml'}"]
    for fanout in (0, 2):
        overrides = [*job, f"launch.weight_tree={fanout}", f"io.run_dir={tmp_path / str(fanout)}"]
        assert cli_main(["run", "--runner", "sim", *[a for o in overrides for a in ("-o", o)]]) == 0
    flat, tree = (load_checkpoint(tmp_path / name) for name in ("0", "2"))
    assert flat["version"] == tree["version"] > 0 and torch.equal(flat["params"], tree["params"])
