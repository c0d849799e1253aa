"""Stepping N Gymnasium environments of one actor rank in lock-step, one fragment at a time.

A plain list of environments with our own auto-reset (no dependence on one Gymnasium
version's vector-env reset semantics): when an episode ends at step t, the row t keeps the
transition that ended it, the value of the final observation is recorded when the episode
was truncated (``final_values``, so GAE bootstraps through time limits), and the
environment is reset so row t + 1 starts the new episode. Box actions are sampled
unclipped (that is what the log-prob is of) and clipped to the action space for ``step``.

Optional normalisation (``env.normalize_obs`` / ``env.normalize_reward``, for MuJoCo):
observations are standardised with this actor's running mean and variance, training rewards
are divided by the running std of the discounted return (as Gymnasium's NormalizeReward);
both are clipped to ``env.clip``. The statistics are per actor rank (not synchronised), and
episode returns are always recorded from the raw rewards.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from hpcrl.envs import make


def observation_dtype(space: spaces.Space, normalize: bool) -> np.dtype:
    """dtype of observations in fragments and trajectory files: uint8 stays uint8 (Atari frames: 4x
    smaller than float32) unless normalised; everything else is float32."""
    if not normalize and np.dtype(space.dtype) == np.uint8:
        return np.dtype(np.uint8)
    return np.dtype(np.float32)


@dataclass(frozen=True)
class EnvInfo:
    """What every role must know of the actors' environments before it builds its model."""

    observation_space: spaces.Space
    action_space: spaces.Space
    num_envs: int
    """Instances one actor rank steps together (the N of its fragments)."""
    obs_dtype: np.dtype = np.dtype(np.float32)
    """dtype of observations in fragments and trajectories (:func:`observation_dtype`)."""


def describe_env(env_cfg) -> EnvInfo:
    """Build one environment of ``env_cfg`` to read its spaces (done once, on one role)."""
    env = make(env_cfg.id, **env_cfg.kwargs)
    try:
        return EnvInfo(env.observation_space, env.action_space, env_cfg.num_envs,
                       observation_dtype(env.observation_space, env_cfg.normalize_obs))
    finally:
        env.close()


class RunningMeanStd:
    """Running mean and variance over batches (parallel Welford / Chan et al.)."""

    def __init__(self, shape: tuple = ()):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = 1e-4

    def update(self, x: np.ndarray) -> None:
        m, v, n = x.mean(axis=0), x.var(axis=0), x.shape[0]
        delta, total = m - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + v * n + delta ** 2 * self.count * n / total) / total
        self.count = total


