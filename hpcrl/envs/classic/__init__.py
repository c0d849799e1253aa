"""Batched classic-control environments (seed 003): N instances per tensor op on CPU or CUDA."""
from hpcrl.envs.classic.acrobot import Acrobot
from hpcrl.envs.classic.base import BatchedEnv
from hpcrl.envs.classic.cartpole import CartPole
from hpcrl.envs.classic.mountain_car import MountainCar, MountainCarContinuous
from hpcrl.envs.classic.pendulum import Pendulum

__all__ = ["Acrobot", "BatchedEnv", "CartPole", "MountainCar", "MountainCarContinuous", "Pendulum"]
