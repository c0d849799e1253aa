"""hpcrl bench marless: per-group returns split into rounds as the rounds table counts them; the
cross-play actor (one side as trained, the other uniform)."""
import numpy as np

from hpcrl.bench.marless import GROUPS, round_group_returns


def test_round_group_returns_splits_by_round_counts_and_agent():
    # 2 rounds; agent = env_index mod 3 (agent 0 the adversary, 1-2 good). Round 0 receives 4
    # episodes, round 1 three, round 2 none.
    episodes = {"env_index": np.array([0, 1, 2, 4, 3, 5, 7]),
                "return": np.array([-1.0, -2.0, -4.0, -6.0, 10.0, -8.0, -3.0])}
    counts = np.array([4, 3, 0])
    good = round_group_returns(episodes, counts, 3, (1, 2))
    adversary = round_group_returns(episodes, counts, 3, (0,))
    np.testing.assert_allclose(good[:2], [(-2 - 4 - 6) / 3, (-8 - 3) / 2])
    np.testing.assert_allclose(adversary[:2], [-1.0, 10.0])
    assert np.isnan(good[2]) and np.isnan(adversary[2])
    everyone = round_group_returns(episodes, counts, 3, (0, 1, 2))
    np.testing.assert_allclose(everyone[:2], [np.mean([-1, -2, -4, -6]), np.mean([10, -8, -3])])


def test_groups_cover_six_agents_once():
    for env, groups in GROUPS.items():
        members = sorted(m for g in groups.values() for m in g)
        assert members == list(range(6)), env


def test_against_random_keeps_the_trained_side_and_draws_the_other_uniformly():
    import torch

    from hpcrl.algos import make_algorithm
    from hpcrl.bench.marless import AgainstRandom, config_path
    from hpcrl.config import load_config
    from hpcrl.runtime.roles.sampler import describe_env

    cfg = load_config(config_path("adversary", "ippo"))
    info = describe_env(cfg.env)
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    model = algo.make_model(info.observation_space, info.action_space)
    obs = np.zeros((600, *info.observation_space.shape), np.float32)  # 100 env copies x 6 agents
    mixed = AgainstRandom(algo, GROUPS["adversary"]["good"], 6, int(info.action_space.n), seed=0)
    torch.manual_seed(3)
    mine, _, _ = algo.act(model, obs)
    torch.manual_seed(3)
    a, _, _ = mixed.act(model, obs)
    agent = np.arange(600) % 6
    good = agent != 0
    assert torch.equal(a[torch.as_tensor(good)], mine[torch.as_tensor(good)])  # the trained side acts as trained
    counts = np.bincount(a[torch.as_tensor(~good)].numpy(), minlength=info.action_space.n)
    assert counts.sum() == 100 and (counts > 5).all()  # the adversary: every action, about equally often
