"""Batched Acrobot-v1: Gymnasium's two-link swing-up (Sutton 1996; "book" dynamics) for N instances.

Same constants, RK4 step of dt = 0.2 s on (theta1, theta2, dtheta1, dtheta2, torque), angle
wrapping to [-pi, pi], velocity bounds (4 pi, 9 pi), termination (-cos t1 - cos(t1 + t2) > 1),
reward (-1, 0 on the terminal step) and time limit (500) as
``gymnasium.envs.classic_control.AcrobotEnv``; initial states uniform in [-0.1, 0.1]^4.

Angles are wrapped as ``theta - 2 pi round(theta / 2 pi)``: Gymnasium's repeated subtraction
gives the same value for one wrap and the same angle up to an ulp for more.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from hpcrl.envs.classic.base import BatchedEnv


class Acrobot(BatchedEnv):
    state_names = ("theta1", "theta2", "dtheta1", "dtheta2")
    default_max_episode_steps = 500

    dt = 0.2
    LINK_LENGTH_1 = 1.0
    LINK_MASS_1 = 1.0
    LINK_MASS_2 = 1.0
    LINK_COM_POS_1 = 0.5
    LINK_COM_POS_2 = 0.5
    LINK_MOI = 1.0
    MAX_VEL_1 = 4 * math.pi
    MAX_VEL_2 = 9 * math.pi
    gravity = 9.8

    _high = np.array([1.0, 1.0, 1.0, 1.0, MAX_VEL_1, MAX_VEL_2], dtype=np.float32)
    single_observation_space = spaces.Box(-_high, _high, dtype=np.float32)
    single_action_space = spaces.Discrete(3)  # torque -1, 0, +1

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        m1, m2, l1 = self.LINK_MASS_1, self.LINK_MASS_2, self.LINK_LENGTH_1
        lc1, lc2, moi, g = self.LINK_COM_POS_1, self.LINK_COM_POS_2, self.LINK_MOI, self.gravity
        self.k = self._constants(
            d1_const=m1 * lc1**2 + m2 * (l1**2 + lc2**2) + 2 * moi,  # d1 = d1_const + d1_cos cos(theta2)
            d1_cos=2 * m2 * l1 * lc2,
            d2_const=m2 * lc2**2 + moi,  # d2 = d2_const + d2_cos cos(theta2)
            d2_cos=m2 * l1 * lc2,
            phi2=m2 * lc2 * g,  # phi2 = m2 lc2 g cos(t1 + t2 - pi/2) = phi2 sin(t1 + t2)
            phi1_gravity=(m1 * lc1 + m2 * l1) * g,
            coupling=m2 * l1 * lc2, neg_coupling=-m2 * l1 * lc2,
            inertia2=m2 * lc2**2 + moi,
            one=1.0, two_pi=2 * math.pi, inv_two_pi=1 / (2 * math.pi),
            max_vel_1=self.MAX_VEL_1, max_vel_2=self.MAX_VEL_2)

    def _initial_states(self, count: int) -> Tensor:
        return self._uniform(-0.1, 0.1, 4, count)

    def _observe(self, state: Tensor) -> Tensor:
        obs = torch.empty(6, state.shape[1], dtype=torch.float32, device=state.device)
        angles = state[:2]
        obs[0:4:2] = torch.cos(angles)  # cos t1, cos t2
        obs[1:4:2] = torch.sin(angles)  # sin t1, sin t2
        obs[4:] = state[2:]
        return obs

    def _derivatives(self, s: Tensor, torque: Tensor) -> Tensor:
        """d/dt (theta1, theta2, dtheta1, dtheta2): the "book" equations of Gymnasium's _dsdt."""
        k = self.k
        theta1, theta2, dtheta1, dtheta2 = s
        cos2, sin2 = torch.cos(theta2), torch.sin(theta2)
        d1 = torch.addcmul(k.d1_const, cos2, k.d1_cos)
        d2 = torch.addcmul(k.d2_const, cos2, k.d2_cos)
        phi2 = torch.sin(theta1 + theta2).mul_(k.phi2)
        # phi1 = -m2 l1 lc2 sin(t2) (dt2^2 + 2 dt2 dt1) + (m1 lc1 + m2 l1) g sin(t1) + phi2
        phi1 = torch.add(dtheta2, dtheta1, alpha=2.0).mul_(dtheta2).mul_(sin2).mul_(k.neg_coupling)
        phi1.addcmul_(torch.sin(theta1), k.phi1_gravity).add_(phi2)
        # ddt2 = (a + d2/d1 phi1 - m2 l1 lc2 dt1^2 sin(t2) - phi2) / (m2 lc2^2 + I2 - d2^2/d1)
        d2_over_d1 = d2 / d1
        numerator = torch.addcmul(torque, d2_over_d1, phi1).sub_(dtheta1.square().mul_(sin2).mul_(k.coupling)).sub_(phi2)
        ddtheta2 = numerator.div_(torch.addcmul(k.inertia2, d2_over_d1, d2, value=-1.0))
        ddtheta1 = torch.addcmul(phi1, d2, ddtheta2).div_(d1).neg_()
        return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2))

    def _advance(self, action: Tensor) -> tuple[Tensor, Tensor]:
        k, y, h = self.k, self.state, self.dt
        torque = action.to(self.dtype).sub_(k.one)  # AVAIL_TORQUE[a] = a - 1
        k1 = self._derivatives(y, torque)
        k2 = self._derivatives(torch.add(y, k1, alpha=h / 2), torque)
        k3 = self._derivatives(torch.add(y, k2, alpha=h / 2), torque)
        k4 = self._derivatives(torch.add(y, k3, alpha=h), torque)
        y.add_(k1.add_(k2, alpha=2.0).add_(k3, alpha=2.0).add_(k4), alpha=h / 6)  # RK4
        angles = y[:2]
        angles.sub_(torch.round(angles * k.inv_two_pi).mul_(k.two_pi))  # wrap to [-pi, pi]
        y[2].clamp_(-self.MAX_VEL_1, self.MAX_VEL_1)
        y[3].clamp_(-self.MAX_VEL_2, self.MAX_VEL_2)
        terminated = torch.cos(y[0]).add_(torch.cos(y[0] + y[1])).neg_() > k.one
        return terminated.to(torch.float32).sub_(1.0), terminated
