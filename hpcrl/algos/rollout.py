"""Device-resident rollout storage for the batched algorithms (seed 003, Algorithms 1 and 2).

Everything here stays on the env's device: a rollout loop never copies to the host. The
episode log keeps the env's per-step episode statistics on the device too, and hands them to
the host only when :meth:`EpisodeLog.fetch` is called (every few iterations).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import numpy as np
import torch
from torch import Tensor

Policy = Callable[[Tensor], tuple[Tensor, Tensor]]
"""obs [N, obs_dim] -> (action to store for training, action to step the env with)."""


@dataclass
class Rollout:
    """Time-major storage [T, N, ...]: O, A, R and D of Algorithm 1 (line 10), with D split into
    ``terminated`` and ``truncated``, and ``next_obs``: the observation after each step before
    any reset (the env's ``final_obs``), from which truncated episodes are bootstrapped."""

    obs: Tensor
    actions: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    next_obs: Tensor

    @classmethod
    def allocate(cls, steps: int, num_envs: int, obs_shape: tuple[int, ...], action_shape: tuple[int, ...],
                 action_dtype: torch.dtype, device: torch.device) -> "Rollout":
        T, N = steps, num_envs
        return cls(
            obs=torch.zeros(T, N, *obs_shape, device=device),
            actions=torch.zeros(T, N, *action_shape, dtype=action_dtype, device=device),
            rewards=torch.zeros(T, N, device=device),
            terminated=torch.zeros(T, N, dtype=torch.bool, device=device),
            truncated=torch.zeros(T, N, dtype=torch.bool, device=device),
            next_obs=torch.zeros(T, N, *obs_shape, device=device),
        )

    @property
    def steps(self) -> int:
        return self.rewards.shape[0]

    def tensors(self) -> list[Tensor]:
        return [getattr(self, f.name) for f in fields(self)]

    def shift(self, steps: int) -> None:
        """FIFO: drop the oldest ``steps`` rows and move the rest to the front (Algorithm 2, lines 20-29)."""
        for t in self.tensors():
            t[:-steps] = t[steps:].clone()

    def instances(self, index: Tensor) -> "Rollout":
        """A copy holding the instances (columns) ``index`` of every step."""
        return Rollout(*(t[:, index] for t in self.tensors()))

    def last(self, steps: int) -> "Rollout":
        """A view of the newest ``steps`` rows."""
        return Rollout(*(t[-steps:] for t in self.tensors()))


class EpisodeLog:
    """Per-step episode ends ([capacity, N] return, length, mask) kept on the device until fetched."""

    def __init__(self, capacity_steps: int, num_envs: int, device: torch.device):
        self.returns = torch.zeros(capacity_steps, num_envs, device=device)
        self.lengths = torch.zeros(capacity_steps, num_envs, dtype=torch.int32, device=device)
        self.ended = torch.zeros(capacity_steps, num_envs, dtype=torch.bool, device=device)
        self.rows = 0

    @property
    def full(self) -> bool:
        return self.rows == self.ended.shape[0]

    def record(self, info: dict) -> None:
        """Store the env's ``info["episode"]`` of one step (SAME_STEP autoreset: valid where ``_episode``)."""
        if self.full:
            raise RuntimeError("EpisodeLog is full: fetch() it before recording more steps")
        self.returns[self.rows] = info["episode"]["r"]
        self.lengths[self.rows] = info["episode"]["l"]
        self.ended[self.rows] = info["_episode"]
        self.rows += 1

    def fetch(self) -> dict[str, np.ndarray]:
        """Episodes ended since the last fetch, in step order: row (step index since the last fetch),
        env_index, return, length. One device synchronisation; the log is empty afterwards.
        Episodes with a NaN return (cut short on purpose by ``desync_episodes``) are left out."""
        rows = slice(0, self.rows)
        row, env = torch.nonzero(self.ended[rows] & ~torch.isnan(self.returns[rows]), as_tuple=True)
        out = {"row": row, "env_index": env, "return": self.returns[row, env], "length": self.lengths[row, env]}
        self.rows = 0
        return {k: v.cpu().numpy() for k, v in out.items()}


def collect(env, obs: Tensor, policy: Policy, rollout: Rollout, episodes: EpisodeLog) -> Tensor:
    """Step the N envs ``rollout.steps`` times with ``policy``, storing every step in place
    (Algorithm 1, lines 16-32: the env resets ended instances itself). Returns the last obs."""
    for t in range(rollout.steps):
        action, env_action = policy(obs)
        next_obs, reward, terminated, truncated, info = env.step(env_action)
        rollout.obs[t] = obs
        rollout.actions[t] = action
        rollout.rewards[t] = reward
        rollout.terminated[t] = terminated
        rollout.truncated[t] = truncated
        rollout.next_obs[t] = info["final_obs"]
        episodes.record(info)
        obs = next_obs
    return obs
