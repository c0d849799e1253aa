"""HDDPG: high-throughput DDPG without replay (seed 003, Algorithm 2; DDPG of Lillicrap et al. 2015).

A deterministic actor mu(s; theta_mu) with Gaussian exploration noise acts in N instances for
B steps (one fragment, ``actors.fragment_length``). The learner keeps an on-policy FIFO
buffer of the newest ``buffer_rollouts`` fragments (lines 20-29: no replay of older data); then

    Ret_n   = r_t + ... + gamma^(n-1) r_(t+n-1) + gamma^n Q'(s_(t+n), mu'(s_(t+n)))   (line 33)
    theta_Q  <- descend (Ret_n - Q(O, A))^2                                          (line 35)
    theta_mu <- ascend  Q(O, mu(O))  (grad_a Q grad_theta mu)                         (line 34)
    theta'   <- tau theta + (1 - tau) theta'   for both target networks               (lines 36-37)

Against the algorithm contract (:mod:`hpcrl.algos.base`): the model (:class:`DDPGModel`) holds
the actor, the critic and both target networks in one flat buffer, so the targets travel with
the published weights. In the fused loop (the seed's setting, :meth:`HDDPG.update`) a step is
Algorithm 2's order: critic step, then the actor's gradient through the *updated* critic, then
the targets. A gradient pushed by a learner role carries both losses' gradients computed at the
same weights (the critic's from its TD loss, the actor's from -Q(s, mu(s)) through the critic),
since a push has one base version; :meth:`HDDPG.apply` steps both with their own learning rates,
then moves the targets.

With ``minibatch_envs`` set, each update uses the buffered steps of that many instances drawn
at random (whole time rows, so n-step returns stay intact) instead of all N. n-step windows stop
at terminated (no bootstrap) and truncated (bootstrap from the final observation) steps, see
:func:`hpcrl.algos.returns.n_step_returns`.
"""
from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from torch import Tensor, nn

from hpcrl.algos.adam import Adam
from hpcrl.algos.base import Algorithm
from hpcrl.algos.returns import n_step_returns, next_values_from
from hpcrl.algos.rollout import Rollout
from hpcrl.errors import ConfigError
from hpcrl.models import FlatParameters
from hpcrl.models import _mlp as mlp

STATS = ("critic_loss", "actor_loss", "q_mean", "target_mean")
"""Names of the stats :meth:`HDDPG.compute_gradient` returns (0-dim tensors, in this order)."""


class DeterministicActor(nn.Module):
    """mu(s) = centre + half_range * tanh(MLP(s)): always inside the action box."""

    def __init__(self, obs_dim: int, action_space: spaces.Box, model_cfg: Any):
        super().__init__()
        self.net = mlp([obs_dim, *model_cfg.hidden_sizes, int(action_space.shape[0])], model_cfg.activation, 0.01)
        self.register_buffer("centre", torch.as_tensor((action_space.high + action_space.low) / 2))
        self.register_buffer("half_range", torch.as_tensor((action_space.high - action_space.low) / 2))

    def forward(self, obs: Tensor) -> Tensor:
        return torch.addcmul(self.centre, self.half_range, torch.tanh(self.net(obs)))


