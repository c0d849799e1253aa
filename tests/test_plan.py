"""The Plan: each fact from its owner, no test of another component's name in the role loops."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from hpcrl.algos.schedules import LinearAnneal
from hpcrl.config import build_config, load_config
from hpcrl.runtime.plan import make_plan
from hpcrl.staleness import POLICIES, POLICY_PACING

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "hpcrl" / "configs"


def test_every_admission_policy_declares_its_pacing():
    assert set(POLICY_PACING) == set(POLICIES)
    paces = {name: make_plan(build_config({"aggregation": {"policy": name}})).pacing for name in POLICIES}
    assert paces == {"stellaris": "free", "stellaris_code": "free", "pure_async": "free", "sync": "lockstep",
                     "ssp": "held", "softsync": "free"}


def test_sizes_follow_the_algorithms_round_regime():
    ppo = make_plan(build_config({"env": {"num_envs": 4}, "actors": {"count": 3, "fragment_length": 16},
                                  "learners": {"groups": 2}, "algo": {"train_batch_size": 512, "minibatch_size": 64}}))
    assert (ppo.fragment_steps, ppo.round_steps, ppo.group_batch_size, ppo.routing) == (64, 512, 256, "own_group")
    assert ppo.round_steps_for(1) == 171 and ppo.group_batch_size_for(1) == 86  # actor scaling: a third, rounded up
    impact = make_plan(build_config({"env": {"num_envs": 4}, "actors": {"count": 3, "fragment_length": 16},
                                     "algo": {"name": "impact"}}))
    assert (impact.round_steps, impact.group_batch_size) == (3 * 64, 64)  # one fragment of every actor
    marl = make_plan(build_config({"env": {"id": "hpcrl/MPESimpleSpread-v3", "num_envs": 8},
                                   "actors": {"fragment_length": 25}, "learners": {"groups": 3},
                                   "algo": {"name": "ippo", "agents": 6, "policy_learners": True}}))
    assert marl.fragment_steps == 25 * 8 * 6 and marl.routing == "every_group" and marl.group_batch_size == 4800


def test_lr_schedule_and_reward_discount_come_from_the_algorithm():
    hopper = make_plan(load_config(CONFIGS / "hopper.yaml"))
    assert hopper.lr_schedule == LinearAnneal(3e-4, 1_000_000) and hopper.reward_gamma == 0.99
    assert hopper.lr_schedule.at(0) == 3e-4 and hopper.lr_schedule.at(500_000) == pytest.approx(1.5e-4)
    assert hopper.lr_schedule.at(2_000_000) == 0.0
    default = make_plan(load_config(CONFIGS / "cartpole.yaml"))
    assert default.lr_schedule is None and default.reward_gamma == 0.98


def test_role_loops_read_no_other_components_config_by_name():
    found = subprocess.run(["git", "grep", "-nE", r"aggregation\.policy ==|getattr\((self\.)?(cfg\.)?algo",
                            "hpcrl/runtime"], cwd=ROOT, capture_output=True, text=True)
    if found.returncode not in (0, 1):
        pytest.skip(f"git grep unavailable: {found.stderr.strip()}")
    assert found.stdout == "", found.stdout


def test_an_aggregation_field_the_policy_does_not_read_is_refused_in_one_line():
    from hpcrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"aggregation.d=0.5 does nothing under aggregation.policy=sync; it is read by "
                                          r"stellaris, stellaris_code") as e:
        build_config({"aggregation": {"policy": "sync", "d": 0.5}})
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="aggregation.ssp_s=1 does nothing under aggregation.policy=stellaris"):
        build_config({"aggregation": {"ssp_s": 1}})
    assert build_config({"aggregation": {"policy": "ssp", "ssp_s": 1}}).aggregation.ssp_s == 1
    resolved = build_config({"aggregation": {"policy": "sync"}})  # a resolved config.yaml holds every default
    assert build_config(yaml.safe_load(resolved.to_yaml())).aggregation.policy == "sync"


def test_the_lr_anneal_horizon_is_fixed_when_the_run_is_made():
    cfg = load_config(CONFIGS / "hopper.yaml", ["stop.total_env_steps=5000"])
    assert cfg.algo.lr_anneal_steps == 5000  # written into the run's config.yaml
    resumed = build_config(yaml.safe_load(cfg.to_yaml()), ["stop.total_env_steps=9000"])  # a resume with a new budget
    assert resumed.algo.lr_anneal_steps == 5000 and make_plan(resumed).lr_schedule.horizon == 5000


def test_the_round_length_is_its_own_field_and_a_resume_with_more_actors_keeps_it():
    cfg = build_config({"env": {"num_envs": 4}, "actors": {"count": 3, "fragment_length": 16}, "algo": {"name": "impact"}})
    assert cfg.algo.round_fragments == 3  # one fragment of every actor, written into the run's config.yaml
    resumed = build_config(yaml.safe_load(cfg.to_yaml()), ["actors.count=5"])
    assert resumed.algo.round_fragments == 3 and make_plan(resumed).round_steps == 3 * 64
    half = make_plan(build_config({"env": {"id": "hpcrl/MPESimpleSpread-v3", "num_envs": 4},
                                   "actors": {"count": 4, "fragment_length": 16},
                                   "algo": {"name": "iql", "agents": 3, "round_fragments": 2}}))
    assert half.round_steps == 2 * 16 * 4 * 3 and half.round_steps_for(2) == 16 * 4 * 3
    with pytest.raises(Exception, match="round_fragments"):  # PPO's round is algo.train_batch_size
        build_config({"algo": {"round_fragments": 2}})


def test_the_plan_says_which_runner_runs_the_job_and_a_config_that_leaves_the_fused_loop_says_why():
    fused = make_plan(load_config(CONFIGS / "cartpole_ha2c.yaml"))
    assert fused.runner == "fused"
    assert fused.runner_reason == "ha2c on 10000 x hpcrl/CartPole-v1 in this process (launch.runner=serial, fused loop)"
    evaluating = make_plan(load_config(CONFIGS / "cartpole_ha2c.yaml", ["eval.episodes=5"]))
    assert evaluating.runner == "serial" and evaluating.runner_reason.startswith("3 roles in this process (launch.runner="
                                                                               "serial); ha2c runs on the roles, not the "
                                                                               "fused loop: eval.episodes=5: the fused "
                                                                               "loop has no actor")
    on_mpi = make_plan(load_config(CONFIGS / "cartpole_ha2c.yaml", ["launch.runner=mpi"]))
    assert on_mpi.runner == "mpi" and on_mpi.runner_reason.endswith("not the fused loop: launch.runner=mpi")
    two_ranks = make_plan(load_config(CONFIGS / "cartpole_ha2c.yaml", ["learners.ranks_per_group=2"]))
    assert two_ranks.runner == "serial" and two_ranks.runner_reason.endswith("learners.ranks_per_group=2")
    default = make_plan(load_config(CONFIGS / "cartpole.yaml"))
    assert (default.runner, default.runner_reason) == ("mpi", "4 ranks (launch.runner=mpi)")
    assert all("\n" not in p.runner_reason for p in (fused, evaluating, on_mpi, default))
