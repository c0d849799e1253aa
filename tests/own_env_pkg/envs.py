"""A tiny Gymnasium env registered at import: `env.imports: [own_env_pkg.envs]`, `env.id: OwnCorridor-v0`."""
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Corridor(gym.Env):
    """Walk a corridor of `length` cells from cell 0: action 1 steps right, 0 left.
    Reward 1 on reaching the far end (the episode ends), -0.01 for every other step."""

    def __init__(self, length: int = 5):
        self.length = length
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        arrived = self.pos == self.length
        obs = np.array([self.pos / self.length], np.float32)
        return obs, 1.0 if arrived else -0.01, arrived, False, {}


gym.register("OwnCorridor-v0", entry_point=Corridor, max_episode_steps=50)
