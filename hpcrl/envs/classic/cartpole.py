"""Batched CartPole-v1: Gymnasium's cart-pole (Barto, Sutton & Anderson 1983) for N instances.

Same dynamics, constants, termination, reward (1 per step, the terminal step included) and
time limit (500) as ``gymnasium.envs.classic_control.CartPoleEnv`` with its default Euler
integrator; initial states uniform in [-0.05, 0.05]^4.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from hpcrl.envs.classic.base import BatchedEnv


class CartPole(BatchedEnv):
    state_names = ("x", "x_dot", "theta", "theta_dot")
    default_max_episode_steps = 500

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02  # seconds per step
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    _high = np.array([x_threshold * 2, np.inf, theta_threshold_radians * 2, np.inf], dtype=np.float32)
    single_observation_space = spaces.Box(-_high, _high, dtype=np.float32)
    single_action_space = spaces.Discrete(2)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.k = self._constants(
            two_force=2 * self.force_mag, force=self.force_mag, gravity=self.gravity, inv_total_mass=1 / self.total_mass,
            length_4_3=self.length * 4.0 / 3.0, x_threshold=self.x_threshold, theta_threshold=self.theta_threshold_radians)

    def _initial_states(self, count: int) -> Tensor:
        return self._uniform(-0.05, 0.05, 4, count)

    def _observe(self, state: Tensor) -> Tensor:
        return state.to(torch.float32, copy=True)

    def _advance(self, action: Tensor) -> tuple[Tensor, Tensor]:
        k, n = self.k, self.num_envs
        _, _, theta, theta_dot = self.state
        force = action.to(self.dtype).mul_(k.two_force).sub_(k.force)  # +F for action 1, -F for 0
        cos, sin = torch.cos(theta), torch.sin(theta)
        # temp = (F + m_p l theta_dot^2 sin) / M
        temp = torch.addcmul(force, theta_dot.square(), sin, value=self.polemass_length).mul_(k.inv_total_mass)
        # theta_acc = (g sin - cos temp) / (l (4/3 - m_p cos^2 / M))
        denominator = torch.addcmul(k.length_4_3, cos, cos, value=-self.length * self.masspole / self.total_mass)
        theta_acc = (sin * k.gravity).addcmul_(cos, temp, value=-1.0).div_(denominator)
        # x_acc = temp - m_p l theta_acc cos / M
        x_acc = torch.addcmul(temp, theta_acc, cos, value=-self.polemass_length / self.total_mass)
        # Euler: positions move with the old velocities, then velocities with the accelerations
        positions, velocities = self.state.view(2, 2, n).unbind(1)  # rows (x, theta), (x_dot, theta_dot)
        positions.add_(velocities, alpha=self.tau)
        velocities[0].add_(x_acc, alpha=self.tau)
        velocities[1].add_(theta_acc, alpha=self.tau)
        x_abs, theta_abs = positions.abs()
        terminated = (x_abs > k.x_threshold).logical_or_(theta_abs > k.theta_threshold)
        return torch.ones(n, dtype=torch.float32, device=self.device), terminated
