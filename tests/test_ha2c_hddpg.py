"""HA2C and HDDPG (seed 003, Algorithms 1 and 2) on the batched envs: the fused loop and the roles.

Short runs: losses finite, parameters and target networks move as the algorithms say, the
FIFO buffer keeps the newest fragments, HA2C shows a learning signal within a few seconds,
the fused loop records episodes to run.h5, and both algorithms also train on the runtime's
roles (serial runner). Parametrised over the devices torch sees.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcrl.algos.rollout import EpisodeLog
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import fused
from hpcrl.runtime.runners.fused import FusedLoop, make_env
from hpcrl.config import build_config
from hpcrl.errors import ConfigError
from hpcrl.io import read_table

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def setup(env_id: str, algo: dict, num_envs: int, device: str, model: dict | None = None, seed: int = 0,
          fragment_length: int = 8):
    cfg = build_config({"env": {"id": env_id, "num_envs": num_envs, "seed": seed}, "algo": algo,
                        "model": model or {}, "actors": {"count": 1, "fragment_length": fragment_length},
                        "launch": {"runner": "serial"}})
    torch.manual_seed(seed)
    env = make_env(cfg, torch.device(device))
    loop = FusedLoop(cfg, env, torch.device(device))
    episodes = EpisodeLog(fragment_length * cfg.algo.stats_every, num_envs, torch.device(device))
    obs, _ = env.reset(seed=seed)
    return env, loop, episodes, obs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("env_id", ["hpcrl/CartPole-v1", "hpcrl/Acrobot-v1", "hpcrl/Pendulum-v1"])
def test_ha2c_update_is_finite_and_moves_parameters(env_id, device):
    env, loop, episodes, obs = setup(env_id, {"name": "ha2c"}, 32, device, fragment_length=4)
    before = loop.model.flat.params.clone()
    for _ in range(3):
        obs, stats = loop.iteration(obs, episodes)
    assert stats.device.type == torch.device(device).type and stats.shape == (5,)
    assert torch.isfinite(stats).all()
    assert not torch.equal(before, loop.model.flat.params)
    assert loop.buffer.obs.shape == (4, 32, *env.single_observation_space.shape)


@pytest.mark.parametrize("device", DEVICES)
def test_hddpg_targets_follow_by_soft_updates(device):
    env, loop, episodes, obs = setup("hpcrl/Pendulum-v1", {"name": "hddpg", "tau": 0.25}, 32, device,
                                     fragment_length=4)
    m = loop.model
    flat = lambda net: torch.cat([p.reshape(-1) for p in net.parameters()])  # noqa: E731
    assert torch.equal(flat(m.target_actor), flat(m.actor))
    assert torch.equal(flat(m.target_critic), flat(m.critic))
    for _ in range(2):
        old_target = flat(m.target_critic).clone()
        obs, stats = loop.iteration(obs, episodes)
        assert torch.isfinite(stats).all()
        expected = old_target + 0.25 * (flat(m.critic) - old_target)  # theta' <- tau theta + (1 - tau) theta'
        torch.testing.assert_close(flat(m.target_critic), expected)
        assert not torch.equal(flat(m.target_critic), flat(m.critic))


def test_hddpg_fifo_buffer_holds_the_newest_rollouts():
    env, loop, episodes, obs = setup("hpcrl/Pendulum-v1", {"name": "hddpg", "buffer_rollouts": 2}, 8, "cpu",
                                     fragment_length=3)
    seen = []
    act = loop.act
    loop.act = lambda o: (seen.append(o.clone()), act(o))[1]
    for i in range(3):
        obs, _ = loop.iteration(obs, episodes)
        assert loop.filled == min(3 * (i + 1), 6)
    torch.testing.assert_close(loop.buffer.obs, torch.stack(seen[-6:]))
    # next_obs of a step is the obs of the next one (no episode ends within these 9 steps)
    torch.testing.assert_close(loop.buffer.next_obs[:-1], loop.buffer.obs[1:])


def test_hddpg_fused_step_is_algorithm_2_order():
    """Critic step, then the actor's gradient through the *updated* critic, each with its own Adam
    moments (the other network's untouched), then the soft target update: checked against copies
    trained by hand with two Adams; the same-weights order (both gradients before either step)
    gives other actor weights."""
    import copy

    env, loop, episodes, obs = setup("hpcrl/Pendulum-v1", {"name": "hddpg", "tau": 0.1}, 16, "cpu", fragment_length=4)
    obs, _ = loop.iteration(obs, episodes)
    batch = loop.algo.prepare_rollout(loop.buffer.last(loop.filled), loop.model)
    cfg = loop.algo.cfg

    def by_hand(critic_first: bool):
        m = copy.deepcopy(loop.model)
        adams = {}
        for name, lr in (("critic", cfg.critic_lr), ("actor", cfg.actor_lr)):
            net = getattr(m, name)
            adam = torch.optim.Adam(net.parameters(), lr=lr)
            state = {i: copy.deepcopy(loop.optimizer.state[p]) for i, p in enumerate(getattr(loop.model, name).parameters())}
            adam.load_state_dict({"state": state, "param_groups": adam.state_dict()["param_groups"]})
            adam.zero_grad()
            adams[name] = adam
        (batch["targets"] - m.critic(batch["obs"], batch["actions"])).square().mean().backward()
        if critic_first:
            adams["critic"].step()
        (-m.critic(batch["obs"], m.actor(batch["obs"])).mean()).backward(inputs=list(m.actor.parameters()))
        adams["actor"].step()
        if not critic_first:
            adams["critic"].step()
        with torch.no_grad():
            for target, online in zip([*m.target_actor.parameters(), *m.target_critic.parameters()],
                                      [*m.actor.parameters(), *m.critic.parameters()]):
                target.lerp_(online, 0.1)
        return m

    algorithm_2, same_weights = by_hand(True), by_hand(False)
    loop.algo.update(batch, loop.model, loop.optimizer)
    for mine, hand in zip(loop.model.parameters(), algorithm_2.parameters()):
        torch.testing.assert_close(mine, hand, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(loop.model.actor.net[0].weight, same_weights.actor.net[0].weight, rtol=1e-5, atol=1e-6)


def test_hddpg_rejects_discrete_actions():
    with pytest.raises(ConfigError, match="hddpg needs"):
        setup("hpcrl/CartPole-v1", {"name": "hddpg"}, 4, "cpu")


def test_ha2c_learns_cartpole_on_a_small_budget():
    """128 instances, 60 updates (61K steps): mean episode return at least doubles (random: ~22)."""
    env, loop, episodes, obs = setup("hpcrl/CartPole-v1", {"name": "ha2c", "lr": 3e-3, "max_grad_norm": 10.0,
                                                           "stats_every": 10}, 128, "cpu", seed=1)
    means = []
    for _ in range(6):
        for _ in range(10):
            obs, _ = loop.iteration(obs, episodes)
        means.append(float(np.mean(episodes.fetch()["return"])))
    assert means[0] < 30
    assert max(means[-2:]) > 2 * means[0], means


def test_hddpg_critic_fits_its_targets():
    """On a fixed rollout, repeated critic steps drive the n-step TD error down."""
    env, loop, episodes, obs = setup("hpcrl/Pendulum-v1", {"name": "hddpg", "critic_lr": 3e-3}, 64, "cpu")
    obs, first = loop.iteration(obs, episodes)
    batch = loop.algo.prepare_rollout(loop.buffer.last(loop.filled), loop.model)
    losses = []
    for _ in range(40):
        grad, stats = loop.algo.compute_gradient(batch, loop.model)
        loop.algo.apply(loop.model, loop.optimizer, grad)
        losses.append(float(stats["critic_loss"]))
    assert losses[-1] < 0.5 * losses[0], losses[::10]


def test_runner_records_episodes_and_stops(tmp_path):
    cfg = build_config({"name": "t", "env": {"id": "hpcrl/CartPole-v1", "num_envs": 64},
                        "algo": {"name": "ha2c", "stats_every": 5}, "actors": {"count": 1, "fragment_length": 8},
                        "launch": {"runner": "serial"}, "stop": {"total_env_steps": 64 * 8 * 12}})
    summary = fused.run(make_plan(cfg), tmp_path / "run").summary
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
                        "algo": {"name": "hddpg", "stats_every": 25}, "actors": {"count": 1, "fragment_length": 8},
                        "launch": {"runner": "serial"},
                        "stop": {"total_env_steps": 10**6, "target_return": -1e9, "return_window": 16}})
    summary = fused.run(make_plan(cfg), tmp_path / "run").summary
    assert summary["stop_reason"].startswith("stop.target_return")
    assert summary["env_steps"] == 16 * 8 * 25  # the first window ends all 16 episodes (200 steps)


def test_runner_rejects_non_batched_env(tmp_path):
    cfg = build_config({"env": {"id": "CartPole-v1"}, "algo": {"name": "ha2c"}})
    with pytest.raises(ConfigError, match="hpcrl/CartPole-v1"):
        fused.run(make_plan(cfg), tmp_path / "run")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("algo", [{"name": "ha2c"}, {"name": "hddpg"}])
def test_no_host_synchronisation_inside_an_iteration(algo):
    env_id = "hpcrl/CartPole-v1" if algo["name"] == "ha2c" else "hpcrl/Pendulum-v1"
    env, loop, episodes, obs = setup(env_id, algo, 1024, "cuda")
    obs, _ = loop.iteration(obs, episodes)  # warm-up (lazy CUDA init syncs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            obs, _ = loop.iteration(obs, episodes)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("env_id, algo", [("CartPole-v1", {"name": "ha2c", "lr": 3e-3}),
                                          ("Pendulum-v1", {"name": "hddpg"})])
def test_ha2c_and_hddpg_train_on_the_roles_too(tmp_path, env_id, algo):
    """The same algorithm objects on the runtime's roles (serial runner, two actors, gym envs)."""
    from hpcrl.runtime.record.checkpoint import load_checkpoint
    from hpcrl.runtime.runners import serial

    cfg = build_config({"name": "t", "env": {"id": env_id, "num_envs": 4}, "algo": algo,
                        "actors": {"count": 2, "fragment_length": 16}, "launch": {"runner": "serial"},
                        "stop": {"total_env_steps": 2000}, "io": {"run_dir": str(tmp_path / "run")}})
    assert serial.run(make_plan(cfg), tmp_path / "run").stop_reason.startswith("stop.total_env_steps")
    h5 = tmp_path / "run" / "run.h5"
    grads, updates = read_table(h5, "gradients"), read_table(h5, "updates")
    assert len(updates["version"]) >= 2000 // (16 * 4) - 4  # one gradient per fragment, a few in flight at the end
    assert np.all(grads["samples"][grads["admitted"] == 1] == 16 * 4)
    assert np.isfinite(updates["loss_mean"]).all()
    assert len(read_table(h5, "episodes")["return"]) > 0
    assert load_checkpoint(tmp_path / "run")["version"] == updates["version"][-1]
