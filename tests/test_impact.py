"""IMPACT (Luo et al. 2020) on a hand-worked batch, its target network, and a short serial CartPole run."""
import math

import h5py
import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.algos import make_algorithm
from hpcrl.config import AggregationConfig, IMPACTConfig, ModelConfig, build_config
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import serial
OBS = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)


def hand_model(cfg):
    """Zero weights: V = 0 everywhere and a uniform target; the policy's logits are its last bias,
    set to log(0.8), log(0.2)."""
    algo = make_algorithm(cfg, ModelConfig(hidden_sizes=[4]), AggregationConfig(is_truncation=False))
    model = algo.make_model(OBS, spaces.Discrete(2))
    with torch.no_grad():
        model.flat.params.zero_()
        model.constants["kl_coeff"].fill_(cfg.kl_coeff)
        model.pi[-1][-1].bias.copy_(torch.log(torch.tensor([0.8, 0.2])))
    return algo, model


def fragment(mu):
    """T = 3 steps of one env: rewards 1, 2, 3, actions 0, 1, 0, behaviour probabilities mu, no episode end."""
    T = len(mu)
    return {"obs": np.zeros((T, 1, 2), np.float32), "actions": np.array([[0], [1], [0]]),
            "rewards": np.array([[1.0], [2.0], [3.0]], np.float32), "terminated": np.zeros((T, 1), bool),
            "truncated": np.zeros((T, 1), bool), "behaviour_logp": np.log(np.array(mu, np.float32)).reshape(T, 1),
            "values": np.zeros((T, 1), np.float32), "final_values": np.zeros((T, 1), np.float32),
            "last_value": np.zeros(1, np.float32), "last_obs": np.zeros((1, 2), np.float32)}


def test_vtrace_targets_and_clipped_surrogate_by_hand():
    cfg = IMPACTConfig(gamma=0.9, clip=0.4, kl_coeff=1.0, vf_coeff=1.0, entropy_coeff=0.01)
    algo, model = hand_model(cfg)
    # pi_target is uniform (1/2): rho = min(1, 0.5 / mu) = 1, 0.625, 1; c likewise
    batch = algo.prepare([fragment([0.25, 0.8, 0.5])], model)
    # V = 0: vs_2 = 3; vs_1 = 0.625 * 2 + 0.9 * 0.625 * 3; vs_0 = 1 + 0.9 * 1 * vs_1
    vs1 = 0.625 * 2 + 0.9 * 0.625 * 3
    vs = [1 + 0.9 * vs1, vs1, 3.0]
    np.testing.assert_allclose(batch["vs"].numpy(), vs, rtol=1e-6)
    # A_t = rho_t (r_t + gamma vs_{t+1} - V_t), vs_3 = the bootstrap V(last_obs) = 0
    adv = [1 * (1 + 0.9 * vs1), 0.625 * (2 + 0.9 * 3.0), 1 * 3.0]
    np.testing.assert_allclose(batch["advantages"].numpy(), adv, rtol=1e-6)
    np.testing.assert_allclose(batch["target_logp"].numpy(), np.log([0.5] * 3), rtol=1e-6)
    # r = pi / pi_target: 0.8 / 0.5 = 1.6 (a = 0, clipped to 1.4), 0.2 / 0.5 = 0.4 (a = 1, kept: min with 0.6)
    surrogate = [1.4 * adv[0], 0.4 * adv[1], 1.4 * adv[2]]
    kl = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    entropy = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2))
    loss = -np.mean(surrogate) + 0.5 * np.mean(np.square(vs)) + kl - 0.01 * entropy
    grad, stats = algo.compute_gradient(batch, model)
    assert stats["policy_loss"] == pytest.approx(-np.mean(surrogate), rel=1e-6)
    assert stats["value_loss"] == pytest.approx(0.5 * np.mean(np.square(vs)), rel=1e-6)
    assert stats["kl"] == pytest.approx(kl, rel=1e-5)
    assert stats["entropy"] == pytest.approx(entropy, rel=1e-5)
    assert stats["loss"] == pytest.approx(loss, rel=1e-6)
    assert stats["clip_fraction"] == 1.0  # every ratio lies outside [0.6, 1.4] (step 1 below, but unclipped by the min)
    # the target network is not trained: its slice of the flat gradient stays 0
    target = [p for p in model.target_pi.parameters()]
    assert all(torch.count_nonzero(p.grad) == 0 for p in target)
    assert grad.shape == (model.flat.num_params,)


