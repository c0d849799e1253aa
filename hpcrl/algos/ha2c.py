"""HA2C: high-throughput advantage actor-critic (seed 003, Algorithm 1; A2C of Mnih et al. 2016).

One shared policy pi(a|s; theta_p) and value V(s; theta_v) (separate MLPs, :class:`ActorCritic`)
step N batched envs for B = ``rollout_length`` steps; then one gradient step on the whole
[B, N] batch:

    d theta_p = grad log pi(A|O) (Ret - V(O))      (Algorithm 1, line 34)
    d theta_v = grad (Ret - V(O))^2                (line 35)

Ret are GAE(lambda) value targets (lambda = 1: the discounted returns of line 33), bootstrapped
from V of the observation after the rollout and, on time-limit truncation, of the final
observation; terminated episodes are not bootstrapped. An entropy bonus keeps exploration.
Everything stays on the env's device; :meth:`HA2C.iteration` never waits for the host.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from gymnasium import spaces
from torch import Tensor
from torch.distributions import Distribution

from hpcrl.algos.returns import generalized_advantage_estimate
from hpcrl.algos.rollout import EpisodeLog, Rollout, collect
from hpcrl.models import ActorCritic

STATS = ("loss", "policy_loss", "value_loss", "entropy", "grad_norm")
"""Names of the entries of the stats tensor :meth:`HA2C.update` returns."""


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


class HA2C:
    def __init__(self, cfg: Any, model_cfg: Any, observation_space: spaces.Box, action_space: spaces.Space,
                 num_envs: int, device: torch.device):
        """cfg: HA2CConfig; spaces are the env's single-instance spaces."""
        self.cfg = cfg
        self.device = device
        self.net = ActorCritic(observation_space, action_space, model_cfg, device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.lr)
        self.box = isinstance(action_space, spaces.Box)
        if self.box:
            self.low = torch.as_tensor(action_space.low, device=device)
            self.high = torch.as_tensor(action_space.high, device=device)
        self.rollout = Rollout.allocate(cfg.rollout_length, num_envs, observation_space.shape,
                                        self.net.action_shape, torch.float32 if self.box else torch.int64, device)

    @torch.no_grad()
    def policy(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Sample a ~ pi(.|s) (Algorithm 1, line 18); Box actions are clipped for the env only."""
        action = self.net.dist(obs).sample()
        if not self.box:
            return action, action
        action = action.reshape(action.shape[:1] + self.net.action_shape)
        return action, torch.clamp(action, self.low, self.high)

    def iteration(self, env, obs: Tensor, episodes: EpisodeLog) -> tuple[Tensor, Tensor]:
        """One pass of Algorithm 1's while loop: B steps of N envs, then one update."""
        with no_argument_checks():
            obs = collect(env, obs, self.policy, self.rollout, episodes)
            return obs, self.update(self.rollout)

    def update(self, r: Rollout) -> Tensor:
        """One gradient step on the rollout; returns the detached stats tensor (see STATS)."""
        cfg, (T, N) = self.cfg, r.rewards.shape
        logp, entropy, values = self.net.evaluate(r.obs.flatten(0, 1), r.actions.flatten(0, 1))
        values = values.view(T, N)
        with torch.no_grad():
            next_values = self.net.value(r.next_obs.flatten(0, 1)).view(T, N)
        advantages, returns = generalized_advantage_estimate(
            r.rewards, values.detach(), next_values, r.terminated, r.truncated, cfg.gamma, cfg.gae_lambda)
        advantages = advantages.flatten()
        if cfg.normalize_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy_loss = -(logp * advantages).mean()
        value_loss = 0.5 * (returns - values).square().mean()
        entropy = entropy.mean()
        loss = policy_loss + cfg.vf_coeff * value_loss - cfg.entropy_coeff * entropy
        self.net.flat.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        return torch.stack([loss, policy_loss, value_loss, entropy, grad_norm]).detach()
