"""HDDPG: high-throughput DDPG without replay (seed 003, Algorithm 2; DDPG of Lillicrap et al. 2015).

A deterministic actor mu(s; theta_mu) with Gaussian exploration noise steps N batched envs
for B = ``rollout_length`` steps. The transitions enter an on-policy FIFO buffer holding the
newest ``buffer_rollouts`` rollouts (lines 20-29: no replay of older data); then

    Ret_n   = r_t + ... + gamma^(n-1) r_(t+n-1) + gamma^n Q'(s_(t+n), mu'(s_(t+n)))   (line 33)
    theta_Q  <- descend (Ret_n - Q(O, A))^2                                          (line 35)
    theta_mu <- ascend  Q(O, mu(O))  (grad_a Q grad_theta mu)                         (line 34)
    theta'   <- tau theta + (1 - tau) theta'   for both target networks               (lines 36-37)

With ``minibatch_envs`` set, each update uses the buffered steps of that many instances drawn
at random (whole time rows, so n-step returns stay intact) instead of all N: cheaper updates
where the device is slow (CPU); None (the default) is Algorithm 2 as written.
n-step windows stop at terminated (no bootstrap) and truncated (bootstrap from the final
observation) steps, see :func:`hpcrl.algos.returns.n_step_returns`. Parameters of each network
live in one flat buffer (:class:`FlatParameters`), so a soft update is one ``lerp_``.
"""
from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from torch import Tensor, nn

from hpcrl.algos.returns import n_step_returns
from hpcrl.algos.rollout import EpisodeLog, Rollout, collect
from hpcrl.errors import ConfigError
from hpcrl.models import FlatParameters
from hpcrl.models import _mlp as mlp

STATS = ("critic_loss", "actor_loss", "q_mean", "target_mean")
"""Names of the entries of the stats tensor :meth:`HDDPG.update` returns."""


class DeterministicActor(nn.Module):
    """mu(s) = centre + half_range * tanh(MLP(s)): always inside the action box."""

    def __init__(self, obs_dim: int, action_space: spaces.Box, model_cfg: Any, device: torch.device):
        super().__init__()
        self.net = mlp([obs_dim, *model_cfg.hidden_sizes, int(action_space.shape[0])], model_cfg.activation, 0.01)
        self.register_buffer("centre", torch.as_tensor((action_space.high + action_space.low) / 2))
        self.register_buffer("half_range", torch.as_tensor((action_space.high - action_space.low) / 2))
        self.to(device)
        self.flat = FlatParameters(self)

    def forward(self, obs: Tensor) -> Tensor:
        return torch.addcmul(self.centre, self.half_range, torch.tanh(self.net(obs)))


class QCritic(nn.Module):
    """Q(s, a) = MLP([s, a])."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: list[int], activation: str, device: torch.device):
        super().__init__()
        self.net = mlp([obs_dim + action_dim, *hidden_sizes, 1], activation, 1.0)
        self.to(device)
        self.flat = FlatParameters(self)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        return self.net(torch.cat([obs, action], dim=-1)).squeeze(-1)


def soft_update_(target: nn.Module, online: nn.Module, tau: float) -> None:
    """theta' <- tau theta + (1 - tau) theta' (Algorithm 2, lines 36-37), one op on the flat buffers."""
    target.flat.params.lerp_(online.flat.params, tau)


class HDDPG:
    def __init__(self, cfg: Any, model_cfg: Any, observation_space: spaces.Box, action_space: spaces.Space,
                 num_envs: int, device: torch.device):
        """cfg: HDDPGConfig; spaces are the env's single-instance spaces."""
        if not isinstance(action_space, spaces.Box) or len(action_space.shape) != 1:
            raise ConfigError(f"algo.name: hddpg needs a 1-D continuous (Box) action space; the env has "
                              f"{action_space}; use ha2c for discrete actions")
        self.cfg = cfg
        obs_dim, action_dim = int(observation_space.shape[0]), int(action_space.shape[0])
        self.actor = DeterministicActor(obs_dim, action_space, model_cfg, device)
        critic_hidden = cfg.critic_hidden_sizes or model_cfg.hidden_sizes
        self.critic = QCritic(obs_dim, action_dim, critic_hidden, model_cfg.activation, device)
        self.target_actor = DeterministicActor(obs_dim, action_space, model_cfg, device)
        self.target_critic = QCritic(obs_dim, action_dim, critic_hidden, model_cfg.activation, device)
        soft_update_(self.target_actor, self.actor, 1.0)  # theta' <- theta (line 8)
        soft_update_(self.target_critic, self.critic, 1.0)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_lr)
        self.low = torch.as_tensor(action_space.low, device=device)
        self.high = torch.as_tensor(action_space.high, device=device)
        self.noise_std = torch.as_tensor(cfg.exploration_noise * (action_space.high - action_space.low) / 2,
                                         device=device)
        self.buffer = Rollout.allocate(cfg.buffer_rollouts * cfg.rollout_length, num_envs, observation_space.shape,
                                       (action_dim,), torch.float32, device)
        self.filled = 0
        """Steps of the FIFO buffer holding data (it fills up over the first buffer_rollouts iterations)."""

    @torch.no_grad()
    def policy(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """a = mu(s) + noise, clipped to the action box (Algorithm 2, line 18)."""
        mu = self.actor(obs)
        action = torch.clamp(torch.addcmul(mu, torch.randn_like(mu), self.noise_std), self.low, self.high)
        return action, action

    def iteration(self, env, obs: Tensor, episodes: EpisodeLog) -> tuple[Tensor, Tensor]:
        """One pass of Algorithm 2's while loop: B new steps pushed into the FIFO buffer, one update."""
        B = self.cfg.rollout_length
        self.buffer.shift(B)
        obs = collect(env, obs, self.policy, self.buffer.last(B), episodes)
        self.filled = min(self.filled + B, self.buffer.steps)
        batch = self.buffer.last(self.filled)
        if self.cfg.minibatch_envs is not None and self.cfg.minibatch_envs < batch.rewards.shape[1]:
            batch = batch.instances(torch.randint(batch.rewards.shape[1], (self.cfg.minibatch_envs,),
                                                  device=batch.rewards.device))
        return obs, self.update(batch)

    def update(self, r: Rollout) -> Tensor:
        """Critic, then actor, then both targets; returns the detached stats tensor (see STATS)."""
        cfg, (T, N) = self.cfg, r.rewards.shape
        obs, actions = r.obs.flatten(0, 1), r.actions.flatten(0, 1)
        with torch.no_grad():
            next_obs = r.next_obs.flatten(0, 1)
            next_q = self.target_critic(next_obs, self.target_actor(next_obs)).view(T, N)
            targets = n_step_returns(r.rewards, next_q, r.terminated, r.truncated, cfg.gamma, cfg.n_step)
        q = self.critic(obs, actions)
        critic_loss = (targets.flatten() - q).square().mean()
        self.critic.flat.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()

        actor_loss = -self.critic(obs, self.actor(obs)).mean()
        self.actor.flat.zero_grad()
        actor_loss.backward()  # also leaves grads in the critic; they are zeroed before its next step
        self.actor_optimizer.step()

        soft_update_(self.target_critic, self.critic, cfg.tau)
        soft_update_(self.target_actor, self.actor, cfg.tau)
        return torch.stack([critic_loss, actor_loss, q.mean(), targets.mean()]).detach()
