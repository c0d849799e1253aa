"""The shipped Stellaris workloads (hpcrl/configs/stellaris): every config loads with Table II/III
settings, IMPACT runs on each under stellaris admission for a tiny budget (serial runner), and
Atari observations stay uint8 in fragments and trajectory files."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcrl.config import load_config
from hpcrl.runtime.runners.job import fragment_layout_for, role_parts
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.roles.sampler import VectorSampler, describe_env
from hpcrl.runtime.runners import serial

CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / "stellaris"
WORKLOADS = ("hopper", "humanoid", "walker2d", "spaceinvaders", "qbert", "gravitar")
ATARI = ("spaceinvaders", "qbert", "gravitar")
HAVE_ALE = importlib.util.find_spec("ale_py") is not None and importlib.util.find_spec("cv2") is not None
TINY = ["actors.count=1", "env.num_envs=1", "actors.fragment_length=8", "learners.groups=1", "learners.min_active=1",
        "stop.total_env_steps=24", "algo.minibatch_size=8", "algo.num_sgd_iter=1",
        "eval.episodes=0"]  # an Atari episode under a random policy is thousands of steps
TWO_GROUPS = ["learners.groups=2", "learners.min_active=2"]  # the IS window (Eq. 2): MuJoCo runs only (CNNs are slow)


def needs_ale(workload: str):
    if workload in ATARI and not HAVE_ALE:
        print(f"skipping {workload}: ale-py / opencv not installed (pip install ale-py opencv-python-headless)")
        pytest.skip("ale-py / opencv not installed")


def test_twelve_configs_with_table_ii_and_iii_settings():
    names = sorted(p.name for p in CONFIGS.glob("*.yaml"))
    assert names == sorted(f"{w}_{a}.yaml" for w in WORKLOADS for a in ("ppo", "impact"))
    for w in WORKLOADS:
        ppo, impact = load_config(CONFIGS / f"{w}_ppo.yaml"), load_config(CONFIGS / f"{w}_impact.yaml")
        assert (ppo.algo.lr, ppo.algo.clip, ppo.algo.kl_coeff, ppo.algo.entropy_coeff, ppo.algo.vf_coeff) == (
            5e-5, 0.3, 0.2, 0.0, 1.0)
        assert (impact.algo.lr, impact.algo.clip, impact.algo.kl_coeff, impact.algo.entropy_coeff,
                impact.algo.target_update_frequency) == (5e-4, 0.4, 1.0, 0.01, 1)
        batch = 256 if w in ATARI else 4096  # Table III: one round's steps, both algorithms
        assert make_plan(ppo).round_steps == make_plan(impact).round_steps == batch
        for cfg in (ppo, impact):
            assert (cfg.aggregation.d, cfg.aggregation.v, cfg.aggregation.rho) == (0.96, 3.0, 1.0)
            assert (cfg.eval.episodes, cfg.eval.every_rounds) == (10, 1)  # the artifact's per-round evaluation
            assert cfg.stop.total_env_steps == 50 * batch  # 50 rounds
            if w in ATARI:
                assert cfg.model.torso == "cnn" and cfg.env.id.endswith("-v5")
            else:
                assert cfg.model.hidden_sizes == [256, 256] and cfg.model.activation == "tanh"


@pytest.mark.parametrize("workload", WORKLOADS)
def test_impact_with_stellaris_admission_runs_on_each_workload(workload, tmp_path):
    needs_ale(workload)
    run = tmp_path / "run"
    extra = [] if workload in ATARI else TWO_GROUPS
    cfg = load_config(CONFIGS / f"{workload}_impact.yaml", [*TINY, *extra, f"io.run_dir={run}", "launch.runner=serial"])
    assert cfg.algo.name == "impact" and cfg.aggregation.policy == "stellaris"
    assert serial.run(make_plan(cfg), run, progress="plain").stop_reason.startswith("stop.")
    with h5py.File(run / "run.h5", "r", locking=False) as f:
        admitted = f["gradients/admitted"][:]
        assert admitted.sum() > 0 and np.isfinite(f["gradients/loss"][:][admitted == 1]).all()
    with h5py.File(run / "traj" / "actor-00000.h5", "r", locking=False) as f:
        obs = f["obs"]
        assert obs.shape[0] >= 24
        assert obs.dtype == (np.uint8 if workload in ATARI else np.float32)


def test_atari_stays_uint8_from_the_sampler_to_ppo(tmp_path):
    needs_ale("qbert")
    cfg = load_config(CONFIGS / "qbert_ppo.yaml", [*TINY, "algo.train_batch_size=16"])
    env = describe_env(cfg.env)
    assert env.obs_dtype == np.uint8 and env.observation_space.shape == (4, 84, 84)
    plan = make_plan(cfg)
    algo, model, traj = role_parts(plan, env, torch.device("cpu"))
    layout = fragment_layout_for(plan, env, model)
    assert layout.fields["obs"][1] == np.uint8 and layout.fields["last_obs"][1] == np.uint8
    assert traj.obs_dtype == "u1"
    # T = 8 steps of one env: 9 frame stacks of 4 x 84 x 84 bytes (obs and last_obs) and the small fields
    assert 9 * 4 * 84 * 84 < layout.nbytes < 9 * 4 * 84 * 84 + 8 * 64
    sampler = VectorSampler(cfg.env, 0)
    try:
        frag, _ = sampler.sample(algo, model, cfg.actors.fragment_length, 0, 0)
    finally:
        sampler.close()
    assert frag["obs"].dtype == np.uint8 and frag["last_obs"].dtype == np.uint8
    frag["fragment"] = 0  # the actor numbers its fragments when it sends them
    packed = layout.unpack(layout.pack(frag))
    np.testing.assert_array_equal(packed["obs"], frag["obs"])
    batch = algo.prepare([packed], model)
    assert batch["obs"].dtype == torch.uint8  # scaled inside the network, not before
    _, stats = algo.compute_gradient(batch, model)
    assert np.isfinite(stats["loss"]) and stats["grad_norm"] > 0
