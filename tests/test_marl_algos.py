"""MARLess' algorithms (seed 001, sections 4.2, 6.2.1): multi-policy models, IPPO/MAPPO/IQL/VDN losses."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.algos import make_algorithm
from hpcrl.config import ModelConfig, build_config
from hpcrl.errors import ConfigError
from hpcrl.marl.dqn import epsilon_at, vdn_loss
from hpcrl.marl.model import MultiPolicyActorCritic
from hpcrl.marl.replay import joint_transitions
from hpcrl.runtime.plan import make_plan

OBS, ACT = spaces.Box(-np.inf, np.inf, (3,), np.float32), spaces.Discrete(4)


def _algo(name, agents=3, policies="per_agent", **algo):
    cfg = build_config({"env": {"id": "hpcrl/MPESimpleSpread-v3", "kwargs": {"N": agents}},
                        "algo": {"name": name, "agents": agents, "policies": policies, **algo}})
    return make_algorithm(cfg.algo, ModelConfig(hidden_sizes=[8]), cfg.aggregation), cfg


def _fragment(T=4, copies=2, agents=3, rng=np.random.default_rng(0)):
    N = copies * agents
    return {"obs": rng.normal(size=(T, N, 3)).astype(np.float32), "actions": rng.integers(4, size=(T, N)),
            "rewards": rng.normal(size=(T, N)).astype(np.float32), "terminated": np.zeros((T, N), np.int8),
            "truncated": np.zeros((T, N), np.int8), "behaviour_logp": np.full((T, N), -np.log(4), np.float32),
            "values": np.zeros((T, N), np.float32), "final_values": np.zeros((T, N), np.float32),
            "last_value": np.zeros(N, np.float32), "last_obs": rng.normal(size=(N, 3)).astype(np.float32)}


def test_vdn_gives_every_agent_the_same_mixing_gradient():
    q = torch.tensor([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]], requires_grad=True)
    y = torch.tensor([5.0, 1.0])
    vdn_loss(q, y).backward()
    # dL/dQ_i = dL/dQ_tot = 2 (Q_tot - y) / B for every agent i: (6 - 5), (3 - 1)
    assert q.grad.tolist() == [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]


def test_rows_train_only_their_agents_policy_and_the_map_routes_them():
    torch.manual_seed(0)
    model = MultiPolicyActorCritic(OBS, ACT, ModelConfig(hidden_sizes=[8]), agents=3, mapping=[0, 1, 2],
                                   central_critic=False)
    obs, agent = torch.randn(5, 3), torch.tensor([2, 2, 2, 2, 2])
    model.flat.zero_grad()
    model.evaluate(obs, torch.zeros(5), agent, obs)[0].sum().backward()
    touched = [any(p.grad.abs().sum() > 0 for p in model.pis[s].parameters()) for s in range(3)]
    assert touched == [False, False, True]
    logits_2 = model.dist(obs, agent).logits
    model.set_mapping([0, 0, 0])  # sharing: agent 2 now acts with policy 0
    assert torch.allclose(model.dist(obs, agent).logits, model.dist(obs, torch.zeros(5, dtype=torch.long)).logits)
    assert not torch.allclose(model.dist(obs, agent).logits, logits_2)
    assert "policy_of" in dict(model.named_parameters())  # the map travels in the flat buffer


def test_mappo_critic_sees_the_joint_observation_of_the_copy_and_the_agent_id():
    algo, _ = _algo("mappo", agents=3)
    model = algo.make_model(OBS, ACT)
    obs = torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(6, 3)  # 2 copies of 3 agents
    x = model.critic_obs(obs)
    assert x.shape == (6, 3 * 3 + 3)
    assert torch.equal(x[4, :9], obs[3:6].reshape(-1)) and x[4, 9:].tolist() == [0, 1, 0]


@pytest.mark.parametrize("name", ["ippo", "mappo"])
def test_ppo_family_gradient_moves_the_loss(name):
    algo, _ = _algo(name, train_batch_size=24, minibatch_size=24, num_sgd_iter=1)
    model = algo.make_model(OBS, ACT)
    batch = algo.prepare([_fragment()], model)
    assert batch["agent"].tolist()[:7] == [0, 1, 2, 0, 1, 2, 0]
    mb = next(iter(algo.minibatches(batch, torch.Generator().manual_seed(0))))
    grad, stats = algo.compute_gradient(mb, model)
    before = stats["loss"]
    model.flat.load_(model.flat.params - 0.05 * grad / (grad.norm() + 1e-8))
    assert algo.loss(mb, model)[0].item() < before


def test_replay_rows_keep_truncation_and_termination_apart():
    f = _fragment(T=2, copies=1, agents=3)
    f["terminated"][0, 1] = 1
    f["truncated"][1, :] = 1
    f["final_values"][1, :] = [7, 8, 9]
    rows = joint_transitions(f, 3)
    assert rows["alive"].tolist() == [[1, 0, 1], [1, 1, 1]]
    assert rows["fixed"].tolist() == [[0, 0, 0], [1, 1, 1]]
    assert np.array_equal(rows["next_obs"][0], f["obs"][1]) and np.array_equal(rows["next_obs"][1], f["last_obs"])


def test_iql_targets_bootstrap_only_where_the_episode_goes_on():
    algo, _ = _algo("iql", agents=3, gamma=0.5, batch_size=2, updates_per_fragment=1)
    model = algo.make_model(OBS, ACT)
    f = _fragment(T=2, copies=1, agents=3)
    f["terminated"][0, 1] = 1
    f["truncated"][1, :] = 1
    f["final_values"][1, :] = [7, 8, 9]
    mb = {k: torch.as_tensor(v) for k, v in joint_transitions(f, 3).items()}
    q, y = algo.td_targets(mb, model)
    next_max = model.value(mb["next_obs"][0])  # max_a Q' of row 0's next observations
    r = mb["rewards"]
    assert y[0, 1].item() == pytest.approx(r[0, 1].item())                          # terminated: no bootstrap
    assert y[0, 0].item() == pytest.approx(r[0, 0].item() + 0.5 * next_max[0].item(), rel=1e-5)
    assert y[1].tolist() == pytest.approx((r[1] + 0.5 * torch.tensor([7.0, 8.0, 9.0])).tolist())  # truncated
    vdn, _ = _algo("vdn", agents=3, gamma=0.5)
    assert vdn.td_targets(mb, model)[1].tolist() == pytest.approx(y.sum(dim=1).tolist(), rel=1e-5)


def test_epsilon_schedule_and_soft_target_update_on_the_parameter_side():
    algo, cfg = _algo("iql", epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_rounds=10, target_tau=0.5)
    assert [epsilon_at(r, cfg.algo) for r in (0, 5, 10, 20)] == pytest.approx([1.0, 0.55, 0.1, 0.1])
    model = algo.make_model(OBS, ACT)
    assert algo.end_round(model, {}) == {}  # in the flat buffer: nothing for the runtime to act on
    assert float(model.constants["epsilon"]) == pytest.approx(0.91)
    opt = algo.make_optimizer(model)
    t0 = [p.clone() for p in model.targets.parameters()]
    grad = np.ones(model.flat.num_params, np.float32)
    algo.apply(model, opt, grad)
    for t, before, q in zip(model.targets.parameters(), t0, model.qs.parameters()):
        assert torch.allclose(t, 0.5 * before + 0.5 * q)


def test_vdn_refuses_a_competitive_env_in_one_line():
    with pytest.raises(ConfigError) as e:
        build_config({"env": {"id": "hpcrl/MPESimpleAdversary-v3"}, "algo": {"name": "vdn", "agents": 6}})
    assert "vdn needs a cooperative env" in str(e.value) and "\n" not in str(e.value)


def test_marl_rounds_count_agent_steps():
    cfg = build_config({"env": {"id": "hpcrl/MPESimpleSpread-v3", "num_envs": 8}, "actors": {"fragment_length": 25,
                        "count": 2}, "algo": {"name": "iql", "agents": 6}})
    plan = make_plan(cfg)
    assert plan.round_steps == 2 * 25 * 8 * 6 and plan.group_batch_size == 25 * 8 * 6


@pytest.mark.parametrize("name", ["ippo", "mappo", "iql", "vdn"])
def test_greedy_actions_are_each_agents_policy_without_exploration(name):
    # evaluation episodes (eval.*) act with algo.greedy: every MARL model must provide it
    torch.manual_seed(0)
    algo, _ = _algo(name, agents=3, **({"epsilon_start": 1.0} if name in ("iql", "vdn") else {}))
    model = algo.make_model(OBS, ACT)
    obs = torch.randn(6, 3)  # 2 env copies of 3 agents: row r is agent r mod 3
    agent = torch.arange(6) % 3
    scores = model.q(obs, agent) if name in ("iql", "vdn") else model.dist(obs, agent).logits
    greedy = algo.greedy(model, obs.numpy())
    assert greedy.tolist() == scores.argmax(dim=1).tolist()
    assert algo.greedy(model, obs.numpy()).tolist() == greedy.tolist()  # epsilon 1 does not enter


def test_greedy_of_a_gaussian_policy_is_its_mean():
    box = spaces.Box(-1.0, 1.0, (1,), np.float32)
    model = MultiPolicyActorCritic(OBS, box, ModelConfig(hidden_sizes=[8]), agents=2, mapping=[0, 1],
                                   central_critic=False)
    obs = torch.randn(4, 3)
    mean = model.dist(obs, torch.arange(4) % 2).mean
    assert model.greedy(obs).shape == (4, 1)
    assert torch.allclose(model.greedy(obs), mean)
