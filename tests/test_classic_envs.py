"""Batched classic-control envs against Gymnasium's reference envs, transition by transition.

Each reference transition starts from a state the batched env is put into as well (float64
state copied in, the TimeLimit step counter too); both apply the same action and must agree
on the next observation, reward, terminated and truncated.

Tolerances: with ``dtype=float64`` the batched env computes in Gymnasium's precision and
observations agree to 1e-6 (float32 rounding of the observation), rewards to 1e-9 relative,
flags exactly. With ``dtype=float32`` observations and rewards agree to the per-env
``f32_tol`` below (relative and absolute), and a flag may differ only where the reference
next state lies within that tolerance of a termination boundary (such cases are counted
and must be rare).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch

from hpcrl.envs.classic import Acrobot, CartPole, MountainCar, MountainCarContinuous, Pendulum

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass
class Case:
    gym_id: str
    cls: type
    random_states: Callable[[np.random.Generator, int], np.ndarray]
    """[k, S] float64 states off the usual trajectories (edges of the state space included)."""
    random_actions: Callable[[np.random.Generator, int], np.ndarray]
    boundary_distance: Callable[[np.ndarray], np.ndarray]
    """[k] distance of next states [k, S] from the termination boundary (inf: never terminates)."""
    f32_tol: float
    reset_bounds: tuple[np.ndarray, np.ndarray]
    """Bounds of the initial state (per state row)."""


def _cartpole_states(rng, k):
    high = np.array([2.4, 3.0, 12 * 2 * math.pi / 360, 3.5])
    return rng.uniform(-high, high, size=(k, 4))


def _cartpole_boundary(s):
    return np.minimum(np.abs(np.abs(s[:, 0]) - 2.4), np.abs(np.abs(s[:, 2]) - 12 * 2 * math.pi / 360))


def _acrobot_states(rng, k):
    high = np.array([math.pi, math.pi, 4 * math.pi, 9 * math.pi])
    return rng.uniform(-high, high, size=(k, 4))


def _acrobot_boundary(s):
    return np.abs(-np.cos(s[:, 0]) - np.cos(s[:, 1] + s[:, 0]) - 1.0)


def _pendulum_states(rng, k):
    return rng.uniform([-3 * math.pi, -8.0], [3 * math.pi, 8.0], size=(k, 2))


def _car_states(rng, k):
    states = rng.uniform([-1.2, -0.07], [0.6, 0.07], size=(k, 2))
    states[: k // 10, 0] = -1.2 + rng.uniform(0, 0.01, size=k // 10)  # against the left wall
    return states


def _car_boundary(goal):
    return lambda s: np.minimum(np.abs(s[:, 0] - goal), np.abs(s[:, 1]))


def _uniform_actions(bound):  # beyond the action bounds too: the env clips
    return lambda rng, k: rng.uniform(-bound, bound, size=(k, 1)).astype(np.float32)


CASES = {
    "CartPole-v1": Case("CartPole-v1", CartPole, _cartpole_states, lambda rng, k: rng.integers(0, 2, size=k),
                        _cartpole_boundary, 1e-5, (np.full(4, -0.05), np.full(4, 0.05))),
    "Acrobot-v1": Case("Acrobot-v1", Acrobot, _acrobot_states, lambda rng, k: rng.integers(0, 3, size=k),
                       _acrobot_boundary, 1e-3, (np.full(4, -0.1), np.full(4, 0.1))),
    "Pendulum-v1": Case("Pendulum-v1", Pendulum, _pendulum_states, _uniform_actions(2.5),
                        lambda s: np.full(len(s), np.inf), 1e-5, (np.array([-math.pi, -1.0]), np.array([math.pi, 1.0]))),
    "MountainCar-v0": Case("MountainCar-v0", MountainCar, _car_states, lambda rng, k: rng.integers(0, 3, size=k),
                           _car_boundary(0.5), 1e-5, (np.array([-0.6, 0.0]), np.array([-0.4, 0.0]))),
    "MountainCarContinuous-v0": Case("MountainCarContinuous-v0", MountainCarContinuous, _car_states,
                                     _uniform_actions(1.5), _car_boundary(0.45), 1e-5,
                                     (np.array([-0.6, 0.0]), np.array([-0.4, 0.0]))),
}


def put_state(env: gym.Env, state: np.ndarray, elapsed: int | None = None) -> None:
    """Put a reference env (TimeLimit-wrapped) into ``state`` as if it had not ended yet."""
    env.unwrapped.state = np.array(state, dtype=np.float64)
    if hasattr(env.unwrapped, "steps_beyond_terminated"):  # CartPole's after-the-end bookkeeping
        env.unwrapped.steps_beyond_terminated = None
    if elapsed is not None:
        env._elapsed_steps = int(elapsed)


def reference_transitions(case: Case, rng: np.random.Generator, episodes_steps: int, random_count: int):
    """Records (state, elapsed, action, obs, reward, terminated, truncated, next_state) from Gymnasium.

    Half the start states come from the env's own random-action trajectories, the rest from
    ``case.random_states``; a third of all transitions start one step before the time limit.
    """
    env = gym.make(case.gym_id)
    limit = env.spec.max_episode_steps
    env.reset(seed=int(rng.integers(1 << 30)))
    starts, elapsed = [], []
    for _ in range(episodes_steps):
        starts.append(np.array(env.unwrapped.state, dtype=np.float64))
        elapsed.append(env._elapsed_steps)
        _, _, term, trunc, _ = env.step(case.random_actions(rng, 1)[0])
        if term or trunc:
            env.reset(seed=int(rng.integers(1 << 30)))
    starts = np.concatenate([np.stack(starts), case.random_states(rng, random_count)])
    elapsed = np.concatenate([elapsed, rng.integers(0, limit, size=random_count)])
    elapsed[rng.random(len(elapsed)) < 1 / 3] = limit - 1
    actions = case.random_actions(rng, len(starts))
    rec = {k: [] for k in ("obs", "reward", "terminated", "truncated", "next_state")}
    for state, steps, action in zip(starts, elapsed, actions):
        put_state(env, state, steps)
        obs, reward, term, trunc, _ = env.step(action)
        for key, value in zip(rec, (obs, reward, term, trunc, np.array(env.unwrapped.state, dtype=np.float64))):
            rec[key].append(value)
    env.close()
    out = {k: np.stack(v) if k in ("obs", "next_state") else np.array(v) for k, v in rec.items()}
    return {"state": starts, "elapsed": elapsed, "action": actions, **out}


def batched_step(case: Case, ref: dict, dtype: torch.dtype, device: str):
    env = case.cls(num_envs=len(ref["state"]), device=device, dtype=dtype)
    env.reset(seed=0)
    env.state.copy_(torch.as_tensor(ref["state"].T, dtype=dtype))
    env.elapsed.copy_(torch.as_tensor(ref["elapsed"], dtype=torch.int32))
    action = torch.as_tensor(ref["action"], device=device)
    _, reward, term, trunc, info = env.step(action)
    return {"obs": info["final_obs"].cpu().numpy(), "reward": reward.cpu().numpy(),
            "terminated": term.cpu().numpy(), "truncated": trunc.cpu().numpy()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(CASES))
def test_transitions_match_gymnasium(name, dtype, device):
    case = CASES[name]
    ref = reference_transitions(case, np.random.default_rng(1), episodes_steps=1500, random_count=1500)
    got = batched_step(case, ref, dtype, device)
    np.testing.assert_array_equal(got["truncated"], ref["truncated"])
    assert ref["truncated"].any() and not ref["terminated"].all()
    assert ref["terminated"].any() or name == "Pendulum-v1"  # the only one without a terminal state
    if dtype == torch.float64:
        np.testing.assert_allclose(got["obs"], ref["obs"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["reward"], ref["reward"], rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(got["terminated"], ref["terminated"])
        return
    tol = case.f32_tol
    np.testing.assert_allclose(got["obs"], ref["obs"], rtol=tol, atol=tol)
    np.testing.assert_allclose(got["reward"], ref["reward"], rtol=tol, atol=tol)
    differ = got["terminated"] != ref["terminated"]
    assert np.all(case.boundary_distance(ref["next_state"][differ]) < tol), "a flag differs away from the boundary"
    assert differ.mean() < 1e-3


@pytest.mark.parametrize("name", list(CASES))
def test_episodes_in_lockstep_with_gymnasium(name):
    """N reference envs follow the batched env's states, resets included, for whole episodes:
    step counters, time-limit truncation, episode returns and lengths all agree."""
    case, n, steps, limit = CASES[name], 6, 200, 60
    rng = np.random.default_rng(2)
    env = case.cls(num_envs=n, dtype=torch.float64, max_episode_steps=limit)
    obs, _ = env.reset(seed=3)
    refs = [gym.make(case.gym_id, max_episode_steps=limit) for _ in range(n)]
    for r in refs:
        r.reset(seed=0)
    ref_return, ref_length, finished = np.zeros(n), np.zeros(n, dtype=int), 0
    for _ in range(steps):
        for i, r in enumerate(refs):  # follow the batched state (chaotic systems would drift apart)
            put_state(r, env.state[:, i].numpy())
        actions = case.random_actions(rng, n)
        obs, reward, term, trunc, info = env.step(torch.as_tensor(actions))
        for i, r in enumerate(refs):
            r_obs, r_rew, r_term, r_trunc, _ = r.step(actions[i])
            ref_return[i] += r_rew
            ref_length[i] += 1
            np.testing.assert_allclose(info["final_obs"][i].numpy(), r_obs, rtol=1e-6, atol=1e-6)
            assert (bool(term[i]), bool(trunc[i])) == (r_term, r_trunc)
            if r_term or r_trunc:
                assert bool(info["_episode"][i]) and int(info["episode"]["l"][i]) == ref_length[i]
                assert float(info["episode"]["r"][i]) == pytest.approx(ref_return[i], rel=1e-5)
                r.reset(seed=0)
                ref_return[i], ref_length[i] = 0.0, 0
                finished += 1
    assert finished >= 2 * n
    assert env.episode_count.sum().item() == finished


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_same_step_autoreset(name, device):
    case, n, limit = CASES[name], 64, 7
    env = case.cls(num_envs=n, device=device, max_episode_steps=limit)
    obs, _ = env.reset(seed=5)
    assert obs.shape == (n, env.single_observation_space.shape[0]) and obs.dtype == torch.float32
    low, high = (torch.as_tensor(b, device=device) for b in case.reset_bounds)
    rng = np.random.default_rng(0)
    length = torch.zeros(n, dtype=torch.int32, device=device)
    for t in range(3 * limit):
        obs, reward, term, trunc, info = env.step(torch.as_tensor(case.random_actions(rng, n), device=device))
        length += 1
        done = term | trunc
        assert torch.equal(info["_final_obs"], done) and torch.equal(info["_episode"], done)
        assert torch.equal(trunc, length >= limit)
        assert torch.equal(info["episode"]["l"][done], length[done])
        # instances that ended restart in the same call: fresh state within the reset bounds
        fresh = env.state[:, done].T.to(low.dtype)
        assert torch.all((fresh >= low) & (fresh <= high))
        assert torch.equal(env.elapsed[done], torch.zeros_like(env.elapsed[done]))
        assert torch.equal(obs[~done], info["final_obs"][~done])
        length[done] = 0
    assert env.episode_count.sum().item() >= n * 2


@pytest.mark.parametrize("name", list(CASES))
def test_reset_seed_reproducible(name):
    case = CASES[name]
    a, b = case.cls(num_envs=32), case.cls(num_envs=32)
    oa, _ = a.reset(seed=7)
    ob, _ = b.reset(seed=7)
    assert torch.equal(oa, ob)
    oc, _ = b.reset(seed=8)
    assert not torch.equal(oa, oc)
    assert a.observation_space.shape == (32, *a.single_observation_space.shape)
    assert a.single_observation_space.contains(oa[0].numpy())


def test_desync_episodes_staggers_the_time_limit():
    env = CartPole(num_envs=256, max_episode_steps=50, desync_episodes=True)
    env.reset(seed=1)
    assert len(torch.unique(env.elapsed)) > 25 and int(env.elapsed.max()) < 50
    first_end = torch.full((256,), -1)
    for t in range(50):
        _, _, term, trunc, info = env.step(torch.zeros(256, dtype=torch.int64))
        ended = (term | trunc) & (first_end < 0)
        first_end[ended] = t
        assert torch.isnan(info["episode"]["r"][ended]).all()  # the shortened first episodes
    assert len(torch.unique(first_end)) > 10
    _, _, term, trunc, info = env.step(torch.zeros(256, dtype=torch.int64))
    assert not torch.isnan(info["episode"]["r"]).any()
