"""Batched Pendulum-v1: Gymnasium's inverted pendulum swing-up for N instances (continuous torque).

Same constants (g = 10 by default, m = l = 1, dt = 0.05, |torque| <= 2, |theta_dot| <= 8), cost
(normalised angle^2 + 0.1 theta_dot^2 + 0.001 u^2, reward = -cost), no termination, time
limit 200 and initial states (theta uniform in [-pi, pi], theta_dot in [-1, 1]) as
``gymnasium.envs.classic_control.PendulumEnv``. The angle is not wrapped (as in Gymnasium).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from hpcrl.envs.classic.base import BatchedEnv


class Pendulum(BatchedEnv):
    state_names = ("theta", "theta_dot")
    default_max_episode_steps = 200

    max_speed = 8.0
    max_torque = 2.0
    dt = 0.05
    m = 1.0
    l = 1.0  # noqa: E741 (Gymnasium's name)

    _high = np.array([1.0, 1.0, max_speed], dtype=np.float32)
    single_observation_space = spaces.Box(-_high, _high, dtype=np.float32)
    single_action_space = spaces.Box(-max_torque, max_torque, shape=(1,), dtype=np.float32)

    def __init__(self, *args, g: float = 10.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.g = g
        self.k = self._constants(pi=math.pi, two_pi=2 * math.pi, gravity_term=3 * g / (2 * self.l),
                                 torque_term=3.0 / (self.m * self.l**2))
        self._reset_high = torch.tensor([[math.pi], [1.0]], dtype=self.dtype, device=self.device)

    def _initial_states(self, count: int) -> Tensor:
        return self._uniform(-self._reset_high, self._reset_high, 2, count)

    def _observe(self, state: Tensor) -> Tensor:
        obs = torch.empty(3, state.shape[1], dtype=torch.float32, device=state.device)
        obs[0] = torch.cos(state[0])
        obs[1] = torch.sin(state[0])
        obs[2] = state[1]
        return obs

    def _advance(self, action: Tensor) -> tuple[Tensor, Tensor]:
        k = self.k
        theta, theta_dot = self.state
        u = action.reshape(self.num_envs).to(self.dtype).clamp(-self.max_torque, self.max_torque)
        normalized = torch.remainder(theta + k.pi, k.two_pi).sub_(k.pi)  # angle_normalize
        cost = normalized.square_().add_(theta_dot.square(), alpha=0.1).add_(u.square(), alpha=0.001)
        # theta_dot += (3 g / (2 l) sin(theta) + 3 / (m l^2) u) dt, clipped; theta += theta_dot dt
        accel = torch.sin(theta).mul_(k.gravity_term).addcmul_(u, k.torque_term)
        theta_dot.add_(accel, alpha=self.dt).clamp_(-self.max_speed, self.max_speed)
        theta.add_(theta_dot, alpha=self.dt)
        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return cost.neg_().to(torch.float32), terminated
