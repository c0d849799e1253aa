"""Batched classic-control environments (seed 003): N instances per tensor op on CPU or CUDA."""
from hpcrl.envs.classic.acrobot import Acrobot
from hpcrl.envs.classic.base import BatchedEnv
from hpcrl.envs.classic.cartpole import CartPole

__all__ = ["Acrobot", "BatchedEnv", "CartPole"]
