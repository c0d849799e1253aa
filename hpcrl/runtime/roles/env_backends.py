"""The environments of one actor rank as N instances behind one small interface, for every env kind.

A backend steps its N instances together and resets the ones that ended in the same step::

    backend.num_envs                   N, the instances (the N of every fragment)
    backend.observation_space          one instance's spaces
    backend.action_space
    backend.reset(seed) -> obs         [N, *obs_shape] float32 (uint8 frames stay uint8); instance i seeded from seed + i (or the copy's)
    backend.step(actions) -> Step      actions [N, ...] as the env takes them (clipped or rescaled already)
    backend.close()

:class:`Step` holds ``obs`` (for an instance that ended: the first observation of its next
episode), ``rewards`` [N] (float64 unless the env computes float32), ``terminated`` and
``truncated`` [N] bool, ``ended`` (whether any instance ended: most steps end none) and
``final_obs`` ([N, *obs_shape]: the observation each instance that ended ended in; equal to
``obs`` elsewhere), from which the sampler bootstraps truncated episodes.

Kinds (``hpcrl.envs.spec(id).kind``; Gymnasium ids are ``gym``):

- ``gym``: ``env.num_envs`` single Gymnasium envs, our own reset on termination or truncation;
- ``batched``: one tensor ``VectorEnv`` of ``env.num_envs`` instances on the CPU (hpcrl's classic
  control), Gymnasium's same-step autoreset, ``info["final_obs"]`` where ``info["_final_obs"]``;
- ``parallel``: ``env.num_envs`` copies of a PettingZoo ``ParallelEnv`` with a parameter-shared
  policy: every agent of every copy is one instance, instance ``k * A + j`` = agent j (in
  ``possible_agents`` order) of copy k, A agents per copy. All agents must share one observation
  and one action space, be present after ``reset`` and end their episode in the same step (the
  copy is then reset); anything else raises. Where the env registers ``copies`` (a function making them all as one
  object, e.g. MPE simple-spread's in numpy) and implements the kwargs, :class:`CopiesBackend` steps them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from hpcrl.envs import import_env_modules, make, spec
from hpcrl.errors import ConfigError


@dataclass
class Step:
    """One step of all N instances (see the module docstring)."""

    obs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    ended: bool
    """Whether any instance ended (terminated or truncated) in this step."""


def env_kind(env_id: str) -> str:
    """'gym', 'batched' or 'parallel' (ids that hpcrl does not register are Gymnasium's: 'gym')."""
    s = spec(env_id)
    return "gym" if s is None else s.kind


def make_backend(env_cfg, count: int | None = None) -> "GymBackend | BatchedBackend | ParallelBackend | CopiesBackend":
    """The backend of ``env_cfg.id``'s kind: ``count`` (default ``env_cfg.num_envs``) envs, instances or copies.

    ``env_cfg.imports`` are imported first: this is where every rank (either runner, batch jobs, a rank the
    prestart server forked) and ``hpcrl eval`` make envs, so a user's own Gymnasium id is registered there."""
    import_env_modules(env_cfg.imports)
    env_id, kwargs, n = env_cfg.id, env_cfg.kwargs, env_cfg.num_envs if count is None else count
    kind = env_kind(env_id)
    if kind == "batched":
        for key in ("num_envs", "device"):
            if key in kwargs:
                raise ConfigError(f"env.kwargs.{key}: not allowed for the batched env {env_id!r} on actors "
                                  f"(instances per actor rank: env.num_envs; device: cpu)")
        return BatchedBackend(make(env_id, num_envs=n, device="cpu", **kwargs))
    if kind == "parallel":
        copies = spec(env_id).load_copies()  # the copies in numpy, where the env has them for these kwargs
        together = None if copies is None else copies(n, **kwargs)
        if together is not None:
            return CopiesBackend(together)
    envs = [make(env_id, **kwargs) for _ in range(n)]
    return ParallelBackend(envs, env_id) if kind == "parallel" else GymBackend(envs)


class GymBackend:
    """Gymnasium envs in lock-step."""

    def __init__(self, envs: list) -> None:
        self.envs = envs
        self.num_envs = len(envs)
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        # uint8 frames stay uint8 (4x smaller fragments and trajectories); everything else float32
        self.dtype = np.uint8 if np.dtype(self.observation_space.dtype) == np.uint8 else np.float32

    def reset(self, seed: int) -> np.ndarray:
        obs = []
        for i, env in enumerate(self.envs):
            obs.append(env.reset(seed=seed + i)[0])
            env.action_space.seed(seed + i)
        return np.stack(obs).astype(self.dtype)

    def step(self, actions: np.ndarray) -> Step:
        N = self.num_envs
        rewards = np.zeros(N, np.float64)
        term, trunc = np.zeros(N, bool), np.zeros(N, bool)
        obs = np.empty((N, *self.observation_space.shape), self.dtype)
        final = np.empty_like(obs)
        ended = False
        for i, env in enumerate(self.envs):  # Discrete: actions[i] is a numpy int64, which every space accepts
            o, r, te, tr, _ = env.step(actions[i])
            rewards[i], term[i], trunc[i] = r, te, tr
            final[i] = o
            if te or tr:
                o, _ = env.reset()
                ended = True
            obs[i] = o
        return Step(obs, rewards, term, trunc, final, ended)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class BatchedBackend:
    """One hpcrl tensor VectorEnv on the CPU; its tensors become numpy once per step."""

    def __init__(self, env) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space

    def reset(self, seed: int) -> np.ndarray:
        obs, _ = self.env.reset(seed=seed)
        return np.array(obs.numpy(), dtype=np.float32)

    def step(self, actions: np.ndarray) -> Step:
        import torch

        obs, rewards, term, trunc, info = self.env.step(torch.as_tensor(actions))
        obs = np.array(obs.numpy(), dtype=np.float32)
        final = obs.copy()
        ended = info["_final_obs"].numpy()  # the instances that terminated or truncated
        any_ended = bool(ended.any())
        if any_ended:
            final[ended] = info["final_obs"].numpy()[ended]
        return Step(obs, rewards.numpy().astype(np.float32), term.numpy().copy(), trunc.numpy().copy(), final,
                    any_ended)

    def close(self) -> None:
        self.env.close()


class ParallelBackend:
    """Copies of a PettingZoo ParallelEnv; every agent of every copy is one instance."""

    def __init__(self, envs: list, env_id: str = "") -> None:
        self.envs = envs
        self.agents = list(envs[0].possible_agents)
        self.num_agents = len(self.agents)
        self.num_envs = len(envs) * self.num_agents
        self.observation_space, self.action_space = shared_spaces(envs[0], env_id)

    def _check_agents(self, k: int) -> None:
        if sorted(self.envs[k].agents) != sorted(self.agents):
            raise RuntimeError(f"parallel env copy {k}: agents after reset {self.envs[k].agents} are not "
                               f"possible_agents {self.agents}; the parameter-shared backend needs every agent")

    def reset(self, seed: int) -> np.ndarray:
        obs = np.empty((self.num_envs, *self.observation_space.shape), np.float32)
        A = self.num_agents
        for k, env in enumerate(self.envs):
            obs_d, _ = env.reset(seed=seed + k)
            self._check_agents(k)
            obs[k * A:(k + 1) * A] = [obs_d[a] for a in self.agents]
        return obs

    def step(self, actions: np.ndarray) -> Step:
        N, A = self.num_envs, self.num_agents
        obs = np.empty((N, *self.observation_space.shape), np.float32)
        final = np.empty_like(obs)
        rewards = np.zeros(N, np.float64)
        term, trunc = np.zeros(N, bool), np.zeros(N, bool)
        any_ended = False
        for k, env in enumerate(self.envs):
            rows = slice(k * A, (k + 1) * A)
            obs_d, rew, te, tr, _ = env.step({a: actions[k * A + j] for j, a in enumerate(self.agents)})
            final[rows] = [obs_d[a] for a in self.agents]
            rewards[rows] = [rew[a] for a in self.agents]
            term[rows] = [bool(te[a]) for a in self.agents]
            trunc[rows] = [bool(tr[a]) for a in self.agents]
            ended = term[rows] | trunc[rows]
            if ended.all():
                any_ended = True
                obs_d, _ = env.reset()
                self._check_agents(k)
                obs[rows] = [obs_d[a] for a in self.agents]
            elif ended.any():
                raise RuntimeError(f"parallel env copy {k}: agents {[a for a, e in zip(self.agents, ended) if e]} "
                                   "ended before the others; the parameter-shared backend needs them to end together")
            else:
                obs[rows] = final[rows]
        return Step(obs, rewards, term, trunc, final, any_ended)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class CopiesBackend:
    """A parallel env's copies stepped together by one object (the env's ``copies`` in hpcrl/envs/registry.py, e.g.
    hpcrl/envs/mpe_spread_copies.py): the same instances, in the same order, as :class:`ParallelBackend`'s."""

    def __init__(self, copies) -> None:
        self.copies = copies
        self.agents = list(copies.possible_agents)
        self.num_agents = len(self.agents)
        self.num_envs = copies.copies * self.num_agents
        self.observation_space, self.action_space = copies.observation_space, copies.action_space

    def reset(self, seed: int) -> np.ndarray:
        return np.concatenate([self.copies.reset_copy(k, seed + k) for k in range(self.copies.copies)])

    def step(self, actions: np.ndarray) -> Step:
        C, A = self.copies.copies, self.num_agents
        final, rewards, truncated = self.copies.step(np.asarray(actions).reshape(C, A))
        final = final.reshape(self.num_envs, *self.observation_space.shape)
        trunc = np.repeat(truncated, A)
        obs = final
        if truncated.any():
            obs = final.copy()
            for k in np.flatnonzero(truncated):
                obs[k * A:(k + 1) * A] = self.copies.reset_copy(k)
        return Step(obs, rewards.reshape(-1), np.zeros(self.num_envs, bool), trunc, final, bool(truncated.any()))

    def close(self) -> None:
        self.copies.close()


def shared_spaces(env, env_id: str) -> tuple[spaces.Space, spaces.Space]:
    """The one observation and action space all agents of a ParallelEnv share (ConfigError otherwise)."""
    agents = list(env.possible_agents)
    if not agents:
        raise ConfigError(f"env.id: the parallel env {env_id!r} has no possible_agents")
    obs, act = env.observation_space(agents[0]), env.action_space(agents[0])
    for a in agents[1:]:
        if env.observation_space(a) != obs or env.action_space(a) != act:
            raise ConfigError(f"env.id: the agents of {env_id!r} do not share one observation and action space "
                              f"({agents[0]} vs {a}); actors run one parameter-shared policy for all agents")
    return obs, act


def describe(env_cfg) -> tuple[spaces.Space, spaces.Space, int]:
    """(one instance's observation space, action space, instances per actor rank), from one env (copy)."""
    backend = make_backend(env_cfg, count=1)
    try:
        return backend.observation_space, backend.action_space, backend.num_envs * env_cfg.num_envs
    finally:
        backend.close()