def test_policy_gradient_comes_only_from_unclipped_samples():
    cfg = IMPACTConfig(gamma=0.9, clip=0.4, kl_coeff=0.0, vf_coeff=0.0, entropy_coeff=0.0)
    algo, model = hand_model(cfg)
    batch = algo.prepare([fragment([0.25, 0.8, 0.5])], model)
    algo.compute_gradient(batch, model)
    # only step 1 (a = 1, ratio 0.4) is unclipped: d/db -(1/3) A_1 pi(1)/0.5 = -(1/3) A_1 0.4 (e_1 - pi)
    a1 = 0.625 * (2 + 0.9 * 3.0)
    expected = -(1 / 3) * a1 * 0.4 * (np.array([0.0, 1.0]) - np.array([0.8, 0.2]))
    np.testing.assert_allclose(model.pi[-1][-1].bias.grad.numpy(), expected, rtol=1e-5)


def test_end_round_adapts_kl_and_updates_the_target_every_k_rounds():
    cfg = IMPACTConfig(target_update_frequency=2, kl_coeff=1.0, kl_target=0.01)
    algo, model = hand_model(cfg)
    online = torch.cat([p.flatten() for p in model.pi.parameters()])
    assert torch.count_nonzero(torch.cat([p.flatten() for p in model.target_pi.parameters()])) == 0
    assert algo.end_round(model, {"kl": 0.1}) == {}  # changed in the flat buffer, nothing for the runtime to act on
    assert float(model.constants["kl_coeff"]) == 1.5  # kl > 2 target: x1.5
    assert float(model.constants["rounds_since_target"]) == 1.0
    assert torch.count_nonzero(torch.cat([p.flatten() for p in model.target_pi.parameters()])) == 0
    algo.end_round(model, {"kl": 0.001})
    assert float(model.constants["kl_coeff"]) == 0.75
    torch.testing.assert_close(torch.cat([p.flatten() for p in model.target_pi.parameters()]), online)
    assert float(model.constants["rounds_since_target"]) == 0.0
    # the target and the counters travel in the flat buffer (what the weight board publishes)
    _, other = hand_model(cfg)
    other.flat.load_(model.flat.params)
    torch.testing.assert_close(other.target_dist(np.zeros((1, 2), np.float32)).probs, torch.tensor([[0.8, 0.2]]))
    assert float(other.constants["kl_coeff"]) == 0.75


def test_box_actions_have_a_gaussian_target():
    cfg = IMPACTConfig()
    algo = make_algorithm(cfg, ModelConfig(hidden_sizes=[8]), AggregationConfig())
    assert algo.uses_window  # Stellaris Eq. 2 over the other groups' policies, against the target
    model = algo.make_model(OBS, spaces.Box(-1.0, 1.0, (3,), np.float32))
    frag = fragment([0.5, 0.5, 0.5])
    frag["actions"] = np.random.default_rng(0).normal(size=(3, 1, 3)).astype(np.float32)
    batch = algo.prepare([frag], model)
    _, stats = algo.compute_gradient(batch, model, window=batch["target_logp"].unsqueeze(0) + 0.1)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)  # target == policy at the start
    assert np.isfinite(stats["loss"]) and stats["ratio_mean"] <= 1.0 + 1e-6  # R' <= rho = 1


def test_cartpole_serial_run(tmp_path):
    run = tmp_path / "run"
    cfg = build_config({"name": "impact-cartpole", "env": {"id": "CartPole-v1", "num_envs": 4},
                        "actors": {"count": 2, "fragment_length": 16},
                        "learners": {"groups": 2, "min_active": 2}, "aggregation": {"policy": "stellaris"},
                        "algo": {"name": "impact", "minibatch_size": 32, "num_sgd_iter": 2},
                        "stop": {"total_env_steps": 2000}, "launch": {"runner": "serial"},
                        "io": {"run_dir": str(run)}})
    assert serial.run(make_plan(cfg), run, progress="plain").stop_reason.startswith("stop.total_env_steps")
    with h5py.File(run / "run.h5", "r", locking=False) as f:
        rounds = f["rounds/round"][:]
        loss = f["gradients/loss"][:]
        admitted = f["gradients/admitted"][:]
        assert f["episodes/return"].shape[0] > 0
    assert len(rounds) >= 2000 // (2 * 4 * 16) - 1  # a round = one fragment of every actor
    assert admitted.sum() > 0 and np.isfinite(loss[admitted == 1]).all()
