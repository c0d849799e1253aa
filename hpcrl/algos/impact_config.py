"""``algo: {name: impact}``: IMPACT's settings (the algorithm: :mod:`hpcrl.algos.impact`)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from hpcrl.config_base import AlgoSection, FragmentRounds, LearningRate


class IMPACTConfig(FragmentRounds, AlgoSection):
    """IMPACT (Luo et al. 2020) as Stellaris trains it; defaults from Stellaris Table III. One learner batch is
    one actor fragment (reused num_sgd_iter times); a round is algo.round_fragments fragments
    (one of every actor unless set)."""

    name: Literal["impact"] = "impact"
    """IMPACT: V-trace targets, a target network, a clipped surrogate against it (runs on the roles, either runner)."""
    lr: LearningRate = 5e-4
    """Base learning rate alpha_0 (Stellaris Eq. 4 scales it per gradient)."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    clip: float = Field(0.4, gt=0)
    """Clip range of the ratio pi / pi_target in the surrogate (1 +- clip)."""
    kl_coeff: float = Field(1.0, ge=0)
    """Initial weight of KL(pi_target || pi); > 0 turns on RLlib's adaptive rule (x1.5 / x0.5 per round)."""
    kl_target: float = Field(0.01, gt=0)
    """Target KL for the adaptive coefficient."""
    entropy_coeff: float = Field(0.01, ge=0)
    """Weight of the entropy bonus."""
    vf_coeff: float = Field(1.0, ge=0)
    """Weight of the value loss (V-trace targets)."""
    target_update_frequency: int = Field(1, ge=1)
    """Rounds between copies of the policy into the target network."""
    vtrace_rho_bar: float = Field(1.0, gt=0)
    """V-trace truncation of pi_target / mu in the value targets and the policy-gradient advantages."""
    vtrace_c_bar: float = Field(1.0, gt=0)
    """V-trace truncation of the trace coefficients c."""
    max_grad_norm: float = Field(40.0, gt=0)
    """Each minibatch gradient is clipped to this global norm before it is pushed (RLlib IMPALA's grad_clip)."""
    normalize_advantages: bool = False
    """Standardise the V-trace advantages within each minibatch."""
    minibatch_size: int = Field(512, ge=1)
    """Rows per minibatch of a learner batch (a whole fragment when larger); one gradient push each."""
    num_sgd_iter: int = Field(2, ge=1)
    """Passes over each learner batch (IMPACT's circular-buffer reuse)."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Optimizer on the parameter rank."""

    def gradient_rows(self, fragment_steps: int) -> int:
        return min(self.minibatch_size, fragment_steps)
