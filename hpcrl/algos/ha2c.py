"""HA2C: high-throughput advantage actor-critic (seed 003, Algorithm 1; A2C of Mnih et al. 2016).

One shared policy pi(a|s; theta_p) and value V(s; theta_v) (separate MLPs, :class:`ActorCritic`)
act in N instances for B steps (one fragment, ``actors.fragment_length``); then one gradient
step on the whole [B, N] batch:

    d theta_p = grad log pi(A|O) (Ret - V(O))      (Algorithm 1, line 34)
    d theta_v = grad (Ret - V(O))^2                (line 35)

Ret are GAE(lambda) value targets (lambda = 1: the discounted returns of line 33), bootstrapped
from V of the observation after the fragment and, on time-limit truncation, of the final
observation; terminated episodes are not bootstrapped. An entropy bonus keeps exploration.

Against the algorithm contract (:mod:`hpcrl.algos.base`): on the runtime's roles a learner
turns fragments into that batch (:meth:`HA2C.prepare`); in the fused single-device loop
(:mod:`hpcrl.runtime.runners.fused`) the device-resident rollout does (:meth:`HA2C.prepare_rollout`).
:meth:`HA2C.compute_gradient` and :meth:`apply` serve both and never wait for the host.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor
from torch.distributions import Distribution

from hpcrl.algos.adam import Adam
from hpcrl.algos.base import Algorithm
from hpcrl.algos.ppo import prepare_batch
from hpcrl.algos.returns import generalized_advantage_estimate
from hpcrl.algos.rollout import Rollout

STATS = ("loss", "policy_loss", "value_loss", "entropy", "grad_norm")
"""Names of the stats :meth:`HA2C.compute_gradient` returns (0-dim tensors, in this order)."""


@contextmanager
def no_argument_checks() -> Iterator[None]:
    """torch.distributions checks its arguments with ``if not valid.all()``: a host round-trip
    per distribution on CUDA. Off inside the training loop."""
    old = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(old)


class HA2C(Algorithm):
    """cfg: HA2CConfig."""

    name = "ha2c"
    stats = STATS
    kept_fragments = 1
    """Fragments the fused loop's buffer holds (on-policy: the newest only)."""

    def make_optimizer(self, model) -> Adam:
        return Adam([p for p in model.parameters() if p.requires_grad], lr=self.cfg.lr)

    @torch.no_grad()
    def sample(self, model, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Fused loop: a ~ pi(.|s) (Algorithm 1, line 18) to store, and the action the env gets (Box: clipped)."""
        action = model.dist(obs).sample()
        if model.discrete:
            return action, action
        action = action.reshape(action.shape[:1] + model.action_shape)
        return action, torch.clamp(action, model.low, model.high)

    def prepare(self, fragments, model) -> dict[str, Tensor]:
        return prepare_batch(fragments, self.cfg, device=model.device, policy=model)

    @torch.no_grad()
    def prepare_rollout(self, r: Rollout, model) -> dict[str, Tensor]:
        """The same batch from a device-resident rollout (``next_obs`` = the env's final observations)."""
        T, N = r.rewards.shape
        values = model.value(r.obs.flatten(0, 1)).view(T, N)
        next_values = model.value(r.next_obs.flatten(0, 1)).view(T, N)
        advantages, returns = generalized_advantage_estimate(
            r.rewards, values, next_values, r.terminated, r.truncated, self.cfg.gamma, self.cfg.gae_lambda)
        return {"obs": r.obs.flatten(0, 1), "actions": r.actions.flatten(0, 1), "advantages": advantages.flatten(),
                "returns": returns.flatten()}

    def compute_gradient(self, batch, model, window=None) -> tuple[Tensor, dict[str, Tensor]]:
        """The A2C gradient of one batch in ``model.flat.grads``, norm-clipped; stats as 0-dim tensors."""
        cfg = self.cfg
        logp, entropy, values = model.evaluate(batch["obs"], batch["actions"])
        advantages = batch["advantages"]
        if cfg.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy_loss = -(logp * advantages).mean()
        value_loss = 0.5 * (batch["returns"] - values).square().mean()
        entropy = entropy.mean()
        loss = policy_loss + cfg.vf_coeff * value_loss - cfg.entropy_coeff * entropy
        model.flat.zero_grad()
        loss.backward()
        grad_norm = torch.linalg.vector_norm(model.flat.grads)
        model.flat.grads.mul_(torch.clamp(cfg.max_grad_norm / (grad_norm + 1e-6), max=1.0))
        stats = dict(zip(STATS, (loss, policy_loss, value_loss, entropy, grad_norm)))
        return model.flat.grads, {k: v.detach() for k, v in stats.items()}
