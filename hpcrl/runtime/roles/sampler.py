"""Stepping the N environment instances of one actor rank in lock-step, one fragment at a time.

The instances come from an env backend (:mod:`hpcrl.runtime.roles.env_backends`): N Gymnasium envs,
one batched tensor env of N instances, or copies of a PettingZoo ParallelEnv whose agents are the
instances (parameter sharing). Every backend resets an instance in the step it ended in: the row
t keeps the transition that ended the episode, the value of the final observation is recorded
when the episode was truncated (``final_values``, so GAE bootstraps through time limits), and
row t + 1 starts the new episode. Box actions are sampled unclipped (that is what the log-prob
is of) and, for ``step``, clipped to the action space, or with ``env.rescale_actions`` clipped
to [-1, 1] and mapped linearly onto [low, high].

Optional normalisation (``env.normalize_obs`` / ``env.normalize_reward``, for MuJoCo):
observations are standardised with this actor's running mean and variance, training rewards
are divided by the running std of the discounted return (as Gymnasium's NormalizeReward);
both are clipped to ``env.clip``. The statistics are per actor rank (not synchronised), and
episode returns are always recorded from the raw rewards (one record per instance and episode:
``env_index`` is the instance, for a parallel env copy * agents + agent). The statistics travel with
each fragment report to rank 0, which keeps them in every checkpoint (:meth:`VectorSampler.normalizer_state`);
a resumed actor goes on from them instead of from zero.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gymnasium import spaces

from hpcrl.errors import ConfigError
from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.messages import Episode
from hpcrl.runtime.roles.env_backends import describe, make_backend


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
    """One instance's spaces (for a parallel env: the space every agent shares)."""
    num_envs: int
    """Instances one actor rank steps together (the N of its fragments)."""
    obs_dtype: np.dtype = np.dtype(np.float32)
    """dtype of observations in fragments and trajectories (:func:`observation_dtype`)."""


def describe_env(env_cfg) -> EnvInfo:
    """Build one environment (copy) of ``env_cfg`` to read its spaces and instance count (done once)."""
    obs_space, action_space, num_envs = describe(env_cfg)
    if env_cfg.rescale_actions:
        check_rescalable(env_cfg.id, action_space)
    return EnvInfo(obs_space, action_space, num_envs, observation_dtype(obs_space, env_cfg.normalize_obs))


