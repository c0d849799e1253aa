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
