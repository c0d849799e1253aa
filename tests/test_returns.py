"""GAE, V-trace and n-step returns against hand computations."""
import math

import pytest
import torch

from hpcrl.algos.returns import generalized_advantage_estimate, n_step_returns, next_values_from, vtrace

G, LAM = 0.9, 0.8


def fragment():
    # column 0: truncated at t=0 (final value 4), terminated at t=1, fragment ends at t=2 (last value 2)
    # column 1: no episode boundary, last value 1
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    values = torch.tensor([[0.5, 0.0], [1.0, 0.0], [1.5, 0.0]])
    terminated = torch.tensor([[False, False], [True, False], [False, False]])
    truncated = torch.tensor([[True, False], [False, False], [False, False]])
    final_values = torch.tensor([[4.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    last_value = torch.tensor([2.0, 1.0])
    return rewards, values, terminated, truncated, final_values, last_value


def test_next_values_from():
    rewards, values, terminated, truncated, final_values, last_value = fragment()
    nxt = next_values_from(values, last_value, truncated, final_values)
    assert nxt.tolist() == [[4.0, 0.0], [1.5, 0.0], [2.0, 1.0]]


def test_gae_hand_computed_with_truncation_and_termination():
    rewards, values, terminated, truncated, final_values, last_value = fragment()
    nxt = next_values_from(values, last_value, truncated, final_values)
    adv, ret = generalized_advantage_estimate(rewards, values, nxt, terminated, truncated, G, LAM)
    # col 0: A2 = 3 + .9*2 - 1.5; A1 = 2 - 1 (terminal, no bootstrap); A0 = 1 + .9*4 - .5 (recursion cut)
    # col 1: deltas 1, 1, 1.9; A1 = 1 + .72*1.9; A0 = 1 + .72*A1
    a1 = 1 + 0.72 * 1.9
    expected = torch.tensor([[4.1, 1 + 0.72 * a1], [1.0, a1], [3.3, 1.9]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + values)


def test_shape_mismatch_raises():
    rewards, values, terminated, truncated, final_values, last_value = fragment()
    with pytest.raises(ValueError, match="shapes"):
        generalized_advantage_estimate(rewards[:2], values, values, terminated, truncated, G, LAM)
    with pytest.raises(ValueError, match="shapes"):
        generalized_advantage_estimate(rewards.flatten(), values.flatten(), values.flatten(),
                                       terminated.flatten(), truncated.flatten(), G, LAM)
    with pytest.raises(ValueError, match="last_value"):
        next_values_from(values, last_value[:1], truncated, final_values)
    with pytest.raises(ValueError):
        n_step_returns(rewards, values[:, :1], terminated, truncated, G, 2)


def test_n_step_hand_computed():
    rewards, values, terminated, truncated, final_values, last_value = fragment()
    values = values.clone()
    values[:, 1] = torch.tensor([0.0, 0.5, 0.25])
    nxt = next_values_from(values, last_value, truncated, final_values)  # col 1: .5, .25, 1
    g2 = n_step_returns(rewards, nxt, terminated, truncated, G, n=2)
    expected = torch.tensor([[1 + 0.9 * 4.0, 1 + 0.9 + 0.81 * 0.25],
                             [2.0, 1 + 0.9 + 0.81 * 1.0],
                             [3 + 0.9 * 2.0, 1 + 0.9 * 1.0]])
    torch.testing.assert_close(g2, expected)
    g1 = n_step_returns(rewards, nxt, terminated, truncated, G, n=1)
    torch.testing.assert_close(g1, rewards + G * (~terminated) * nxt)
    g5 = n_step_returns(rewards, nxt, terminated, truncated, G, n=5)
    assert g5[0, 1].item() == pytest.approx(1 + 0.9 + 0.81 + 0.729 * 1.0)
    assert g5[0, 0].item() == pytest.approx(4.6)


def random_fragment(T=7, N=5, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(T, N, generator=gen)
    v = torch.randn(T, N, generator=gen)
    nxt = torch.randn(T, N, generator=gen)
    term = torch.rand(T, N, generator=gen) < 0.2
    trunc = (torch.rand(T, N, generator=gen) < 0.2) & ~term
    return [x.to(device) for x in (r, v, nxt, term, trunc)]


def test_vtrace_on_policy_equals_gae_lambda_one():
    r, v, nxt, term, trunc = random_fragment()
    vs, pg_adv = vtrace(torch.zeros_like(r), r, v, nxt, term, trunc, G)
    adv, ret = generalized_advantage_estimate(r, v, nxt, term, trunc, G, 1.0)
    torch.testing.assert_close(vs, ret)
    torch.testing.assert_close(pg_adv, adv)


def test_vtrace_off_policy_hand_computed():
    log_rhos = torch.tensor([[math.log(0.5)], [math.log(2.0)]])
    r = torch.ones(2, 1)
    v = torch.zeros(2, 1)
    nxt = torch.tensor([[0.0], [1.0]])
    no = torch.zeros(2, 1, dtype=torch.bool)
    vs, pg_adv = vtrace(log_rhos, r, v, nxt, no, no, G)
    # rho = c = (.5, 1): corr1 = 1.9, corr0 = .5 + .9 * .5 * 1.9
    torch.testing.assert_close(vs, torch.tensor([[1.355], [1.9]]))
    torch.testing.assert_close(pg_adv, torch.tensor([[0.5 * (1 + 0.9 * 1.9)], [1.9]]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_estimators_on_cuda_match_cpu():
    cpu = random_fragment()
    gpu = random_fragment(device="cuda")
    a = n_step_returns(cpu[0], cpu[2], cpu[3], cpu[4], G, 3)
    b = n_step_returns(gpu[0], gpu[2], gpu[3], gpu[4], G, 3)
    torch.testing.assert_close(b.cpu(), a)
    a = generalized_advantage_estimate(*cpu, G, LAM)[0]
    b = generalized_advantage_estimate(*gpu, G, LAM)[0]
    torch.testing.assert_close(b.cpu(), a)
