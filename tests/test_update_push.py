"""Update push (learners.push: update): the outer step's equations and what the config allows."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpcrl.algos.outer_step import OuterStep
from hpcrl.config import load_config
from hpcrl.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs"


def test_outer_step_lr_one_without_momentum_lands_on_the_groups_weights():
    start, end = torch.randn(50), torch.randn(50)
    params = start.clone()
    OuterStep(params).step(start - end)
    assert torch.allclose(params, end, atol=1e-6)


@pytest.mark.parametrize("nesterov", [False, True])
def test_outer_step_momentum_follows_its_equations(nesterov):
    lr, m = 0.7, 0.9
    updates = [torch.randn(8) for _ in range(4)]
    params = torch.zeros(8)
    outer = OuterStep(params, lr, m, nesterov)
    expected, buffer = torch.zeros(8), torch.zeros(8)
    for d in updates:
        outer.step(d)
        buffer = m * buffer + d
        expected -= lr * ((d + m * buffer) if nesterov else buffer)
        assert torch.allclose(params, expected, atol=1e-6)


def test_outer_step_state_round_trip_keeps_the_momentum_buffer():
    a_params, b_params = torch.zeros(4), torch.zeros(4)
    a = OuterStep(a_params, 1.0, 0.5)
    a.step(torch.ones(4))
    b = OuterStep(b_params, 1.0, 0.5)
    b.load_state_dict(a.state_dict())
    b_params.copy_(a_params)
    a.step(torch.ones(4))
    b.step(torch.ones(4))
    assert torch.equal(a_params, b_params)  # a fresh buffer would step by 1, not 1.5


@pytest.mark.parametrize("overrides, message", [
    (["learners.push=gradient", "aggregation.outer_lr=0.5"], "aggregation.outer_lr is read only with learners.push=update"),
    (["learners.push=update", "aggregation.outer_nesterov=true"], "needs aggregation.outer_momentum > 0"),
    (["learners.push=update", "aggregation.outer_lr=0"], "outer_lr"),
    (["learners.push=sometimes"], "learners.push"),
])
def test_the_config_refuses_what_an_update_push_cannot_do(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_update_push_needs_a_batch_per_group():
    with pytest.raises(ConfigError, match="learners.push=update: algo ippo has no batch of its own per learner group"):
        load_config(CONFIGS / "mpe_spread_ippo.yaml", ["learners.push=update", "algo.policy_learners=true"])
    assert load_config(None, ["learners.push=update"]).learners.push == "update"
