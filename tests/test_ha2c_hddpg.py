"""HA2C and HDDPG (seed 003, Algorithms 1 and 2) on the batched envs, and their single-process runner.

Short runs: losses finite, parameters and target networks move as the algorithms say, the
FIFO buffer keeps the newest rollouts, HA2C shows a learning signal within a few seconds,
and the runner records episodes to run.h5. Parametrised over the devices torch sees.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcrl.algos.ha2c import HA2C
from hpcrl.algos.hddpg import HDDPG
from hpcrl.algos.rollout import EpisodeLog
from hpcrl.batched.runner import make_env, run_batched
from hpcrl.config import build_config
from hpcrl.errors import ConfigError
from hpcrl.io import read_table

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Small tensors: a second intra-op thread only waits for a busy core on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def setup(env_id: str, algo: dict, num_envs: int, device: str, model: dict | None = None, seed: int = 0):
    cfg = build_config({"env": {"id": env_id, "num_envs": num_envs, "seed": seed}, "algo": algo,
                        "model": model or {}})
    torch.manual_seed(seed)
    env = make_env(cfg, torch.device(device))
    cls = {"ha2c": HA2C, "hddpg": HDDPG}[algo["name"]]
    learner = cls(cfg.algo, cfg.model, env.single_observation_space, env.single_action_space, num_envs,
                  torch.device(device))
    episodes = EpisodeLog(cfg.algo.rollout_length * cfg.algo.stats_every, num_envs, torch.device(device))
    obs, _ = env.reset(seed=seed)
    return env, learner, episodes, obs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("env_id", ["hpcrl/CartPole-v1", "hpcrl/Acrobot-v1", "hpcrl/Pendulum-v1"])
def test_ha2c_update_is_finite_and_moves_parameters(env_id, device):
    env, algo, episodes, obs = setup(env_id, {"name": "ha2c", "rollout_length": 4}, 32, device)
    before = algo.net.flat.params.clone()
    for _ in range(3):
        obs, stats = algo.iteration(env, obs, episodes)
    assert stats.device.type == torch.device(device).type and stats.shape == (5,)
    assert torch.isfinite(stats).all()
    assert not torch.equal(before, algo.net.flat.params)
    assert algo.rollout.obs.shape == (4, 32, *env.single_observation_space.shape)


@pytest.mark.parametrize("device", DEVICES)
def test_hddpg_targets_follow_by_soft_updates(device):
    env, algo, episodes, obs = setup("hpcrl/Pendulum-v1", {"name": "hddpg", "rollout_length": 4, "tau": 0.25}, 32,
                                     device)
    assert torch.equal(algo.target_actor.flat.params, algo.actor.flat.params)
    assert torch.equal(algo.target_critic.flat.params, algo.critic.flat.params)
    for _ in range(2):
        old_target = algo.target_critic.flat.params.clone()
        obs, stats = algo.iteration(env, obs, episodes)
        assert torch.isfinite(stats).all()
        expected = old_target + 0.25 * (algo.critic.flat.params - old_target)  # theta' <- tau theta + (1 - tau) theta'
        torch.testing.assert_close(algo.target_critic.flat.params, expected)
        assert not torch.equal(algo.target_critic.flat.params, algo.critic.flat.params)


def test_hddpg_fifo_buffer_holds_the_newest_rollouts():
    env, algo, episodes, obs = setup("hpcrl/Pendulum-v1", {"name": "hddpg", "rollout_length": 3,
                                                           "buffer_rollouts": 2}, 8, "cpu")
    seen = []
    act = algo.policy
    algo.policy = lambda o: (seen.append(o.clone()), act(o))[1]
    for i in range(3):
        obs, _ = algo.iteration(env, obs, episodes)
        assert algo.filled == min(3 * (i + 1), 6)
    torch.testing.assert_close(algo.buffer.obs, torch.stack(seen[-6:]))
    # next_obs of a step is the obs of the next one (no episode ends within these 9 steps)
    torch.testing.assert_close(algo.buffer.next_obs[:-1], algo.buffer.obs[1:])


def test_hddpg_rejects_discrete_actions():
    with pytest.raises(ConfigError, match="hddpg needs"):
        setup("hpcrl/CartPole-v1", {"name": "hddpg"}, 4, "cpu")


def test_ha2c_learns_cartpole_on_a_small_budget():
    """128 instances, 60 updates (61K steps): mean episode return at least doubles (random: ~22)."""
    env, algo, episodes, obs = setup("hpcrl/CartPole-v1", {"name": "ha2c", "lr": 3e-3, "max_grad_norm": 10.0,
                                                           "stats_every": 10}, 128, "cpu", seed=1)
    means = []
    for _ in range(6):
        for _ in range(10):
            obs, _ = algo.iteration(env, obs, episodes)
        means.append(float(np.mean(episodes.fetch()["return"])))
    assert means[0] < 30
    assert max(means[-2:]) > 2 * means[0], means


def test_hddpg_critic_fits_its_targets():
    """On a fixed rollout, repeated critic steps drive the n-step TD error down."""
    env, algo, episodes, obs = setup("hpcrl/Pendulum-v1", {"name": "hddpg", "critic_lr": 3e-3}, 64, "cpu")
    obs, first = algo.iteration(env, obs, episodes)
    losses = [float(algo.update(algo.buffer.last(algo.filled))[0]) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0], losses[::10]


def test_runner_records_episodes_and_stops(tmp_path):
    cfg = build_config({"name": "t", "env": {"id": "hpcrl/CartPole-v1", "num_envs": 64},
                        "algo": {"name": "ha2c", "stats_every": 5},
                        "stop": {"total_env_steps": 64 * 8 * 12}})
    summary = run_batched(cfg, tmp_path / "run")
    assert summary["env_steps"] == 64 * 8 * 12 and summary["stop_reason"].startswith("stop.total_env_steps")
    episodes = read_table(tmp_path / "run" / "run.h5", "episodes")
    assert len(episodes["return"]) == summary["episodes"] > 0
    assert np.all(episodes["return"] == episodes["length"])  # CartPole: reward 1 per step
    assert np.all((episodes["env_index"] >= 0) & (episodes["env_index"] < 64))
    assert np.all(np.diff(episodes["env_steps"]) >= 0) and episodes["env_steps"].max() <= summary["env_steps"]
    updates = read_table(tmp_path / "run" / "run.h5", "updates")
    assert list(updates["version"]) == list(range(1, 13)) and np.isfinite(updates["loss_mean"]).all()
    assert len(read_table(tmp_path / "run" / "run.h5", "rounds")["round"]) == 3


def test_runner_stops_at_target_return(tmp_path):
    cfg = build_config({"name": "t", "env": {"id": "hpcrl/Pendulum-v1", "num_envs": 16},
                        "algo": {"name": "hddpg", "stats_every": 25},
                        "stop": {"total_env_steps": 10**6, "target_return": -1e9, "return_window": 16}})
    summary = run_batched(cfg, tmp_path / "run")
    assert summary["stop_reason"].startswith("stop.target_return")
    assert summary["env_steps"] == 16 * 8 * 25  # the first window ends all 16 episodes (200 steps)


def test_runner_rejects_non_batched_env(tmp_path):
    cfg = build_config({"env": {"id": "CartPole-v1"}, "algo": {"name": "ha2c"}})
    with pytest.raises(ConfigError, match="hpcrl/CartPole-v1"):
        run_batched(cfg, tmp_path / "run")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("algo", [{"name": "ha2c"}, {"name": "hddpg"}])
def test_no_host_synchronisation_inside_an_iteration(algo):
    env_id = "hpcrl/CartPole-v1" if algo["name"] == "ha2c" else "hpcrl/Pendulum-v1"
    env, learner, episodes, obs = setup(env_id, algo, 1024, "cuda")
    obs, _ = learner.iteration(env, obs, episodes)  # warm-up (lazy CUDA init syncs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            obs, _ = learner.iteration(env, obs, episodes)
    finally:
        torch.cuda.set_sync_debug_mode("default")
