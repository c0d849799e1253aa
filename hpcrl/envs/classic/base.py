"""Shared machinery of the batched classic-control environments (seed 003, Section III).

A :class:`BatchedEnv` holds N instances of one system as a struct-of-arrays state tensor
``[S, N]`` on one device (CPU or CUDA) and steps them all with a few fused tensor operations.
It is a ``gymnasium.vector.VectorEnv``:

- ``step(actions)`` takes a tensor (or array) of N actions and returns tensors on the env's
  device: ``obs [N, obs_dim]`` float32, ``reward [N]`` float32, ``terminated [N]`` and
  ``truncated [N]`` bool, and ``info``;
- autoreset is Gymnasium's ``SAME_STEP`` mode: an instance that ends in step t is reset in
  the same call, ``obs`` already holds its fresh initial observation, and
  ``info["final_obs"]`` (``[N, obs_dim]``, valid where ``info["_final_obs"]``) holds the
  observation it ended in (learners bootstrap truncated episodes from it);
- ``truncated`` is the time limit (``elapsed >= max_episode_steps``, as Gymnasium's
  ``TimeLimit``), reported separately from ``terminated`` (both may be true);
- ``info["episode"] = {"r": return, "l": length}`` with mask ``info["_episode"]`` gives the
  episodes that ended in this step (as Gymnasium's ``RecordEpisodeStatistics``);
- fresh initial states are drawn on the device from the env's own ``torch.Generator``, seeded
  by ``reset(seed=...)``; per-instance counters ``elapsed`` (steps in the current episode),
  ``episode_return`` and ``episode_count`` live on the device too.

On CPU the instances that ended are found with ``nonzero`` and only they are redrawn (cheap:
no device to synchronise with); on CUDA a full batch of initial states is drawn and selected
with ``torch.where``, so a step never waits for the host. Observations are returned as a
transposed view of a fresh ``[obs_dim, N]`` tensor: use ``reshape`` (not ``view``) or copy
them into a rollout buffer.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from torch import Tensor

from hpcrl.errors import ConfigError

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def resolve_device(device: str | torch.device) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without CUDA is a ConfigError."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' requested but torch sees no CUDA device; allowed: auto, cpu, cuda")
    return device


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ConfigError(f"env.kwargs.dtype: {dtype!r} is not allowed; allowed: float32, float64")


class BatchedEnv(VectorEnv):
    """N instances of one classic-control system stepped together on one device.

    Subclasses set ``state_names`` (rows of ``state``), ``default_max_episode_steps``,
    ``single_observation_space`` and ``single_action_space``, and implement
    :meth:`_initial_states`, :meth:`_advance` and :meth:`_observe`.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}
    state_names: tuple[str, ...] = ()
    default_max_episode_steps: int = 0
    single_observation_space: spaces.Box
    single_action_space: spaces.Space

    def __init__(self, num_envs: int = 1, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype = torch.float32, max_episode_steps: int | None = None,
                 desync_episodes: bool = False):
        if num_envs < 1:
            raise ConfigError(f"env.num_envs: must be >= 1 (got {num_envs})")
        self.num_envs = int(num_envs)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        """Dtype of the internal state: float32 (fast) or float64 (Gymnasium's own precision)."""
        self.max_episode_steps = int(max_episode_steps or self.default_max_episode_steps)
        if self.max_episode_steps < 1:
            raise ConfigError(f"env.kwargs.max_episode_steps: must be >= 1 (got {max_episode_steps})")
        self.desync_episodes = bool(desync_episodes)
        """reset() starts each instance at a random step of its first episode (see reset)."""
        self.render_mode = None
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        n, dev = self.num_envs, self.device
        self.state = torch.zeros(len(self.state_names), n, dtype=self.dtype, device=dev)
        self.elapsed = torch.zeros(n, dtype=torch.int32, device=dev)
        self.episode_return = torch.zeros(n, dtype=torch.float32, device=dev)
        self.episode_count = torch.zeros(n, dtype=torch.int64, device=dev)
        self._one = torch.tensor(1, dtype=torch.int32, device=dev)
        self._time_limit = torch.tensor(self.max_episode_steps, dtype=torch.int32, device=dev)
        self.generator = torch.Generator(device=dev)
        self.generator.seed()
        self._redraw_only_done = dev.type == "cpu"

    # -- subclass hooks ------------------------------------------------------------------------
    def _initial_states(self, count: int) -> Tensor:
        """[S, count] fresh initial states drawn with ``self.generator`` on the device."""
        raise NotImplementedError

    def _advance(self, action: Tensor) -> tuple[Tensor, Tensor]:
        """Advance ``self.state`` in place by one step; return (reward [N] float32, terminated [N] bool)."""
        raise NotImplementedError

    def _observe(self, state: Tensor) -> Tensor:
        """A new float32 tensor [obs_dim, K] of the observations of states [S, K]."""
        raise NotImplementedError

    # -- VectorEnv ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Tensor, dict]:
        """Reset every instance; ``seed`` seeds the device generator that draws initial states.

        With ``desync_episodes`` each instance's step counter starts at a random value in
        [0, max_episode_steps), so the instances do not all hit the time limit together (a
        learner without replay would otherwise see every instance at the same phase). These
        first episodes started part-way, so they report a NaN return.
        """
        super().reset(seed=seed)
        if seed is not None:
            self.generator.manual_seed(int(seed))
        self.state.copy_(self._initial_states(self.num_envs))
        self.episode_count.zero_()
        if self.desync_episodes:
            self.elapsed.random_(0, self.max_episode_steps, generator=self.generator)
            self.episode_return.fill_(float("nan"))
        else:
            self.elapsed.zero_()
            self.episode_return.zero_()
        return self._observe(self.state).T, {}

    def step(self, actions: Tensor | np.ndarray) -> tuple[Tensor, Tensor, Tensor, Tensor, dict]:
        reward, terminated = self._advance(torch.as_tensor(actions, device=self.device))
        self.elapsed += self._one
        truncated = self.elapsed >= self._time_limit
        done = terminated | truncated
        self.episode_return += reward
        final_obs = self._observe(self.state)
        info = {
            "final_obs": final_obs.T, "_final_obs": done,
            "episode": {"r": self.episode_return.clone(), "l": self.elapsed.clone()}, "_episode": done,
        }
        self.episode_count += done
        obs = self._autoreset(done, final_obs)
        return obs.T, reward, terminated, truncated, info

    def _autoreset(self, done: Tensor, final_obs: Tensor) -> Tensor:
        """Redraw the instances that ended; return the observations [obs_dim, N] after the reset."""
        if self._redraw_only_done:
            ended = done.nonzero().squeeze(1)
            obs = final_obs.clone()
            if ended.numel():
                fresh = self._initial_states(ended.numel())
                self.state.index_copy_(1, ended, fresh)
                obs.index_copy_(1, ended, self._observe(fresh))
                self.elapsed.index_fill_(0, ended, 0)
                self.episode_return.index_fill_(0, ended, 0.0)
            return obs
        fresh = self._initial_states(self.num_envs)
        torch.where(done, fresh, self.state, out=self.state)
        self.elapsed.masked_fill_(done, 0)
        self.episode_return.masked_fill_(done, 0.0)
        return torch.where(done, self._observe(fresh), final_obs)

    # -- helpers for subclasses -----------------------------------------------------------------
    def _constants(self, **values: float) -> SimpleNamespace:
        """0-dim tensors in the state's dtype on the device: tensor-scalar ops then skip the
        per-call conversion of a Python number (about 1 us each on CPU, a third of a small op)."""
        return SimpleNamespace(**{k: torch.tensor(v, dtype=self.dtype, device=self.device) for k, v in values.items()})

    def _uniform(self, low: Tensor | float, high: Tensor | float, rows: int, count: int) -> Tensor:
        """[rows, count] uniform draws in [low, high) from the env's generator (low/high: scalars or [rows, 1])."""
        u = torch.rand(rows, count, dtype=self.dtype, device=self.device, generator=self.generator)
        return u.mul_(high - low).add_(low)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={self.num_envs}, device={self.device}, dtype={self.dtype})"
