"""A PettingZoo wrapper that zero-pads every agent's 1-D Box observation to the longest one.

The actors' parallel backend treats agents as instances of one observation space; MPE's
simple-adversary gives the adversary 2 numbers fewer than the good agents (:mod:`hpcrl.envs.mpe`).
Its own module so that naming an MPE id in a config does not import PettingZoo.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.wrappers import BaseParallelWrapper


class PaddedObservations(BaseParallelWrapper):
    """A ParallelEnv whose agents' 1-D Box observations are zero-padded to the longest one.

    A PettingZoo wrapper (``BaseParallelWrapper``), so ``unwrapped``, ``state``, ``render`` and the
    other ParallelEnv attributes reach the wrapped env, and PettingZoo's checkers accept it.
    """

    def __init__(self, env) -> None:
        super().__init__(env)
        self.possible_agents = list(env.possible_agents)
        self.metadata = getattr(env, "metadata", {})
        width = max(int(np.prod(env.observation_space(a).shape)) for a in self.possible_agents)
        self._space = spaces.Box(-np.inf, np.inf, (width,), np.float32)

    @property
    def agents(self) -> list:
        return self.env.agents

    @property
    def observation_spaces(self) -> dict:
        return {a: self._space for a in self.possible_agents}

    def observation_space(self, agent):
        return self._space

    def _pad(self, obs: dict) -> dict:
        out = {}
        for a, o in obs.items():
            row = np.zeros(self._space.shape, np.float32)
            row[: o.size] = o
            out[a] = row
        return out

    def reset(self, seed=None, options=None):
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._pad(obs), infos

    def step(self, actions):
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        return self._pad(obs), rewards, terminated, truncated, infos
