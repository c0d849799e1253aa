"""MARL policy and critic learners (algo.policy_learners, algo.critic_learners): assignment, per-block
aggregation and optimizer steps, runs under both runners."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.algos import make_algorithm
from hpcrl.algos.base import Algorithm
from hpcrl.cli import main as cli_main
from hpcrl.config import ModelConfig, build_config
from hpcrl.errors import ConfigError
from hpcrl.io import read_table
from hpcrl.io.schema import ELASTIC_ACTIONS, ELASTIC_REASONS
from hpcrl.marl.policy_learners import (BOTH, CRITIC, POLICY, aggregate_by_block, apply_to_carried_blocks,
                                        assigned_units, groups_needed, unit_blocks)
from hpcrl.runtime.plan import make_plan
from hpcrl.staleness import GradientRecord, aggregate

CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs"
OBS = spaces.Box(-np.inf, np.inf, (3,), np.float32)


def _algo(name="ippo", agents=3, groups=2, **algo):
    cfg = build_config({"env": {"id": "hpcrl/MPESimpleSpread-v3", "kwargs": {"N": agents}},
                        "learners": {"groups": groups},
                        "algo": {"name": name, "agents": agents, "policy_learners": True, "train_batch_size": 48,
                                 "minibatch_size": 12, "num_sgd_iter": 1, **algo}})
    return make_algorithm(cfg.algo, ModelConfig(hidden_sizes=[8]), cfg.aggregation)


def _record(grad, group=0):
    return GradientRecord(group=group, seq=0, base_version=0, samples=1, grad=grad.astype(np.float32), stats={},
                          received_at=0.0)


def test_policies_go_to_groups_in_turn_and_one_group_per_policy_is_needed():
    mapping = [0, 0, 1, 1, 2, 3]  # four policies
    assert assigned_units(mapping, 0, 2) == [(0, BOTH), (2, BOTH)] and assigned_units(mapping, 1, 2) == [(1, BOTH), (3, BOTH)]
    assert assigned_units(mapping, 2, 2) == []  # a group beyond the active ones trains nothing
    assert assigned_units([3, 3, 5], 1, 3) == [(5, BOTH)] and assigned_units([3, 3, 5], 2, 3) == []
    assert groups_needed(mapping, 3) == 3 and groups_needed(mapping, 8) == 4 and groups_needed([2, 2, 2], 4) == 1


def test_critic_learners_take_the_critics_in_groups_of_their_own():
    six = list(range(6))
    assert assigned_units(six, 0, 3, True) == [(0, POLICY), (2, POLICY), (4, POLICY)]  # 2 policy groups, 1 critic group
    assert assigned_units(six, 1, 3, True) == [(1, POLICY), (3, POLICY), (5, POLICY)]
    assert assigned_units(six, 2, 3, True) == [(p, CRITIC) for p in six]
    assert [assigned_units([0, 4], g, 4, True) for g in range(4)] == [[(0, POLICY)], [(4, POLICY)], [(0, CRITIC)],
                                                                      [(4, CRITIC)]]
    assert groups_needed([0, 0, 0], 6, True) == 2 and groups_needed([0, 4], 6, True) == 4 and groups_needed(six, 6, True) == 6


def test_config_refuses_policy_learners_with_one_group_or_on_policy_actors():
    base = {"env": {"id": "hpcrl/MPESimpleSpread-v3"}, "algo": {"name": "ippo", "agents": 6, "policy_learners": True}}
    with pytest.raises(ConfigError, match="learners.groups >= 2"):
        build_config({**base, "learners": {"groups": 1}})
    with pytest.raises(ConfigError, match="on_policy"):
        build_config({**base, "learners": {"groups": 2}, "actors": {"on_policy": True}})
    cfg = build_config({**base, "learners": {"groups": 2}, "algo": {**base["algo"], "train_batch_size": 4800}})
    assert make_plan(cfg).group_batch_size == 4800 and make_plan(cfg).fragments_to_every_group  # every group sees every step
    with pytest.raises(ConfigError, match="critic_learners: needs algo.policy_learners"):
        build_config({**base, "algo": {"name": "ippo", "agents": 6, "critic_learners": True}})


@pytest.mark.parametrize("critic_learners", [False, True])
@pytest.mark.parametrize("action_space", [spaces.Discrete(4), spaces.Box(-1, 1, (2,), np.float32)])
def test_unit_blocks_are_disjoint_and_cover_every_trained_parameter(action_space, critic_learners):
    model = _algo().make_model(OBS, action_space)
    blocks = unit_blocks(model, critic_learners)
    assert len(blocks) == 3 * (2 if critic_learners else 1)
    allidx = np.concatenate([b.indices for b in blocks])
    assert len(np.unique(allidx)) == len(allidx)
    assert len(allidx) == sum(p.numel() for p in model.parameters() if p.requires_grad)
    with torch.no_grad():  # a critic's block is exactly its critic network
        model.flat.params.zero_()
        for p in model.vfs[1].parameters():
            p.fill_(1.0)
    critic = [b for b in blocks if b.slot == 1 and b.part in (CRITIC, BOTH)][0]
    assert model.flat.params[torch.as_tensor(critic.indices)].sum() == sum(p.numel() for p in model.vfs[1].parameters())


def test_each_block_is_averaged_over_the_gradients_that_carry_it():
    model = _algo().make_model(OBS, spaces.Discrete(4))
    blocks = [b.indices for b in unit_blocks(model)]
    n = model.flat.num_params
    g0, g1, g2 = np.zeros(n), np.zeros(n), np.zeros(n)
    g0[blocks[0]] = 1.0  # group 0 carries slot 0
    g1[blocks[1]] = 2.0  # group 1 carries slot 1
    g2[blocks[1]] = 4.0  # another gradient for slot 1
    step = [(_record(g0), 1.0), (_record(g1, 1), 1.0), (_record(g2, 1), 0.5)]
    out = aggregate_by_block(step, unit_blocks(model))
    np.testing.assert_allclose(out[blocks[0]], 1.0)  # not the step mean's 1/3
    np.testing.assert_allclose(out[blocks[1]], (2.0 + 0.5 * 4.0) / 2)
    np.testing.assert_allclose(out[blocks[2]], 0.0)
    np.testing.assert_allclose(aggregate(step)[blocks[0]], 1.0 / 3)  # what Stellaris' mean would give


@pytest.mark.parametrize("action_space", [spaces.Discrete(4), spaces.Box(-1, 1, (2,), np.float32)])
def test_only_the_blocks_a_gradient_carries_take_an_optimizer_step(action_space):
    algo = _algo()
    model = algo.make_model(OBS, action_space)
    start = model.flat.params.clone()
    opt = algo.make_optimizer(model)
    units = unit_blocks(model)
    blocks = [b.indices for b in units]
    warm = np.ones(model.flat.num_params, np.float32)
    algo.apply(model, opt, warm)  # every slot has Adam momentum now
    before = model.flat.params.clone()
    moments = {k: v.clone() for k, v in opt.state[model.log_std].items()} if not model.discrete else None
    g = np.zeros(model.flat.num_params, np.float32)
    g[blocks[0]] = 1.0
    assert [b.slot for b in apply_to_carried_blocks(model, opt, g, units)] == [1, 2]
    block = [torch.as_tensor(b) for b in blocks]
    assert not torch.equal(model.flat.params[block[0]], before[block[0]])
    for s in (1, 2):
        assert torch.equal(model.flat.params[block[s]], before[block[s]])
    if moments is not None:  # the idle rows of the shared log-std keep their Adam moments too
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[model.log_std][k][1:], moments[k][1:])
            assert not torch.equal(opt.state[model.log_std][k][0], moments[k][0])
    assert model.flat.grads_attached()
    plain = algo.make_model(OBS, action_space)  # the same two steps without the mask: momentum moves slot 1
    plain.flat.load_(start)
    plain_opt = algo.make_optimizer(plain)
    Algorithm.apply(algo, plain, plain_opt, warm)
    torch.testing.assert_close(plain.flat.params, before)
    Algorithm.apply(algo, plain, plain_opt, g)
    assert not torch.equal(plain.flat.params[block[1]], before[block[1]])


def _fragment(T=8, N=6):
    rng = np.random.default_rng(0)
    return {"obs": rng.normal(size=(T, N, 3)).astype(np.float32), "actions": rng.integers(4, size=(T, N)),
            "rewards": rng.normal(size=(T, N)).astype(np.float32), "terminated": np.zeros((T, N), np.int8),
            "truncated": np.zeros((T, N), np.int8), "behaviour_logp": np.full((T, N), -np.log(4), np.float32),
            "values": np.zeros((T, N), np.float32), "final_values": np.zeros((T, N), np.float32),
            "last_value": np.zeros(N, np.float32)}


def _carried(grad, blocks):
    return {(b.slot, b.part) for b in blocks if grad[torch.as_tensor(b.indices)].abs().sum() > 0}


def test_a_groups_minibatches_hold_its_policies_rows_and_as_many_minibatches_as_one_group_makes():
    algo = _algo(agents=3, policies="per_agent")
    model = algo.make_model(OBS, spaces.Discrete(4))
    batch = algo.prepare([_fragment()], model)  # 8 steps x 2 copies x 3 agents = 48 rows
    gen = torch.Generator().manual_seed(0)
    for group, policies in ((0, {0, 2}), (1, {1})):
        algo.assign_learner(group, 2)
        mbs = list(algo.minibatches(batch, gen))
        assert len(mbs) == 48 // 12  # as many as the whole batch makes
        rows = torch.cat([mb["slot"] for mb in mbs])
        assert set(rows.tolist()) == policies and len(rows) == 16 * len(policies)
        grad, _ = algo.compute_gradient(mbs[0], model)
        assert _carried(grad, algo.blocks) == {(p, BOTH) for p in set(mbs[0]["slot"].tolist())}
    algo.assign_learner(2, 2)
    assert list(algo.minibatches(batch, gen)) == []


def test_policy_and_critic_learners_push_only_their_networks_gradients():
    algo = _algo(agents=3, policies="per_agent", critic_learners=True)
    model = algo.make_model(OBS, spaces.Discrete(4))
    batch = algo.prepare([_fragment()], model)
    gen = torch.Generator().manual_seed(0)
    algo.assign_learner(0, 2)  # 2 active: group 0 trains the 3 policy networks, group 1 the 3 critics
    mb = next(iter(algo.minibatches(batch, gen)))
    assert mb["train_policy"].all() and not mb["train_critic"].any()
    grad, stats = algo.compute_gradient(mb, model)
    assert _carried(grad, algo.blocks) == {(s, POLICY) for s in range(3)} and stats["value_loss"] == 0.0
    algo.assign_learner(1, 2)
    mb = next(iter(algo.minibatches(batch, gen)))
    assert mb["train_critic"].all() and not mb["train_policy"].any()
    grad, stats = algo.compute_gradient(mb, model)
    assert _carried(grad, algo.blocks) == {(s, CRITIC) for s in range(3)} and stats["policy_loss"] == 0.0
    assert stats["value_loss"] > 0


# W = 3 rounds and a gamma no slope reaches: sharing toggles every time the window fills (6 -> 2 -> 6 policies)
RUN = ["env.num_envs=2", "actors.fragment_length=25", "algo.train_batch_size=300", "algo.minibatch_size=150",
       "algo.num_sgd_iter=1", "algo.sharing=true", "algo.sharing_window=3", "algo.sharing_gamma=100",
       "algo.sharing_samples_per_agent=24", "algo.sharing_lanczos_steps=6", "learners.groups=3",
       "algo.policy_learners=true", "stop.max_rounds=8", "stop.total_env_steps=1000000"]


def _check_groups_follow_the_policies(run_dir: Path) -> None:
    h5 = run_dir / "run.h5"
    ev, pm = read_table(h5, "elastic_events"), read_table(h5, "policy_map")
    decided = ev["action"] != ELASTIC_ACTIONS.index("parked")
    assert (ev["group"][decided] == 2).all()  # 6 policies need all 3 groups, 2 policies 2: group 2 goes and comes
    reasons = [ELASTIC_REASONS[r] for r in ev["reason"][decided]]
    assert reasons[:2] == ["policies_merged", "policies_split"], reasons
    assert sorted(set(pm["policies"].tolist())) == [2, 6]
    la = read_table(h5, "learner_activity")
    assert {0, 1, 2} <= set(la["group"].tolist())
    grads = read_table(h5, "gradients")
    assert set(grads["group"].tolist()) == {0, 1, 2}


@pytest.mark.slow
def test_serial_run_parks_the_group_of_merged_policies(tmp_path):
    run_dir = tmp_path / "run"
    args = [a for o in [*RUN, f"io.run_dir={run_dir}"] for a in ("-o", o)]
    assert cli_main(["run", str(CONFIGS / "mpe_spread_ippo.yaml"), "--runner", "serial", *args]) == 0
    _check_groups_follow_the_policies(run_dir)


@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_run_with_critic_learners_goes_on_when_a_parked_group_comes_back(tmp_path):
    """The shipped batch sizes, 2 actors, 5 groups: 6 policies -> 3 policy + 2 critic groups, 2 -> 2 + 2 (group 4
    parks), 6 again (group 4 comes back). Actors that waited for room in every group deadlocked here about every
    second run: the others, held by sync admission until group 4's first gradient, had full backlogs, so it got no
    fragment. The shipped sizes of envs, fragments, batches and minibatches (what fills the backlogs), but 2 passes
    per batch, not 10: the passes only lengthen each group's training between the waits for the others. A window
    of 2 rounds and 8 rounds: group 4 parked in round 3 and came back as round 5 began, and a merge or split under
    MPI timing may come a round or two late (test_mpi_run_with_a_postprocess_learner)."""
    run_dir = tmp_path / "run"
    over = ["algo.sharing=true", "algo.sharing_window=2", "algo.sharing_gamma=100", "learners.groups=5",
            "actors.count=2", "algo.policy_learners=true", "algo.critic_learners=true", "algo.num_sgd_iter=2",
            "stop.max_rounds=8", f"io.run_dir={run_dir}"]
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(CONFIGS / "mpe_spread_ippo.yaml"), "--runner", "mpi",
                          *[a for o in over for a in ("-o", o)]], cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    ev = read_table(run_dir / "run.h5", "elastic_events")
    decided = ev["action"] != ELASTIC_ACTIONS.index("parked")
    assert [(int(g), ELASTIC_REASONS[r]) for g, r in zip(ev["group"][decided], ev["reason"][decided])][:2] == [
        (4, "policies_merged"), (4, "policies_split")]
    grads = read_table(run_dir / "run.h5", "gradients")
    assert set(grads["group"].tolist()) == set(range(5))
    assert grads["time"][grads["group"] == 4].max() > ev["time"][decided][1]  # group 4 trained again after coming back


@pytest.mark.slow
def test_serial_run_with_critic_learners_parks_the_groups_of_merged_policies(tmp_path):
    """6 groups: 6 policies -> 3 policy + 3 critic groups; merged to 2 -> 2 + 2, groups 4 and 5 park."""
    run_dir = tmp_path / "run"
    over = [o for o in RUN if not o.startswith("learners.groups")] + ["learners.groups=6", "algo.critic_learners=true"]
    args = [a for o in [*over, f"io.run_dir={run_dir}"] for a in ("-o", o)]
    assert cli_main(["run", str(CONFIGS / "mpe_spread_mappo.yaml"), "--runner", "serial", *args]) == 0
    ev = read_table(run_dir / "run.h5", "elastic_events")
    decided = ev["action"] != ELASTIC_ACTIONS.index("parked")
    parks = ev["group"][decided & (ev["reason"] == ELASTIC_REASONS.index("policies_merged"))]
    assert sorted(parks.tolist()[:2]) == [4, 5]
    assert (ev["reason"][decided] == ELASTIC_REASONS.index("policies_split")).any()
    grads = read_table(run_dir / "run.h5", "gradients")
    assert set(grads["group"].tolist()) == set(range(6))


def test_iql_groups_take_their_agents_td_errors_and_vdn_refuses_policy_learners():
    with pytest.raises(ConfigError, match="vdn's team TD error"):
        build_config({"env": {"id": "hpcrl/MPESimpleSpread-v3"}, "learners": {"groups": 2},
                      "algo": {"name": "vdn", "agents": 6, "policy_learners": True}})
    cfg = build_config({"env": {"id": "hpcrl/MPESimpleSpread-v3", "kwargs": {"N": 3}}, "learners": {"groups": 2},
                        "algo": {"name": "iql", "agents": 3, "policy_learners": True, "batch_size": 16,
                                 "updates_per_fragment": 2}})
    algo = make_algorithm(cfg.algo, ModelConfig(hidden_sizes=[8]), cfg.aggregation)
    model = algo.make_model(OBS, spaces.Discrete(4))
    frag = {**_fragment(), "last_obs": np.zeros((6, 3), np.float32)}
    gen = torch.Generator().manual_seed(0)
    for group, agents in ((0, {0, 2}), (1, {1})):
        algo.assign_learner(group, 2)
        mbs = list(algo.minibatches(algo.prepare([frag], model), gen))
        assert len(mbs) == 2 and mbs[0]["train_agent"].shape == (16, 3)
        assert set(np.flatnonzero(mbs[0]["train_agent"][0].numpy())) == agents
        grad, _ = algo.compute_gradient(mbs[0], model)
        assert _carried(grad, algo.blocks) == {(a, BOTH) for a in agents}  # per_agent: agent j's policy is slot j
    algo.assign_learner(2, 2)
    assert list(algo.minibatches(algo.prepare([frag], model), gen)) == []
    opt = algo.make_optimizer(model)
    before = model.flat.params.clone()
    g = np.zeros(model.flat.num_params, np.float32)
    g[algo.blocks[1].indices] = 1.0
    algo.apply(model, opt, g)  # slot 1's Q-network steps; the others (and every target but by tau) do not
    moved = {b.slot for b in algo.blocks if not torch.equal(model.flat.params[torch.as_tensor(b.indices)],
                                                             before[torch.as_tensor(b.indices)])}
    assert moved == {1}


@pytest.mark.slow
def test_serial_iql_run_parks_the_group_of_merged_policies(tmp_path):
    run_dir = tmp_path / "run"
    over = ["env.num_envs=2", "actors.fragment_length=25", "algo.sharing=true", "algo.sharing_window=3",
            "algo.sharing_gamma=100", "algo.sharing_samples_per_agent=24", "algo.sharing_lanczos_steps=6",
            "algo.updates_per_fragment=2", "learners.groups=3", "algo.policy_learners=true", "stop.max_rounds=8",
            "stop.total_env_steps=1000000", f"io.run_dir={run_dir}"]
    assert cli_main(["run", str(CONFIGS / "mpe_spread_iql.yaml"), "--runner", "serial",
                     *[a for o in over for a in ("-o", o)]]) == 0
    _check_groups_follow_the_policies(run_dir)


def test_postprocess_learner_config_and_the_groups_it_needs():
    base = {"env": {"id": "hpcrl/MPESimpleSpread-v3"}, "learners": {"groups": 4},
            "algo": {"name": "mappo", "agents": 6, "policy_learners": True, "postprocess_learner": True,
                     "train_batch_size": 4800}}
    cfg = build_config(base)
    plan = make_plan(cfg)
    assert plan.postprocess_groups == 1 and not plan.fragments_to_every_group and plan.group_batch_size == 4800
    with pytest.raises(ConfigError, match="postprocess_learner: needs algo.policy_learners"):
        build_config({**base, "algo": {"name": "ippo", "agents": 6, "postprocess_learner": True}})
    with pytest.raises(ConfigError, match="ssp keeps a clock per learner group"):
        build_config({**base, "aggregation": {"policy": "ssp"}})
    with pytest.raises(ConfigError, match="postprocess_learner"):  # not an IQL field
        build_config({**base, "algo": {"name": "iql", "agents": 6, "policy_learners": True, "postprocess_learner": True}})
    algo = make_algorithm(cfg.algo, ModelConfig(hidden_sizes=[8]), cfg.aggregation)
    model = algo.make_model(spaces.Box(-1, 1, (18,), np.float32), spaces.Discrete(5))
    # 6 per-agent policies: group 0 post-processes, groups 1-3 take two policies each
    assert algo.learner_groups_needed(model, 4) == 4 and algo.learner_groups_needed(model, 8) == 7


def _check_postprocess_run(run_dir: Path) -> None:
    """Group 0 post-processed every fragment and pushed no gradient; groups 1-3 trained; group 3 parked at the merge."""
    h5 = run_dir / "run.h5"
    assert set(read_table(h5, "actors", ["group"])["group"].tolist()) == {0}  # actors send to group 0 alone
    grads = read_table(h5, "gradients")
    assert set(grads["group"].tolist()) == {1, 2, 3}
    la = read_table(h5, "learner_activity")
    assert {0, 1, 2, 3} <= set(la["group"].tolist()) and la["compute_seconds"][la["group"] == 0].sum() > 0
    ev = read_table(h5, "elastic_events")
    decided = ev["action"] != ELASTIC_ACTIONS.index("parked")
    assert [(int(g), ELASTIC_REASONS[r]) for g, r in zip(ev["group"][decided], ev["reason"][decided])][:2] == [
        (3, "policies_merged"), (3, "policies_split")]
    updates = read_table(h5, "updates")
    assert updates["round"].max() >= 6  # the rounds went on: post-processed batches counted their env steps


@pytest.mark.slow
def test_serial_run_with_a_postprocess_learner(tmp_path):
    run_dir = tmp_path / "run"
    over = [o for o in RUN if not o.startswith("learners.groups")] + ["learners.groups=4", "algo.postprocess_learner=true"]
    args = [a for o in [*over, f"io.run_dir={run_dir}"] for a in ("-o", o)]
    assert cli_main(["run", str(CONFIGS / "mpe_spread_mappo.yaml"), "--runner", "serial", *args]) == 0
    _check_postprocess_run(run_dir)


@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_run_with_a_postprocess_learner(tmp_path):
    run_dir = tmp_path / "run"
    # 10 rounds, not RUN's 8: a round ends with its batch's last gradient, and under MPI timing on a loaded machine
    # the merge and the split came a round or two later than 8 rounds allow (2 of 3 runs failed with 8, 3 of 3 passed with 10)
    over = [o for o in RUN if not o.startswith(("learners.groups", "stop.max_rounds"))] + [
        "learners.groups=4", "algo.postprocess_learner=true", "actors.count=2", "stop.max_rounds=10", f"io.run_dir={run_dir}"]
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(CONFIGS / "mpe_spread_ippo.yaml"), "--runner", "mpi",
                          *[a for o in over for a in ("-o", o)]], cwd=tmp_path, capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    _check_postprocess_run(run_dir)