def check_rescalable(env_id: str, space: spaces.Space) -> None:
    """ConfigError unless ``space`` is a Box with finite bounds (what env.rescale_actions maps onto)."""
    if not (isinstance(space, spaces.Box) and np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ConfigError(f"env.rescale_actions: needs a Box action space with finite bounds; {env_id!r} has "
                          f"{space}; set env.rescale_actions=false")


def rescale(raw: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Policy output clipped to [-1, 1], mapped linearly onto [low, high]."""
    return low + (high - low) * (np.clip(raw, -1.0, 1.0) + 1.0) / 2.0


def _clip(x, low, high):
    """``np.clip(x, low, high)`` (the same values, NaN kept) without its Python wrapper: two ufuncs."""
    return np.minimum(np.maximum(x, low), high)


def bootstrap_values(fragment: dict) -> np.ndarray:
    """[T, N]: what GAE bootstraps from where the fragment's next row does not continue the episode:
    ``final_values`` on truncated steps, ``last_value`` on the last step (unless it ended the episode),
    0 elsewhere (the trajectory file's ``bootstrap_values``: with it the file alone rebuilds the batch)."""
    boot = np.array(fragment["final_values"], dtype=np.float32)
    goes_on = ~(np.asarray(fragment["terminated"], bool)[-1] | np.asarray(fragment["truncated"], bool)[-1])
    boot[-1, goes_on] = np.asarray(fragment["last_value"], dtype=np.float32)[goes_on]
    return boot


class RunningMeanStd:
    """Running mean and variance over batches (parallel Welford / Chan et al.)."""

    def __init__(self, shape: tuple = ()):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = 1e-4

    def update(self, x: np.ndarray) -> None:
        n = x.shape[0]
        if n == 1:  # one instance per step (MuJoCo's layout): the same numbers in half the numpy calls
            self._update_one(x[0])
            return
        m, v = x.mean(axis=0), x.var(axis=0)
        delta, total = m - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + v * n + delta ** 2 * self.count * n / total) / total
        self.count = total

    def _update_one(self, m: np.ndarray) -> None:
        """:meth:`update` with one row ``m``: its variance term is 0 (NaN where ``m`` is not finite, as np.var's),
        and the factors n = 1 leave out are exact, so every value is the general formula's to the bit."""
        count = self.count
        total = count + 1
        delta = m - self.mean
        self.mean = self.mean + delta / total
        spread = delta * delta
        spread *= count
        spread /= total
        spread += self.var * count
        spread += (m - m) ** 2
        spread /= total
        self.var = spread
        self.count = total

    def state(self) -> dict:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": float(self.count)}

    def load(self, state: dict) -> None:
        mean, var = np.asarray(state["mean"], np.float64), np.asarray(state["var"], np.float64)
        if mean.shape != self.mean.shape:
            raise ValueError(f"normalisation statistics of shape {mean.shape}, the env's observations are {self.mean.shape}")
        self.mean, self.var, self.count = mean.copy(), var.copy(), float(state["count"])


class VectorSampler:
    """The N instances of ``env_cfg`` on one actor rank; :meth:`sample` returns one [T, N] fragment."""

    def __init__(self, env_cfg, actor_index: int, gamma: float = 0.99, restart: int = 0, clock: Clock = WALL,
                 between_steps=None) -> None:
        """``restart``: how many samplers the actor had before this one (actors.elastic: a new sampler joins at
        each wake); it moves the environments' seeds, so a new one does not replay the first episodes of the last.
        ``clock``: the time an episode ends (virtual under launch.runner=sim). ``between_steps``: called after each
        step (the serial runner's: let the other roles' threads have the interpreter), or None."""
        self.clock = clock
        self.between_steps = between_steps
        self.backend = make_backend(env_cfg)
        self.num_envs = N = self.backend.num_envs
        space = self.backend.action_space
        self.discrete = isinstance(space, spaces.Discrete)
        self.rescale = bool(env_cfg.rescale_actions)
        if self.rescale:
            check_rescalable(env_cfg.id, space)
        self.low = None if self.discrete else np.asarray(space.low, dtype=np.float32)
        self.high = None if self.discrete else np.asarray(space.high, dtype=np.float32)
        self.action_shape = () if self.discrete else tuple(space.shape)
        self.obs_dtype = observation_dtype(self.backend.observation_space, env_cfg.normalize_obs)
        seed = env_cfg.seed + 1000 * actor_index + 1_000_003 * restart
        self.obs = self.backend.reset(seed).astype(self.obs_dtype)
        # actions are drawn from torch's global generator, which every role seeds with env.seed (for
        # identical initial weights): reseed it per actor, or all MPI actor ranks draw the same noise
        torch.manual_seed(seed + 1)
        self.obs_shape = tuple(self.obs.shape[1:])
        self.ep_return = np.zeros(N, dtype=np.float64)
        self.ep_length = np.zeros(N, dtype=np.int64)
        self.clip = env_cfg.clip
        self.obs_rms = RunningMeanStd(self.obs_shape) if env_cfg.normalize_obs else None
        self.ret_rms = RunningMeanStd() if env_cfg.normalize_reward else None
        self.disc_return = np.zeros(N, dtype=np.float64)
        self.gamma = gamma
        self.raw_obs = self.obs
        self.obs = self._norm_obs(self.raw_obs, update=True)

    def _norm_obs(self, raw: np.ndarray, update: bool) -> np.ndarray:
        if self.obs_rms is None:
            return raw
        if update:
            self.obs_rms.update(raw)
        z = (raw - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8)
        return _clip(z, -self.clip, self.clip).astype(np.float32)

    def _scale_rewards(self, r: np.ndarray, done: np.ndarray | None) -> np.ndarray:
        """``r`` scaled by the running std of the discounted return; ``done``: the instances whose episode ended
        (None: none did)."""
        if self.ret_rms is None:
            return r
        self.disc_return = self.disc_return * self.gamma + r
        self.ret_rms.update(self.disc_return)
        if done is not None:
            self.disc_return[done] = 0.0
        return _clip(r / np.sqrt(self.ret_rms.var + 1e-8), -self.clip, self.clip).astype(np.float32)

    def normalizer_state(self) -> dict | None:
        """The running statistics of env.normalize_obs / env.normalize_reward (None without either)."""
        if self.obs_rms is None and self.ret_rms is None:
            return None
        return {"obs": None if self.obs_rms is None else self.obs_rms.state(),
                "reward": None if self.ret_rms is None else self.ret_rms.state()}

    def load_normalizer_state(self, state: dict) -> None:
        """Go on from saved statistics (a resume); the current observation is normalised again with them."""
        if self.obs_rms is not None and state.get("obs") is not None:
            self.obs_rms.load(state["obs"])
            self.obs = self._norm_obs(self.raw_obs, update=False)
        if self.ret_rms is not None and state.get("reward") is not None:
            self.ret_rms.load(state["reward"])

    def policy_obs(self, raw: np.ndarray) -> np.ndarray:
        """Observations of other env copies as this actor's policy sees them (statistics not updated)."""
        return self._norm_obs(raw.astype(self.obs_dtype, copy=False), update=False)

    def env_action(self, a: np.ndarray) -> np.ndarray:
        """The N actions as the env takes them: integers, or Box samples clipped (or rescaled) into the space."""
        if self.discrete:
            return a.astype(np.int64)
        if self.rescale:
            return rescale(a, self.low, self.high).astype(np.float32)
        return _clip(a, self.low, self.high)

    def sample(self, algo, model, T: int, version: int, actor: int) -> tuple[dict[str, np.ndarray], list[Episode]]:
        """T steps of every instance acting with ``algo.act_numpy(model, obs)``; returns (fragment, finished episodes)."""
        N = self.num_envs
        obs = np.empty((T, N, *self.obs_shape), dtype=self.obs_dtype)
        actions = np.empty((T, N, *self.action_shape), dtype=np.int64 if self.discrete else np.float32)
        rewards = np.zeros((T, N), dtype=np.float32)
        terminated = np.zeros((T, N), dtype=np.int8)
        truncated = np.zeros((T, N), dtype=np.int8)
        logp = np.empty((T, N), dtype=np.float32)
        values = np.empty((T, N), dtype=np.float32)
        final_values = np.zeros((T, N), dtype=np.float32)
        episodes: list[Episode] = []
        for t in range(T):
            obs[t] = self.obs
            a, logp[t], values[t] = algo.act_numpy(model, self.obs)
            actions[t] = a
            step = self.backend.step(self.env_action(a))
            rewards[t], terminated[t], truncated[t] = step.rewards, step.terminated, step.truncated
            self.ep_return += step.rewards
            self.ep_length += 1
            done = None
            if step.ended:
                done = step.terminated | step.truncated
                now = self.clock.unix()
                for i in np.flatnonzero(done):
                    episodes.append(Episode(time=now, actor=actor, env_index=int(i),
                                            episode_return=float(self.ep_return[i]), length=int(self.ep_length[i]),
                                            policy_version=version))
                self.ep_return[done], self.ep_length[done] = 0.0, 0
                boot = np.flatnonzero(step.truncated & ~step.terminated)
                if boot.size:
                    with torch.no_grad():
                        final = self._norm_obs(step.final_obs[boot], update=False)
                        final_values[t, boot] = algo.value(model, final).cpu().numpy()
            rewards[t] = self._scale_rewards(rewards[t], done)
            self.raw_obs = step.obs
            self.obs = self._norm_obs(step.obs, update=True)
            if self.between_steps is not None:
                self.between_steps()
        with torch.no_grad():
            last_value = algo.value(model, self.obs).cpu().numpy().astype(np.float32)
        fragment = {"obs": obs, "actions": actions, "rewards": rewards, "terminated": terminated,
                    "truncated": truncated, "behaviour_logp": logp, "values": values,
                    "final_values": final_values, "last_value": last_value, "last_obs": self.obs.copy(),
                    "policy_version": version, "actor": actor}
        return fragment, episodes

    def ready(self) -> None:
        """Nothing: the environments are here (a joining sampler connects first)."""

    def parked(self, seconds: float) -> None:
        """Nothing: the environments stay as they are while the actor is parked."""

    def close(self) -> None:
        self.backend.close()
