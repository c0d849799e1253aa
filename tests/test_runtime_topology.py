"""Rank map: the pure role plan, and group communicators on a real launch."""
import pytest
from mpi_programs.launcher import run_mpi

from hpcrl.errors import ConfigError
from hpcrl.runtime.topology import ACTOR, LEARNER, PARAMETER, Role, plan_roles, required_ranks


def test_plan_roles_lays_out_parameter_groups_actors():
    roles = plan_roles(8, groups=2, ranks_per_group=2, actors=3)
    assert roles[0] == Role(PARAMETER, -1, -1)
    assert roles[1:5] == [Role(LEARNER, 0, 0), Role(LEARNER, 0, 1), Role(LEARNER, 1, 0), Role(LEARNER, 1, 1)]
    assert roles[5:] == [Role(ACTOR, -1, -1)] * 3
    assert required_ranks(2, 2, 3) == 8


@pytest.mark.parametrize("world", [1, 2, 7, 9])
def test_plan_roles_rejects_wrong_launch_size_with_one_line(world):
    with pytest.raises(ConfigError) as err:
        plan_roles(world, groups=2, ranks_per_group=2, actors=3)
    msg = str(err.value)
    assert msg == f"launch: {world} ranks but the config needs 1 parameter + 2 x 2 learners + 3 actors = 8"
    assert "\n" not in msg


def test_plan_roles_rejects_empty_sections():
    with pytest.raises(ConfigError, match="actors.count"):
        plan_roles(3, groups=1, ranks_per_group=1, actors=0)


@pytest.mark.mpi
def test_group_communicators_and_rank_map_on_six_ranks():
    out = run_mpi(6, "topology", 2, 2, 1, timeout=30)
    assert "OK topology" in out


@pytest.mark.mpi
def test_minimal_three_rank_job():
    assert "OK topology" in run_mpi(3, "topology", 1, 1, 1, timeout=30)


def test_the_ranks_of_one_process_share_the_rank_maps_group_facts_and_get_each_ranks_own():
    from hpcrl.runtime.topology import RankMapFacts, Topology

    roles = plan_roles(12, 4, 1, 7)  # rank 0, groups at ranks 1-4, 7 actors
    nodes = ["a", "a", "a", "b", "b", "b", "c", "c", "c", "d", "d", "d"]

    def topo(r, facts=None):
        x = roles[r]
        return Topology(comm=None, rank=r, size=12, role=x.role, group=x.group, group_rank=x.group_rank,
                        group_comm=None, node_comm=None, groups=4, ranks_per_group=1, roles=roles, nodes=nodes,
                        node_ranks=list(range(12)), facts=facts)

    shared = RankMapFacts(roles, nodes)
    together, alone = [topo(r, shared) for r in range(12)], [topo(r) for r in range(12)]
    assert all(t.facts is shared for t in together) and alone[0].facts is not alone[1].facts
    for t, u in zip(together, alone):
        assert t.learner_roots == u.learner_roots == [1, 2, 3, 4]
        assert t.group_nodes == u.group_nodes == [0, 0, 1, 1]  # groups 0, 1 on node a; 2, 3 on node b
        assert t.most_groups_on_a_node == 2 and t.node_mates(3) == [2, 3]
