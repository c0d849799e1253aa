"""``algo: {name: hddpg}``: HDDPG's settings (the algorithm: :mod:`hpcrl.algos.hddpg`)."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from hpcrl.config_base import AlgoSection, FragmentRounds, LearningRate


class HDDPGConfig(FragmentRounds, AlgoSection):
    """Seed 003, Algorithm 2: DDPG on an on-policy FIFO buffer, n-step returns, no replay."""

    name: Literal["hddpg"] = "hddpg"
    """HDDPG (batched envs, one process, learners.device)."""
    fused_loop: ClassVar[bool] = True
    n_step: int = Field(4, ge=1)
    """n of the n-step returns."""
    actor_lr: LearningRate = 1e-3
    """Adam learning rate of the actor mu."""
    critic_lr: LearningRate = 1e-3
    """Adam learning rate of the critic Q."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    tau: float = Field(0.005, gt=0, le=1)
    """Soft target update rate."""
    exploration_noise: float = Field(0.1, ge=0)
    """Gaussian action noise, as a fraction of half the action range."""
    buffer_rollouts: int = Field(2, ge=1)
    """Fragments held in the fused loop's FIFO buffer (current policy's data only); on the roles each
    fragment is trained on once."""
    minibatch_envs: int | None = Field(None, ge=1)
    """Instances whose buffered steps make one update (drawn at random each time); None: all of them."""
    critic_hidden_sizes: list[Annotated[int, Field(ge=1)]] | None = None
    """Hidden widths of the critic Q(s, a) (None: model.hidden_sizes); the actor uses model.hidden_sizes."""
    stats_every: int = Field(10, ge=1)
    """Fused loop: iterations between fetches of episode statistics and losses from the device (none in between)."""

    def reported_lr(self) -> float:
        return self.actor_lr
