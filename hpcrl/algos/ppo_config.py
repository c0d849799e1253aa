"""``algo: {name: ppo}``: PPO's settings and its facts for the Plan (the algorithm: :mod:`hpcrl.algos.ppo`)."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from hpcrl.config_base import AlgoSection, LearningRate


class PPOConfig(AlgoSection):
    name: Literal["ppo"] = "ppo"
    """PPO with Stellaris' IS truncation (runs on the runtime's roles, either runner)."""
    lr: LearningRate = 3e-4
    """Base learning rate alpha_0 (Stellaris Eq. 4 scales it per gradient)."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """GAE lambda."""
    clip: float = Field(0.2, gt=0)
    """Clip range of the PPO surrogate ratio (1 +- clip)."""
    kl_coeff: float = Field(0.0, ge=0)
    """Initial KL penalty coefficient; > 0 turns on RLlib's adaptive rule (x1.5 / x0.5 per round)."""
    kl_target: float = Field(0.01, gt=0)
    """Target KL for the adaptive coefficient."""
    entropy_coeff: float = Field(0.0, ge=0)
    """Weight of the entropy bonus."""
    vf_coeff: float = Field(0.5, ge=0)
    """Weight of the value loss."""
    max_grad_norm: float = Field(0.5, gt=0)
    """Each minibatch gradient is clipped to this global norm before it is pushed."""
    normalize_advantages: bool = True
    """Standardise advantages within each minibatch."""
    vf_clip: float | None = Field(None, gt=0)
    """Value clipping: the value loss takes the larger of the errors of V and of V clipped to within this of the acting policy's value (CleanRL's clip_vloss uses the surrogate's clip); null: plain squared error."""
    train_batch_size: int = Field(4096, ge=1)
    """Environment steps that make one round (Stellaris/RLlib training iteration)."""
    minibatch_size: int = Field(512, ge=1)
    """Rows per minibatch; one gradient push each."""
    num_sgd_iter: int = Field(4, ge=1)
    """Passes over each learner batch."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Optimizer on the parameter rank."""
    lr_anneal: bool = False
    """Anneal the learning rate linearly from lr to 0 over lr_anneal_steps (CleanRL's PPO); the parameter rank sets it before each step from the env steps the learners have consumed."""
    lr_anneal_steps: int | None = Field(None, ge=1)
    """Env steps over which lr_anneal takes the rate to 0; null: the run's stop.total_env_steps, written into the run's config.yaml, so a resume that changes the budget keeps the schedule."""

    round_regime: ClassVar[str] = "batch"

    def resolve(self, run) -> None:
        super().resolve(run)
        if self.lr_anneal and self.lr_anneal_steps is None:
            self.lr_anneal_steps = run.stop.total_env_steps

    def gradient_rows(self, fragment_steps: int) -> int:
        return self.minibatch_size

    def lr_schedule(self):
        from hpcrl.algos.schedules import LinearAnneal

        return LinearAnneal(self.lr, self.lr_anneal_steps) if self.lr_anneal else None
