"""Batched MountainCar-v0 (discrete) and MountainCarContinuous-v0 for N instances (Moore 1990).

Same constants, update order (velocity, clip, position, clip, stop at the left wall),
termination (position >= goal and velocity >= goal_velocity), rewards and time limits
(200 and 999) as Gymnasium's ``MountainCarEnv`` and ``Continuous_MountainCarEnv``; initial
position uniform in [-0.6, -0.4], velocity 0.
"""
from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from hpcrl.envs.classic.base import BatchedEnv


class _MountainCarBase(BatchedEnv):
    state_names = ("position", "velocity")
    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.5
    goal_velocity = 0.0

    single_observation_space = spaces.Box(np.array([min_position, -max_speed], dtype=np.float32),
                                          np.array([max_position, max_speed], dtype=np.float32), dtype=np.float32)

    def __init__(self, *args, goal_velocity: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.goal_velocity = goal_velocity
        self.k = self._constants(min_position=self.min_position, goal_position=self.goal_position,
                                 goal_velocity=goal_velocity, zero=0.0)

    def _initial_states(self, count: int) -> Tensor:
        state = torch.zeros(2, count, dtype=self.dtype, device=self.device)
        state[0] = self._uniform(-0.6, -0.4, 1, count)[0]
        return state

    def _observe(self, state: Tensor) -> Tensor:
        return state.to(torch.float32, copy=True)

    def _move(self, velocity_change: Tensor) -> Tensor:
        """Shared update: velocity += change, clip, position += velocity, clip, stop at the left wall.
        Returns terminated."""
        k = self.k
        position, velocity = self.state
        velocity.add_(velocity_change).clamp_(-self.max_speed, self.max_speed)
        position.add_(velocity).clamp_(self.min_position, self.max_position)
        velocity.masked_fill_((position == k.min_position).logical_and_(velocity < k.zero), 0.0)
        return (position >= k.goal_position).logical_and_(velocity >= k.goal_velocity)


class MountainCar(_MountainCarBase):
    default_max_episode_steps = 200
    force = 0.001
    gravity = 0.0025
    single_action_space = spaces.Discrete(3)  # push left, no push, push right

    def _advance(self, action: Tensor) -> tuple[Tensor, Tensor]:
        position = self.state[0]
        # (action - 1) force + cos(3 position) (-gravity)
        change = torch.cos(position * 3.0).mul_(-self.gravity).add_(action.to(self.dtype).sub_(1.0), alpha=self.force)
        terminated = self._move(change)
        return torch.full((self.num_envs,), -1.0, device=self.device), terminated


class MountainCarContinuous(_MountainCarBase):
    default_max_episode_steps = 999
    goal_position = 0.45
    power = 0.0015
    single_action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)

    def _advance(self, action: Tensor) -> tuple[Tensor, Tensor]:
        position = self.state[0]
        a = action.reshape(self.num_envs).to(self.dtype)
        # force power - 0.0025 cos(3 position), force = a clipped to [-1, 1]
        change = torch.cos(position * 3.0).mul_(-0.0025).add_(a.clamp(-1.0, 1.0), alpha=self.power)
        terminated = self._move(change)
        reward = terminated.to(self.dtype).mul_(100.0).sub_(a.square().mul_(0.1))  # penalty on the raw action
        return reward.to(torch.float32), terminated
