"""PAR-RL workloads: Lorenz control, 2D LES closure, OpenFOAM dynamic relaxation."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from hpcrl.envs import make, spec
from hpcrl.envs.parrl.lorenz import LorenzEnv, rk4


def _check(env) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unbounded Box warnings are expected here
        check_env(env, skip_render_check=True)


# ---------------------------------------------------------------- Lorenz

def test_lorenz_passes_env_checker():
    _check(LorenzEnv())


def test_lorenz_rk4_converges_to_fixed_point_without_control():
    # rho = 20 is transiently chaotic: the uncontrolled orbit ends on C+- = (+-sqrt(beta(rho-1)), ., rho-1).
    x, y, z = rk4((1.0, 1.0, 1.0), 0.002, 200_000, 20.0, 10.0, 8.0 / 3.0)
    c = np.sqrt(8.0 / 3.0 * 19.0)
    assert abs(abs(x) - c) < 1e-6 and abs(y - x) < 1e-6 and abs(z - 19.0) < 1e-6


def test_lorenz_uncontrolled_episode_terminates_with_penalty():
    env = LorenzEnv(episode_steps=400, judged_steps=200)
    env.reset(seed=3)
    rewards = []
    while True:
        obs, r, terminated, truncated, info = env.step(np.zeros(3, np.float32))
        rewards.append(r)
        if terminated or truncated:
            break
    assert terminated and not truncated and len(rewards) == 400
    assert rewards[-1] == -100.0
    assert set(rewards[:-1]) <= {10.0, -10.0}
    assert rewards[-2] == -10.0  # settled on a fixed point: speed ~ 0


def test_lorenz_reward_follows_speed_and_action_scales_parameters():
    env = LorenzEnv()
    env.reset(seed=0)
    obs, r, *_, info = env.step(np.array([1.0, -1.0, 0.5], np.float32))
    assert np.allclose(info["params"], (22.0, 9.0, 8.0 / 3.0 * 1.05))
    assert r == (10.0 if np.linalg.norm(obs[3:]) >= 40.0 else -10.0)
    assert info["speed"] == pytest.approx(float(np.linalg.norm(obs[3:].astype(np.float64))), rel=1e-5)


def test_lorenz_kept_chaotic_is_truncated_not_terminated():
    env = LorenzEnv(episode_steps=50, judged_steps=25, speed_threshold=0.0)  # every step counts as chaotic
    env.reset(seed=1)
    for _ in range(50):
        _, r, terminated, truncated, _ = env.step(env.action_space.sample())
    assert truncated and not terminated and r == 10.0


def test_lorenz_registered():
    assert spec("hpcrl/Lorenz-v0").kind == "gym"
    assert isinstance(make("hpcrl/Lorenz-v0", episode_steps=10, judged_steps=5), LorenzEnv)
