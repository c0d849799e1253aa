"""hpcrl bench marless: per-group returns split into rounds as the rounds table counts them."""
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
