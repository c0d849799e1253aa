"""Multi-policy networks: one sub-network per policy, every agent mapped to one policy, one flat buffer.

The actors' parallel backend makes every agent of every env copy an instance, instance
k * A + j = agent j of copy k (A agents). A model here holds P policy slots and the agent ->
policy map (``policy_of``, A numbers) as untrained values in its flat buffer, so the map
travels with the published weights and a change made on the parameter rank reaches actors and
learners with the next version; the runtime's roles do not change. Rows that come in whole
env copies (an actor's step, a fragment flattened time-major, a truncated copy's final
observation) know their agent from their position: row r is agent r mod A. Shuffled
minibatches carry an ``agent`` column instead.

Sizes as MARLess Table 1: the MLP of ``model.hidden_sizes`` (MPE: [64, 64], tanh) for every
policy, critic and Q-network.

- :class:`MultiPolicyActorCritic` (IPPO, MAPPO): policy and critic per slot; the critic sees
  the agent's observation (local) or the joint observation of its env copy plus a one-hot agent
  id (central, MAPPO).
- :class:`MultiPolicyQ` (IQL, VDN): Q-network and target Q-network per slot, and the exploration
  rate epsilon.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn
from torch.distributions import Categorical, Normal

from hpcrl.errors import ConfigError
from hpcrl.models import FlatParameters
from hpcrl.models import _mlp as mlp


def initial_map(policies: str, agents: int) -> list[int]:
    """per_agent: agent j -> policy j; shared: every agent -> policy 0."""
    return list(range(agents)) if policies == "per_agent" else [0] * agents


def slot_count(cfg) -> int | None:
    """Policy slots of a MARL algo config: one per agent when sharing may split them, else as the map needs."""
    return cfg.agents if cfg.sharing else None


class AgentMapped(nn.Module):
    """What both models share: agent count, policy slots, the agent -> policy map in the flat buffer."""

    def _setup_map(self, agents: int, slots: int, mapping: Sequence[int], constants: dict[str, float]) -> None:
        if len(mapping) != agents or max(mapping) >= slots or min(mapping) < 0:
            raise ValueError(f"policy map {list(mapping)} does not map {agents} agents onto {slots} policies")
        self.agents, self.slots = agents, slots
        self.policy_of = nn.Parameter(torch.tensor(mapping, dtype=torch.float32), requires_grad=False)
        self.constants = nn.ParameterDict({k: nn.Parameter(torch.tensor(float(v)), requires_grad=False)
                                           for k, v in constants.items()})

    def _finish(self, device) -> None:
        self.to(device)
        self.device = torch.device(device)
        self.flat = FlatParameters(self)

    def mapping(self) -> Tensor:
        """The agent -> policy map [A] (long)."""
        return self.policy_of.detach().round().long()

    @torch.no_grad()
    def set_mapping(self, mapping: Sequence[int]) -> None:
        if len(mapping) != self.agents or max(mapping) >= self.slots:
            raise ValueError(f"policy map {list(mapping)}: {self.agents} agents onto {self.slots} slots expected")
        self.policy_of.copy_(torch.tensor(mapping, dtype=torch.float32))

    def obs(self, x) -> Tensor:
        x = torch.as_tensor(x, device=self.device, dtype=torch.float32)
        return x.reshape(x.shape[0], -1)

    def agent_ids(self, rows: int) -> Tensor:
        """Agent of each row for rows in whole env copies (row r is agent r mod A)."""
        if rows % self.agents:
            raise RuntimeError(f"{rows} rows are not whole env copies of {self.agents} agents; "
                               "check algo.agents against the env's number of agents")
        return torch.arange(rows, device=self.device) % self.agents

    def per_policy(self, nets: nn.ModuleList, x: Tensor, agent: Tensor, width: int) -> Tensor:
        """[B, width]: row b through the net of its agent's policy (one call per policy in use)."""
        slot = self.mapping()[agent]
        out = x.new_zeros((x.shape[0], width))
        for p in torch.unique(slot).tolist():
            rows = slot == p
            out[rows] = nets[p](x[rows])
        return out


