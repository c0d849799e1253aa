"""MARLess' dynamic learner sharing and actor scaling maths (seed 001, sections 4.3-4.4)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcrl.marl.actor_scaling import ActorScaler, min_actors, policy_demand, scaling_ratio, total_actors
from hpcrl.marl.convexity import convexity_ratio, hvp_function, lanczos, loss_convexity_ratio, power_iteration
from hpcrl.marl.detection import SharingToggle, global_rewards, least_squares_slope
from hpcrl.marl.grouping import group_agents, kmeans
from hpcrl.marl.scheduler import policy_count
from hpcrl.marl.similarity import kl_matrix, observation_action_samples


# ---- 4.3.1 tolerant window ----------------------------------------------------------------
def test_slope_of_a_line_and_of_a_hand_made_window():
    assert least_squares_slope([1, 3, 5]) == pytest.approx(2.0)
    assert least_squares_slope([4, 4, 4, 4]) == pytest.approx(0.0)
    # y = [1..9, 0] / 9: sum((x - 4.5) y) = 37.5 / 9, sum((x - 4.5)^2) = 82.5
    assert least_squares_slope(np.r_[np.arange(1, 10), 0] / 9) == pytest.approx(37.5 / 9 / 82.5)


def test_rewards_are_normalised_per_agent_before_they_are_averaged():
    # agent 1 earns 100x agent 0's reward: both weigh the same in R
    assert global_rewards([[0, 0], [1, 100], [2, 200]]) == pytest.approx([0.0, 0.5, 1.0])
    # an agent whose reward did not move contributes 0
    assert global_rewards([[0, 7], [2, 7]]) == pytest.approx([0.0, 0.5])


def test_toggle_only_with_a_full_window_and_a_low_slope_then_the_window_is_cleared():
    toggle = SharingToggle(window=10, gamma=0.1)
    toggled = []
    rounds = [(t, 10 * t) for t in range(10)]  # a clean rise: k = 1/9 > 0.1, no toggle
    rounds += [(0, 0)]                           # a drop: window [1..9, 0] has k = 0.0505 < 0.1
    rounds += [(3, 30)] * 10                     # flat: k = 0, but only once the cleared window is full again
    for t, r in enumerate(rounds):
        if toggle.observe(r):
            toggled.append((t, toggle.sharing))
    assert toggled == [(10, True), (20, False)]
    assert len(toggle.window) == 0


def test_a_gamma_below_the_steepest_possible_fall_never_toggles():
    toggle = SharingToggle(window=4, gamma=-0.5)
    assert not any(toggle.observe([-t]) for t in range(40))


# ---- 4.3.3 policy-count scheduler ---------------------------------------------------------
@pytest.mark.parametrize("agents,expected", [(6, [2, 4, 6, 6, 6]), (8, [2, 4, 8, 8, 8]), (3, [2, 3, 3, 3, 3]),
                                             (16, [2, 4, 8, 16, 16]), (1, [1, 1, 1, 1, 1])])
def test_policy_count_sequence(agents, expected):
    assert [policy_count(j, agents) for j in range(1, 6)] == expected


def test_policy_count_rejects_j_zero():
    with pytest.raises(ValueError):
        policy_count(0, 6)


# ---- 4.3.2 KDE + PCA KL ---------------------------------------------------------------------
def test_kl_is_near_zero_for_identical_distributions_and_large_for_shifted_ones():
    rng = np.random.default_rng(0)
    same_a, same_b = rng.normal(size=(300, 5)), rng.normal(size=(300, 5))
    shifted = rng.normal(size=(300, 5)) + np.array([3.0, 0, 0, 0, 0])
    kl = kl_matrix([same_a, same_b, shifted], components=3)
    assert kl[0, 1] < 0.1 and kl[1, 0] < 0.1
    assert kl[0, 2] > 1.0 and kl[2, 0] > 1.0 and kl[1, 2] > 1.0
    assert np.all(np.diag(kl) == 0)


def test_kl_of_two_unit_gaussians_is_close_to_the_closed_form():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(800, 1)), rng.normal(size=(800, 1)) + 2.0
    kl = kl_matrix([a, b], components=1)
    assert kl[0, 1] == pytest.approx(2.0, rel=0.3)  # KL(N(0,1) || N(2,1)) = 2^2 / 2


def test_discrete_actions_enter_as_one_hot():
    rows = observation_action_samples(np.zeros((3, 2)), np.array([0, 2, 1]), num_actions=3)
    assert rows.shape == (3, 5) and rows[1, 2:].tolist() == [0, 0, 1]


# ---- 4.3.3 K-means grouping ---------------------------------------------------------------
def test_clearly_separated_agents_are_grouped_by_their_distributions():
    rng = np.random.default_rng(2)
    centres = {0: 0.0, 1: 6.0, 2: 0.0, 3: 6.0, 4: -6.0, 5: -6.0}
    samples = [rng.normal(size=(150, 4)) + centres[i] for i in range(6)]
    kl = kl_matrix(samples, components=2)
    assert group_agents(kl, 3).tolist() == [0, 1, 0, 1, 2, 2]
    two = group_agents(kl, 2).tolist()
    assert two[0] == two[2] and two[1] == two[3] and two[4] == two[5]
    assert group_agents(kl, 6).tolist() == [0, 1, 2, 3, 4, 5]


def test_kmeans_on_points():
    pts = np.array([[0, 0], [0.1, 0], [10, 10], [10, 10.2], [0, 0.1]])
    assert kmeans(pts, 2).tolist() == [0, 0, 1, 1, 0]


# ---- 4.3.4 convexity ratio ----------------------------------------------------------------
def _quadratic(eigs, seed=0):
    q, _ = torch.linalg.qr(torch.randn(len(eigs), len(eigs), generator=torch.Generator().manual_seed(seed),
                                       dtype=torch.float64))
    H = (q @ torch.diag(torch.tensor(eigs, dtype=torch.float64)) @ q.T).float()
    x = torch.randn(len(eigs), generator=torch.Generator().manual_seed(seed + 1), requires_grad=True)
    return 0.5 * x @ H @ x, x


def test_lanczos_finds_the_eigenvalues_of_a_known_hessian():
    loss, x = _quadratic([1.0, 2.0, 5.0, 10.0, 0.5])
    hvp = hvp_function(loss, [x])
    assert lanczos(hvp, 5, steps=5).tolist() == pytest.approx([0.5, 1.0, 2.0, 5.0, 10.0], rel=1e-4)
    assert power_iteration(hvp, 5, iters=200) == pytest.approx(10.0, rel=1e-3)
    assert convexity_ratio(hvp, 5, steps=5) == pytest.approx(20.0, rel=1e-3)


def test_convexity_ratio_uses_eigenvalue_magnitudes():
    loss, x = _quadratic([-4.0, 1.0, 2.0], seed=3)
    assert loss_convexity_ratio(loss, [x], steps=3) == pytest.approx(4.0, rel=1e-3)


def test_convexity_ratio_of_a_network_loss_is_finite_and_at_least_one():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(64, 3), torch.randn(64, 1)
    c = loss_convexity_ratio(((net(x) - y) ** 2).mean(), list(net.parameters()), steps=10)
    assert np.isfinite(c) and c >= 1.0


# ---- 4.4 actor scaling, hand-worked --------------------------------------------------------
def test_actor_scaling_by_hand():
    assert min_actors(50, 6) == 9                      # I_min = I_max / N = 8.33, rounded up
    assert scaling_ratio([2, 4, 3]) == pytest.approx(0.5)   # (4 - 3) / (4 - 2)
    assert scaling_ratio([5, 1]) == pytest.approx(1.0)
    assert scaling_ratio([7]) == 1.0                    # no spread yet: most data
    assert policy_demand(0.5, 50, 9) == 25 and policy_demand(0.1, 50, 9) == 9 and policy_demand(1.0, 50, 9) == 50
    # threshold beta (I_max - I_min) = 0.5 * 41 = 20.5
    assert total_actors([25, 50], 50, 9) == 50          # average 37.5 >= 20.5: the largest demand
    assert total_actors([9, 9, 45], 50, 9) == 45        # average 21 >= 20.5
    assert total_actors([9, 9, 9, 40], 50, 9) == 17     # average 16.75 < 20.5: the average, rounded up


def test_actor_scaler_windows_per_policy():
    scaler = ActorScaler(max_actors=50, num_agents=6, window=3)
    assert scaler.observe({0: 2.0, 1: 5.0}) == 50                  # no spread: S = 1 for both
    assert scaler.observe({0: 4.0, 1: 1.0}) == 50                  # S_0 = 0 -> 9, S_1 = 1 -> 50; avg 29.5
    assert scaler.observe({0: 4.0}) == 9                            # policy 1 merged away; S_0 = 0 -> I_min
    assert list(scaler.windows) == [0]