class VectorSampler:
    """``num_envs`` environments of ``env_cfg.id``; :meth:`sample` returns one [T, N] fragment."""

    def __init__(self, env_cfg, actor_index: int, gamma: float = 0.99) -> None:
        self.num_envs = env_cfg.num_envs
        self.envs = [make(env_cfg.id, **env_cfg.kwargs) for _ in range(self.num_envs)]
        space = self.envs[0].action_space
        self.discrete = isinstance(space, spaces.Discrete)
        self.low = None if self.discrete else np.asarray(space.low, dtype=np.float32)
        self.high = None if self.discrete else np.asarray(space.high, dtype=np.float32)
        self.action_shape = () if self.discrete else tuple(space.shape)
        base = env_cfg.seed + 1000 * actor_index
        first = [env.reset(seed=base + i)[0] for i, env in enumerate(self.envs)]
        for i, env in enumerate(self.envs):
            env.action_space.seed(base + i)
        self.obs_dtype = observation_dtype(self.envs[0].observation_space, env_cfg.normalize_obs)
        self.obs = np.stack(first).astype(self.obs_dtype)
        self.obs_shape = tuple(self.obs.shape[1:])
        self.ep_return = np.zeros(self.num_envs, dtype=np.float64)
        self.ep_length = np.zeros(self.num_envs, dtype=np.int64)
        self.clip = env_cfg.clip
        self.obs_rms = RunningMeanStd(self.obs_shape) if env_cfg.normalize_obs else None
        self.ret_rms = RunningMeanStd() if env_cfg.normalize_reward else None
        self.disc_return = np.zeros(self.num_envs, dtype=np.float64)
        self.gamma = gamma
        self.raw_obs = self.obs
        self.obs = self._norm_obs(self.raw_obs, update=True)

    def _norm_obs(self, raw: np.ndarray, update: bool) -> np.ndarray:
        if self.obs_rms is None:
            return raw
        if update:
            self.obs_rms.update(raw)
        z = (raw - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8)
        return np.clip(z, -self.clip, self.clip).astype(np.float32)

    def _scale_rewards(self, r: np.ndarray, done: np.ndarray) -> np.ndarray:
        if self.ret_rms is None:
            return r
        self.disc_return = self.disc_return * self.gamma + r
        self.ret_rms.update(self.disc_return.reshape(-1, 1)[:, 0])
        self.disc_return[done] = 0.0
        return np.clip(r / np.sqrt(self.ret_rms.var + 1e-8), -self.clip, self.clip).astype(np.float32)

    def env_action(self, a: np.ndarray) -> Any:
        if self.discrete:
            return int(a)
        return np.clip(a, self.low, self.high)

    def sample(self, algo, model, T: int, version: int, actor: int) -> tuple[dict[str, np.ndarray], list[dict]]:
        """T steps of every env acting with ``algo.act(model, obs)``; returns (fragment, finished episodes)."""
        N = self.num_envs
        obs = np.empty((T, N, *self.obs_shape), dtype=self.obs_dtype)
        actions = np.empty((T, N, *self.action_shape), dtype=np.int64 if self.discrete else np.float32)
        rewards = np.zeros((T, N), dtype=np.float32)
        terminated = np.zeros((T, N), dtype=np.int8)
        truncated = np.zeros((T, N), dtype=np.int8)
        logp = np.empty((T, N), dtype=np.float32)
        values = np.empty((T, N), dtype=np.float32)
        final_values = np.zeros((T, N), dtype=np.float32)
        episodes: list[dict] = []
        for t in range(T):
            obs[t] = self.obs
            a, lp, v = algo.act(model, self.obs)
            a = a.cpu().numpy()
            actions[t], logp[t], values[t] = a, lp.cpu().numpy(), v.cpu().numpy()
            nxt = np.empty_like(self.raw_obs)
            finals, final_idx = [], []
            for i, env in enumerate(self.envs):
                o, r, term, trunc, _ = env.step(self.env_action(a[i]))
                rewards[t, i] = r
                terminated[t, i], truncated[t, i] = bool(term), bool(trunc)
                self.ep_return[i] += r
                self.ep_length[i] += 1
                if term or trunc:
                    if trunc and not term:
                        finals.append(np.asarray(o, dtype=self.obs_dtype))
                        final_idx.append(i)
                    episodes.append({"time": time.time(), "actor": actor, "env_index": i,
                                     "return": float(self.ep_return[i]), "length": int(self.ep_length[i]),
                                     "policy_version": version})
                    self.ep_return[i], self.ep_length[i] = 0.0, 0
                    o, _ = env.reset()
                nxt[i] = o
            if finals:
                with torch.no_grad():
                    final = self._norm_obs(np.stack(finals), update=False)
                    final_values[t, final_idx] = algo.value(model, final).cpu().numpy()
            rewards[t] = self._scale_rewards(rewards[t], (terminated[t] | truncated[t]).astype(bool))
            self.raw_obs = nxt
            self.obs = self._norm_obs(nxt, update=True)
        with torch.no_grad():
            last_value = algo.value(model, self.obs).cpu().numpy().astype(np.float32)
        fragment = {"obs": obs, "actions": actions, "rewards": rewards, "terminated": terminated,
                    "truncated": truncated, "behaviour_logp": logp, "values": values,
                    "final_values": final_values, "last_value": last_value, "last_obs": self.obs.copy(),
                    "policy_version": version, "actor": actor}
        return fragment, episodes

    def close(self) -> None:
        for env in self.envs:
            env.close()