class MultiPolicyActorCritic(AgentMapped):
    """P policies (Categorical or diagonal Gaussian) and P critics, local or central."""

    def __init__(self, obs_space: spaces.Space, action_space: spaces.Space, model_cfg: Any, agents: int,
                 mapping: Sequence[int], central_critic: bool, device="cpu", slots: int | None = None) -> None:
        super().__init__()
        if not isinstance(obs_space, spaces.Box):
            raise ConfigError(f"env: observation space {obs_space} is not supported; allowed: Box")
        slots = max(mapping) + 1 if slots is None else slots
        self._setup_map(agents, slots, mapping, {})
        self.obs_dim = int(np.prod(obs_space.shape))
        self.discrete = isinstance(action_space, spaces.Discrete)
        if self.discrete:
            self.action_shape: tuple[int, ...] = ()
            self.out = int(action_space.n)
        elif isinstance(action_space, spaces.Box):
            self.action_shape = tuple(action_space.shape)
            self.out = int(np.prod(self.action_shape))
        else:
            raise ConfigError(f"env: action space {action_space} is not supported; allowed: Discrete, Box")
        self.central = central_critic
        critic_in = agents * self.obs_dim + agents if central_critic else self.obs_dim
        sizes, act = list(model_cfg.hidden_sizes), model_cfg.activation
        self.pis = nn.ModuleList([mlp([self.obs_dim, *sizes, self.out], act, 0.01) for _ in range(slots)])
        self.vfs = nn.ModuleList([mlp([critic_in, *sizes, 1], act, 1.0) for _ in range(slots)])
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(slots, self.out))
        self._finish(device)

    # ---- critic input ---------------------------------------------------------------------
    def critic_obs(self, obs: Tensor) -> Tensor:
        """Rows in whole env copies -> the critic's input: the row itself, or (central) the joint
        observation of its copy and the one-hot agent id."""
        obs = self.obs(obs)
        if not self.central:
            return obs
        A = self.agents
        joint = obs.reshape(-1, A * self.obs_dim).repeat_interleave(A, dim=0)
        return torch.cat([joint, torch.eye(A, device=self.device)[self.agent_ids(obs.shape[0])]], dim=1)

    # ---- distributions and values ---------------------------------------------------------
    def dist(self, obs: Tensor, agent: Tensor):
        out = self.per_policy(self.pis, self.obs(obs), agent, self.out)
        if self.discrete:
            return Categorical(logits=out)
        return Normal(out, self.log_std[self.mapping()[agent]].exp())

    def log_prob(self, dist, actions) -> Tensor:
        a = torch.as_tensor(actions, device=self.device)
        if self.discrete:
            return dist.log_prob(a.long())
        return dist.log_prob(a.reshape(a.shape[0], -1).float()).sum(-1)

    def critic(self, critic_in: Tensor, agent: Tensor) -> Tensor:
        return self.per_policy(self.vfs, critic_in, agent, 1).squeeze(-1)

    def value(self, obs) -> Tensor:
        """V of rows in whole env copies, [B]."""
        obs = self.obs(obs)
        return self.critic(self.critic_obs(obs), self.agent_ids(obs.shape[0]))

    def policy_terms(self, obs, actions, agent: Tensor) -> tuple[Tensor, Tensor]:
        """(log pi(a|s), entropy) [B] each, with gradients, for rows of any order."""
        d = self.dist(obs, agent)
        return self.log_prob(d, actions), d.entropy() if self.discrete else d.entropy().sum(-1)

    def evaluate(self, obs, actions, agent: Tensor, critic_in: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log pi(a|s), entropy, V) [B] each, with gradients, for rows of any order."""
        return (*self.policy_terms(obs, actions, agent), self.critic(critic_in, agent))

    @torch.no_grad()
    def act(self, obs) -> tuple[Tensor, Tensor, Tensor]:
        """Sample (action, log-prob, value) for rows in whole env copies."""
        obs = self.obs(obs)
        agent = self.agent_ids(obs.shape[0])
        d = self.dist(obs, agent)
        a = d.sample()
        logp = self.log_prob(d, a)
        if not self.discrete:
            a = a.reshape(a.shape[:1] + self.action_shape)
        return a, logp, self.critic(self.critic_obs(obs), agent)

    @torch.no_grad()
    def greedy(self, obs) -> Tensor:
        """Each agent's most likely action (argmax of its policy's logits, or the Gaussian mean), whole env copies."""
        obs = self.obs(obs)
        d = self.dist(obs, self.agent_ids(obs.shape[0]))
        if self.discrete:
            return d.logits.argmax(-1)
        return d.mean.reshape(d.mean.shape[:1] + self.action_shape)

    def policy_parameters(self, slot: int) -> list[Tensor]:
        """The trained parameters of one policy slot (its policy, critic, log-std row is shared storage)."""
        return [*self.pis[slot].parameters(), *self.vfs[slot].parameters()]


class MultiPolicyQ(AgentMapped):
    """P Q-networks and their targets (untrained), epsilon and the round count as constants."""

    def __init__(self, obs_space: spaces.Space, action_space: spaces.Space, model_cfg: Any, agents: int,
                 mapping: Sequence[int], epsilon: float, device="cpu", slots: int | None = None) -> None:
        super().__init__()
        if not isinstance(action_space, spaces.Discrete):
            raise ConfigError(f"algo.name: iql and vdn need discrete actions; the env has {action_space}; "
                              "use ippo or mappo")
        if not isinstance(obs_space, spaces.Box):
            raise ConfigError(f"env: observation space {obs_space} is not supported; allowed: Box")
        slots = max(mapping) + 1 if slots is None else slots
        self._setup_map(agents, slots, mapping, {"epsilon": epsilon, "rounds": 0.0})
        self.discrete, self.action_shape = True, ()
        self.obs_dim, self.out = int(np.prod(obs_space.shape)), int(action_space.n)
        sizes, act = list(model_cfg.hidden_sizes), model_cfg.activation
        self.qs = nn.ModuleList([mlp([self.obs_dim, *sizes, self.out], act, 1.0) for _ in range(slots)])
        self.targets = nn.ModuleList([mlp([self.obs_dim, *sizes, self.out], act, 1.0) for _ in range(slots)])
        self.targets.load_state_dict(self.qs.state_dict())
        self.targets.requires_grad_(False)
        self._finish(device)

    def q(self, obs, agent: Tensor, target: bool = False) -> Tensor:
        """Q(o, .) [B, actions] of each row's policy (target networks: no gradients)."""
        nets = self.targets if target else self.qs
        if target:
            with torch.no_grad():
                return self.per_policy(nets, self.obs(obs), agent, self.out)
        return self.per_policy(nets, self.obs(obs), agent, self.out)

    @torch.no_grad()
    def act(self, obs) -> tuple[Tensor, Tensor, Tensor]:
        """Epsilon-greedy actions for rows in whole env copies; no log-probs or values (zeros)."""
        obs = self.obs(obs)
        n = obs.shape[0]
        greedy = self.q(obs, self.agent_ids(n)).argmax(dim=1)
        explore = torch.rand(n, device=self.device) < self.constants["epsilon"]
        a = torch.where(explore, torch.randint(self.out, (n,), device=self.device), greedy)
        zeros = torch.zeros(n, device=self.device)
        return a, zeros, zeros

    @torch.no_grad()
    def greedy(self, obs) -> Tensor:
        """argmax_a Q(o, a) of each agent's policy (no exploration), whole env copies."""
        obs = self.obs(obs)
        return self.q(obs, self.agent_ids(obs.shape[0])).argmax(dim=1)

    @torch.no_grad()
    def value(self, obs) -> Tensor:
        """max_a Q'(o, a) of rows in whole env copies: the bootstrap of a truncated episode."""
        obs = self.obs(obs)
        return self.q(obs, self.agent_ids(obs.shape[0]), target=True).max(dim=1).values

    def pairs(self) -> tuple[list[Tensor], list[Tensor]]:
        return list(self.targets.parameters()), list(self.qs.parameters())

    def policy_parameters(self, slot: int) -> list[Tensor]:
        return list(self.qs[slot].parameters())


@torch.no_grad()
def copy_slot(model: nn.Module, src: int, dst: int) -> None:
    """Copy every sub-network (and log-std row) of policy slot ``src`` into slot ``dst``."""
    for name in ("pis", "vfs", "qs", "targets"):
        nets = getattr(model, name, None)
        if nets is not None:
            for d, s in zip(nets[dst].parameters(), nets[src].parameters()):
                d.copy_(s)
    if getattr(model, "log_std", None) is not None and model.log_std.dim() == 2:
        model.log_std[dst].copy_(model.log_std[src])
