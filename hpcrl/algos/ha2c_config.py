"""``algo: {name: ha2c}``: HA2C's settings (the algorithm: :mod:`hpcrl.algos.ha2c`)."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from hpcrl.config_base import AlgoSection, FragmentRounds, LearningRate


class HA2CConfig(FragmentRounds, AlgoSection):
    """Seed 003, Algorithm 1: A2C over N batched environments, one update per rollout."""

    name: Literal["ha2c"] = "ha2c"
    """HA2C (batched envs, one process, learners.device)."""
    fused_loop: ClassVar[bool] = True
    lr: LearningRate = 1e-3
    """Adam learning rate."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """GAE lambda (1: the discounted returns of Algorithm 1)."""
    entropy_coeff: float = Field(0.01, ge=0)
    """Weight of the entropy bonus."""
    vf_coeff: float = Field(0.5, ge=0)
    """Weight of the value loss."""
    max_grad_norm: float = Field(0.5, gt=0)
    """Gradient norm clip."""
    normalize_advantages: bool = True
    """Scale the batch's advantages to zero mean and unit variance before the policy gradient."""
    stats_every: int = Field(10, ge=1)
    """Fused loop: iterations between fetches of episode statistics and losses from the device (none in between)."""
