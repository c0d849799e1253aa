"""Lorenz system control: restore chaos in the transiently chaotic regime (PAR-RL's Lorenz env).

Setup from PAR-RL (github.com/Romit-Maulik/PAR-RL, examples/lorenz_system/lorenz.py), which took
it from Vashishtha & Verma, "Restoring chaos using deep reinforcement learning", Chaos 30, 031102
(2020): rho = 20, sigma = 10, beta = 8/3 (transient chaos, the orbit would settle on a fixed
point), one action every tau = 0.02, perturbations of each parameter within +-10 % of its value.

    dx/dt = (sigma + d_sigma)(y - x)
    dy/dt = x (rho + d_rho - z) - y
    dz/dt = x y - (beta + d_beta) z

Reward: +10 when the speed |v| = |(dx/dt, dy/dt, dz/dt)| at the new state (with the perturbed
parameters) is at least 40, else -10. Termination as in PAR-RL: after 4000 steps, if the mean
step reward over the last 2000 steps is <= -2 (chaos was not kept up), that step's reward is
replaced by -100 and the episode terminates; otherwise it is truncated (PAR-RL ran RLlib with
horizon 4000, i.e. a time limit there).
"""
from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from hpcrl.errors import ConfigError


def lorenz_rhs(s: tuple[float, float, float], rho: float, sigma: float, beta: float) -> tuple[float, float, float]:
    """Time derivative of the Lorenz state (x, y, z)."""
    x, y, z = s
    return sigma * (y - x), x * (rho - z) - y, x * y - beta * z


def rk4(s: tuple[float, float, float], dt: float, n: int, rho: float, sigma: float, beta: float):
    """n classical Runge-Kutta steps of size dt (plain floats: faster than NumPy for 3 values)."""
    x, y, z = s
    h = 0.5 * dt
    for _ in range(n):
        a = lorenz_rhs((x, y, z), rho, sigma, beta)
        b = lorenz_rhs((x + h * a[0], y + h * a[1], z + h * a[2]), rho, sigma, beta)
        c = lorenz_rhs((x + h * b[0], y + h * b[1], z + h * b[2]), rho, sigma, beta)
        d = lorenz_rhs((x + dt * c[0], y + dt * c[1], z + dt * c[2]), rho, sigma, beta)
        x += dt / 6.0 * (a[0] + 2 * b[0] + 2 * c[0] + d[0])
        y += dt / 6.0 * (a[1] + 2 * b[1] + 2 * c[1] + d[1])
        z += dt / 6.0 * (a[2] + 2 * b[2] + 2 * c[2] + d[2])
    return x, y, z


class LorenzEnv(gym.Env):
    """Keep the Lorenz system chaotic by perturbing (rho, sigma, beta).

    Action: three numbers in [-1, 1]; a_i scales +-`max_perturbation` (10 %) of the nominal
    (rho, sigma, beta). PAR-RL used the unscaled perturbations as the action; the scaling only
    keeps every action dimension in [-1, 1].
    Observation: (x, y, z, dx/dt, dy/dt, dz/dt), float32.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        rho: float = 20.0,
        sigma: float = 10.0,
        beta: float = 8.0 / 3.0,
        tau: float = 0.02,
        substeps: int = 10,
        max_perturbation: float = 0.1,
        speed_threshold: float = 40.0,
        episode_steps: int = 4000,
        judged_steps: int = 2000,
        step_reward: float = 10.0,
        failure_reward: float = -100.0,
        failure_mean: float = -2.0,
        init_box: float = 40.0,
    ) -> None:
        if substeps < 1:
            raise ConfigError(f"env.substeps: must be >= 1, got {substeps}")
        if not 0 < judged_steps <= episode_steps:
            raise ConfigError(f"env.judged_steps: must be in (0, episode_steps={episode_steps}], got {judged_steps}")
        self.nominal = (float(rho), float(sigma), float(beta))
        self.tau, self.substeps = float(tau), int(substeps)
        self.max_perturbation = float(max_perturbation)
        self.speed_threshold = float(speed_threshold)
        self.episode_steps, self.judged_steps = int(episode_steps), int(judged_steps)
        self.step_reward, self.failure_reward, self.failure_mean = step_reward, failure_reward, failure_mean
        self.init_box = float(init_box)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(6,), dtype=np.float32)
        self._state = (0.0, 0.0, 0.0)
        self._rewards: list[float] = []

    def _obs(self, params: tuple[float, float, float]) -> np.ndarray:
        return np.array([*self._state, *lorenz_rhs(self._state, *params)], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        x, y, z = self.np_random.uniform(-self.init_box, self.init_box, size=3)
        self._state = (float(x), float(y), float(z))
        self._rewards = []
        return self._obs(self.nominal), {}

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(3), -1.0, 1.0)
        params = tuple(p * (1.0 + self.max_perturbation * float(ai)) for p, ai in zip(self.nominal, a, strict=True))
        self._state = rk4(self._state, self.tau / self.substeps, self.substeps, *params)
        obs = self._obs(params)
        speed = math.sqrt(float(obs[3]) ** 2 + float(obs[4]) ** 2 + float(obs[5]) ** 2)
        reward = self.step_reward if speed >= self.speed_threshold else -self.step_reward
        self._rewards.append(reward)
        terminated = truncated = False
        if len(self._rewards) >= self.episode_steps:
            if np.mean(self._rewards[-self.judged_steps:]) <= self.failure_mean:
                reward, terminated = self.failure_reward, True
            else:
                truncated = True
        return obs, float(reward), terminated, truncated, {"speed": speed, "params": params}