class QCritic(nn.Module):
    """Q(s, a) = MLP([s, a])."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: list[int], activation: str):
        super().__init__()
        self.net = mlp([obs_dim + action_dim, *hidden_sizes, 1], activation, 1.0)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        return self.net(torch.cat([obs, action], dim=-1)).squeeze(-1)


class DDPGModel(nn.Module):
    """mu, Q and their targets mu', Q' (targets untrained: ``requires_grad=False``) in one flat buffer."""

    discrete = False

    def __init__(self, observation_space: spaces.Box, action_space: spaces.Space, cfg: Any, model_cfg: Any,
                 device: str | torch.device = "cpu"):
        super().__init__()
        if not isinstance(action_space, spaces.Box) or len(action_space.shape) != 1:
            raise ConfigError(f"algo.name: hddpg needs a 1-D continuous (Box) action space; the env has "
                              f"{action_space}; use ha2c or ppo for discrete actions")
        obs_dim, action_dim = int(observation_space.shape[0]), int(action_space.shape[0])
        critic_hidden = cfg.critic_hidden_sizes or model_cfg.hidden_sizes
        self.actor = DeterministicActor(obs_dim, action_space, model_cfg)
        self.critic = QCritic(obs_dim, action_dim, critic_hidden, model_cfg.activation)
        self.target_actor = DeterministicActor(obs_dim, action_space, model_cfg)
        self.target_critic = QCritic(obs_dim, action_dim, critic_hidden, model_cfg.activation)
        for target, online in ((self.target_actor, self.actor), (self.target_critic, self.critic)):
            target.load_state_dict(online.state_dict())  # theta' <- theta (line 8)
            target.requires_grad_(False)
        self.action_shape = (action_dim,)
        self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))
        self.register_buffer("noise_std", torch.as_tensor(
            cfg.exploration_noise * (action_space.high - action_space.low) / 2, dtype=torch.float32))
        self.to(device)
        self.device = torch.device(device)
        self.flat = FlatParameters(self)

    def obs(self, x) -> Tensor:
        return torch.as_tensor(x, dtype=torch.float32, device=self.device)

    def target_q(self, obs: Tensor) -> Tensor:
        """Q'(s, mu'(s)): the bootstrap value of a state."""
        return self.target_critic(obs, self.target_actor(obs))

    def pairs(self) -> tuple[list[Tensor], list[Tensor]]:
        """(target parameters, online parameters), matched one to one."""
        targets = [*self.target_actor.parameters(), *self.target_critic.parameters()]
        online = [*self.actor.parameters(), *self.critic.parameters()]
        return targets, online


class HDDPG(Algorithm):
    """cfg: HDDPGConfig."""

    name = "hddpg"
    stats = STATS

    @property
    def kept_fragments(self) -> int:
        """Fragments the FIFO buffer holds (Algorithm 2: the current policy's data only)."""
        return self.cfg.buffer_rollouts

    def make_model(self, obs_space, action_space, device="cpu") -> DDPGModel:
        return DDPGModel(obs_space, action_space, self.cfg, self.model_cfg, device)

    # ---- acting ---------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, model: DDPGModel, obs: Tensor) -> tuple[Tensor, Tensor]:
        """a = mu(s) + noise, clipped to the action box (Algorithm 2, line 18): stored and stepped."""
        mu = model.actor(obs)
        action = torch.clamp(torch.addcmul(mu, torch.randn_like(mu), model.noise_std), model.low, model.high)
        return action, action

    @torch.no_grad()
    def act(self, model: DDPGModel, obs) -> tuple[Tensor, Tensor, Tensor]:
        obs = model.obs(obs)
        action, _ = self.sample(model, obs)
        zeros = torch.zeros(obs.shape[0], device=model.device)
        return action, zeros, zeros  # no log-probs; values are not needed by the learner

    @torch.no_grad()
    def greedy(self, model: DDPGModel, obs) -> Tensor:
        """mu(s), no exploration noise."""
        return model.actor(model.obs(obs))

    @torch.no_grad()
    def value(self, model: DDPGModel, obs) -> Tensor:
        return model.target_q(model.obs(obs))

    # ---- learner --------------------------------------------------------------------------
    @torch.no_grad()
    def _batch(self, obs: Tensor, actions: Tensor, rewards: Tensor, next_q: Tensor, terminated: Tensor,
               truncated: Tensor) -> dict[str, Tensor]:
        targets = n_step_returns(rewards, next_q, terminated, truncated, self.cfg.gamma, self.cfg.n_step)
        return {"obs": obs.flatten(0, 1), "actions": actions.flatten(0, 1), "targets": targets.flatten()}

    def prepare(self, fragments, model: DDPGModel) -> dict[str, Tensor]:
        """n-step targets from fragments; Q' of each next state: the next row's obs, last_obs after the
        last row, the actor's final value where an episode was truncated."""
        parts = []
        for f in fragments:
            obs, T = model.obs(f["obs"]), f["rewards"].shape[0]
            with torch.no_grad():
                q = model.target_q(obs.flatten(0, 1)).view(T, -1)
                next_q = next_values_from(q, model.target_q(model.obs(f["last_obs"])), model.obs(f["truncated"]),
                                          model.obs(f["final_values"]))
            parts.append(self._batch(obs, model.obs(f["actions"]), model.obs(f["rewards"]), next_q,
                                     model.obs(f["terminated"]), model.obs(f["truncated"])))
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def prepare_rollout(self, r: Rollout, model: DDPGModel) -> dict[str, Tensor]:
        """The same from the fused loop's buffer (``next_obs`` = the env's final observations); with
        ``minibatch_envs``, of that many instances drawn at random."""
        m = self.cfg.minibatch_envs
        if m is not None and m < r.rewards.shape[1]:
            r = r.instances(torch.randint(r.rewards.shape[1], (m,), device=r.rewards.device))
        T, N = r.rewards.shape
        with torch.no_grad():
            next_q = model.target_q(r.next_obs.flatten(0, 1)).view(T, N)
        return self._batch(r.obs, r.actions, r.rewards, next_q, r.terminated, r.truncated)

    def critic_loss(self, batch, model: DDPGModel) -> tuple[Tensor, Tensor]:
        """(Ret_n - Q(O, A))^2 averaged (line 35), and Q(O, A)."""
        q = model.critic(batch["obs"], batch["actions"])
        return (batch["targets"] - q).square().mean(), q

    def actor_loss(self, batch, model: DDPGModel) -> Tensor:
        """-Q(O, mu(O)) averaged (line 34); its gradient reaches the critic too, callers keep only the actor's."""
        return -model.critic(batch["obs"], model.actor(batch["obs"])).mean()

    def _stats(self, critic_loss, actor_loss, q, batch) -> dict[str, Tensor]:
        stats = dict(zip(STATS, (critic_loss, actor_loss, q.mean(), batch["targets"].mean())))
        stats.update(loss=critic_loss + actor_loss, value_loss=critic_loss, policy_loss=actor_loss)
        return {k: v.detach() for k, v in stats.items()}

    def compute_gradient(self, batch, model: DDPGModel, window=None) -> tuple[Tensor, dict[str, Tensor]]:
        """Critic TD gradient and actor gradient at the same weights, in one flat buffer (one push)."""
        model.flat.zero_grad()
        critic_loss, q = self.critic_loss(batch, model)
        critic_loss.backward()
        actor_loss = self.actor_loss(batch, model)
        actor_loss.backward(inputs=list(model.actor.parameters()))  # the critic's grads stay its TD loss's
        return model.flat.grads, self._stats(critic_loss, actor_loss, q, batch)

    def update(self, batch, model: DDPGModel, optimizer) -> dict[str, Tensor]:
        """Algorithm 2, lines 33-37 in order: critic step, actor step through the new critic, targets."""
        model.flat.zero_grad()
        critic_loss, q = self.critic_loss(batch, model)
        critic_loss.backward()
        _step_only(optimizer, model.critic, model.actor)
        model.flat.zero_grad()
        actor_loss = self.actor_loss(batch, model)
        actor_loss.backward(inputs=list(model.actor.parameters()))
        _step_only(optimizer, model.actor, model.critic)
        self.move_targets(model)
        return self._stats(critic_loss, actor_loss, q, batch)

    # ---- parameter side -------------------------------------------------------------------
    def make_optimizer(self, model: DDPGModel) -> Adam:
        return Adam([{"params": list(model.actor.parameters()), "lr": self.cfg.actor_lr},
                     {"params": list(model.critic.parameters()), "lr": self.cfg.critic_lr}])

    def apply(self, model: DDPGModel, optimizer, gradient) -> None:
        super().apply(model, optimizer, gradient)
        self.move_targets(model)

    def move_targets(self, model: DDPGModel) -> None:
        """theta' <- tau theta + (1 - tau) theta' for both networks (lines 36-37), one fused op."""
        targets, online = model.pairs()
        with torch.no_grad():
            torch._foreach_lerp_(targets, online, self.cfg.tau)


def _step_only(optimizer: Adam, network: nn.Module, other: nn.Module) -> None:
    """Step ``network``'s parameters only: Adam skips parameters whose grad is None (the next
    ``flat.zero_grad`` reattaches them to the gradient buffer), so ``other``'s moments stay put."""
    for p in other.parameters():
        p.grad = None
    optimizer.step()
