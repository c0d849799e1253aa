"""PPO loss, Stellaris IS truncation (Eq. 2 and the code variant), compute_gradient, prepare_batch."""
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.algos.ppo import (
    compute_gradient,
    logps_under,
    minibatches,
    ppo_loss,
    prepare_batch,
    ratio_fn_for,
    truncated_ratio,
    truncated_ratio_code,
    update_kl_coeff,
)
from hpcrl.config import AggregationConfig, ModelConfig, PPOConfig
from hpcrl.models import ActorCritic

OBS = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
MODEL = ModelConfig(hidden_sizes=[16, 16])

MU = torch.tensor([0.5, 0.5, 0.2])
PI = torch.tensor([[0.6, 0.4, 0.5],   # this learner: r = 1.2, 0.8, 2.5
                   [0.3, 0.7, 0.1]])  # another learner: r = 0.6, 1.4, 0.5


def test_truncated_ratio_eq2_by_hand():
    torch.testing.assert_close(truncated_ratio(PI.log(), MU.log(), 1.0), torch.tensor([0.6, 0.8, 0.5]))
    torch.testing.assert_close(truncated_ratio(PI.log(), MU.log(), 0.7), torch.tensor([0.6, 0.7, 0.5]))
    torch.testing.assert_close(truncated_ratio(PI[:1].log(), MU.log(), 1.0), torch.tensor([1.0, 0.8, 1.0]))
    # the gradient reaches this learner's log-prob only where its ratio is the minimum below rho
    own = PI[0].log().clone().requires_grad_(True)
    truncated_ratio(torch.stack([own, PI[1].log()]), MU.log(), 1.0).sum().backward()
    torch.testing.assert_close(own.grad, torch.tensor([0.0, 0.8, 0.0]))
    with pytest.raises(ValueError):
        truncated_ratio(PI[0].log(), MU.log())


def test_truncated_ratio_code_variant_by_hand():
    # min(r_0, max(min_j r_j, rho)): min_j r_j = .6, .8, .5
    torch.testing.assert_close(truncated_ratio_code(PI.log(), MU.log(), 1.0), torch.tensor([1.0, 0.8, 1.0]))
    torch.testing.assert_close(truncated_ratio_code(PI.log(), MU.log(), 0.5), torch.tensor([0.6, 0.8, 0.5]))
    torch.testing.assert_close(truncated_ratio_code(PI.log(), MU.log(), 2.0), torch.tensor([1.2, 0.8, 2.0]))


def test_ratio_fn_for_config():
    assert ratio_fn_for(AggregationConfig(is_truncation=False)) is None
    fn = ratio_fn_for(AggregationConfig(rho=1.0))
    torch.testing.assert_close(fn(PI.log(), MU.log()), torch.tensor([0.6, 0.8, 0.5]))
    fn = ratio_fn_for(AggregationConfig(policy="stellaris_code", rho=1.0))
    torch.testing.assert_close(fn(PI.log(), MU.log()), torch.tensor([1.0, 0.8, 1.0]))


def test_update_kl_coeff():
    assert update_kl_coeff(0.2, 0.05, 0.01) == pytest.approx(0.3)
    assert update_kl_coeff(0.2, 0.001, 0.01) == pytest.approx(0.1)
    assert update_kl_coeff(0.2, 0.01, 0.01) == 0.2


def toy(seed=0, action_space=spaces.Discrete(2), B=64):
    torch.manual_seed(seed)
    policy = ActorCritic(OBS, action_space, MODEL)
    obs = torch.rand(B, 4) * 2 - 1
    actions, logp, values = policy.act(obs)
    batch = {"obs": obs, "actions": actions, "behaviour_logp": logp, "values": values,
             "advantages": torch.randn(B), "returns": torch.randn(B)}
    return policy, batch


@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("space", [spaces.Discrete(2), spaces.Box(-1, 1, (2,), np.float32)])
def test_loss_decreases_under_sgd(truncate, space):
    policy, batch = toy(action_space=space)
    cfg = PPOConfig(max_grad_norm=10.0, kl_coeff=0.2, entropy_coeff=0.01)
    ratio_fn = ratio_fn_for(AggregationConfig()) if truncate else None
    first, _ = ppo_loss(batch, policy, cfg, ratio_fn=ratio_fn)
    for _ in range(60):
        grad, stats = compute_gradient(batch, policy, cfg, ratio_fn=ratio_fn)
        with torch.no_grad():
            policy.flat.params.sub_(0.1 * grad)
    last, stats = ppo_loss(batch, policy, cfg, ratio_fn=ratio_fn)
    assert last.item() < 0.9 * first.item()  # 0.65-0.86 over seeds 0-4 (Discrete, truncated)
    assert stats["policy_loss"] < -0.01  # on-policy start: the surrogate begins at 0
    assert stats["kl"] > 0


def test_compute_gradient_equals_autograd_and_is_clipped():
    policy, batch = toy(seed=1)
    cfg = PPOConfig(max_grad_norm=1e6, kl_coeff=0.2, entropy_coeff=0.01)
    with torch.no_grad():  # move off the behaviour policy so every term has a gradient
        policy.flat.params.add_(0.05 * torch.randn(policy.flat.num_params))
    loss, _ = ppo_loss(batch, policy, cfg, vf_clip=0.5)
    expected = torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(policy.parameters()))])
    grad, stats = compute_gradient(batch, policy, cfg, vf_clip=0.5)
    assert grad.dtype == torch.float32 and grad.dim() == 1 and grad.numel() == policy.flat.num_params
    torch.testing.assert_close(grad, expected)
    assert stats["grad_norm"] == pytest.approx(expected.norm().item(), rel=1e-5)
    small = PPOConfig(max_grad_norm=0.01, kl_coeff=0.2, entropy_coeff=0.01)
    grad, _ = compute_gradient(batch, policy, small, vf_clip=0.5)
    assert grad.norm().item() == pytest.approx(0.01, rel=1e-3)
    torch.testing.assert_close(grad / grad.norm(), expected / expected.norm())


def test_window_policies_enter_the_ratio():
    policy, batch = toy(seed=2)
    other = ActorCritic(OBS, spaces.Discrete(2), MODEL)
    other.flat.load_(policy.flat.params + 0.3 * torch.randn(policy.flat.num_params))
    window = logps_under([other], batch)
    assert window.shape == (1, 64)
    cfg = PPOConfig()
    fn = ratio_fn_for(AggregationConfig())
    _, alone = ppo_loss(batch, policy, cfg, ratio_fn=fn)
    _, joint = ppo_loss(batch, policy, cfg, window_logps=window, ratio_fn=fn)
    # on-policy alone: ratio 1 everywhere; the other learner's smaller ratios pull the mean below 1
    assert alone["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    expected = torch.clamp(torch.exp(window[0] - batch["behaviour_logp"]), max=1.0).mean().item()
    assert joint["ratio_mean"] == pytest.approx(expected, rel=1e-5)
    assert joint["ratio_mean"] < 0.99


def test_prepare_batch_gae_and_minibatches():
    cfg = PPOConfig(gamma=0.9, gae_lambda=0.8)
    T, N = 3, 2
    frag = {
        "obs": np.zeros((T, N, 4), np.float32), "actions": np.zeros((T, N), np.int64),
        "rewards": np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]),
        "terminated": np.array([[0, 0], [1, 0], [0, 0]], bool),
        "truncated": np.array([[1, 0], [0, 0], [0, 0]], bool),
        "behaviour_logp": np.full((T, N), math.log(0.5)),
        "values": np.array([[0.5, 0.0], [1.0, 0.0], [1.5, 0.0]]),
        "final_values": np.array([[4.0, 0.0], [0.0, 0.0], [0.0, 0.0]]),
        "last_value": np.array([2.0, 1.0]),
    }
    batch = prepare_batch([frag, frag], cfg)
    assert set(batch) == {"obs", "actions", "behaviour_logp", "values", "advantages", "returns"}
    assert batch["obs"].shape == (2 * T * N, 4)
    a1 = 1 + 0.72 * 1.9
    expected = torch.tensor([4.1, 1 + 0.72 * a1, 1.0, a1, 3.3, 1.9])  # rows t*N + n
    torch.testing.assert_close(batch["advantages"][:6].float(), expected)
    torch.testing.assert_close(batch["returns"][:6], expected + batch["values"][:6])
    with pytest.raises(ValueError, match="last_value"):
        prepare_batch({k: v for k, v in frag.items() if k != "last_value"}, cfg)
    seen = torch.cat([mb["advantages"] for mb in minibatches(batch, 5, torch.Generator().manual_seed(0))])
    assert sorted(seen.tolist()) == sorted(batch["advantages"].tolist())


def test_prepare_batch_recomputes_values_with_learner_policy():
    torch.manual_seed(3)
    policy = ActorCritic(OBS, spaces.Discrete(2), MODEL)
    T, N = 4, 3
    obs = torch.rand(T, N, 4)
    last_obs = torch.rand(N, 4)
    zeros = torch.zeros(T, N)
    frag = {"obs": obs, "actions": torch.zeros(T, N, dtype=torch.long), "rewards": torch.ones(T, N),
            "terminated": zeros.bool(), "truncated": zeros.bool(), "behaviour_logp": zeros,
            "values": zeros, "final_values": zeros, "last_value": torch.zeros(N), "last_obs": last_obs}
    cfg = PPOConfig(gamma=0.5, gae_lambda=1.0)
    batch = prepare_batch(frag, cfg, policy=policy)
    with torch.no_grad():
        v = policy.value(obs.reshape(-1, 4))
        last = policy.value(last_obs)
    torch.testing.assert_close(batch["values"], v)
    # lambda = 1, no dones: the return of the last row is r + gamma V(last_obs)
    torch.testing.assert_close(batch["returns"][-N:], 1.0 + 0.5 * last)


def test_ppo_algorithm_adapts_kl_coeff_on_the_parameter_side_and_publishes_it_in_the_weights():
    from hpcrl.algos import make_algorithm

    cfg = PPOConfig(kl_coeff=0.2, kl_target=0.01, minibatch_size=4, train_batch_size=8, num_sgd_iter=3)
    algo = make_algorithm(cfg, MODEL, AggregationConfig(is_truncation=False))
    parameter = algo.make_model(OBS, spaces.Discrete(2))
    learner = algo.make_model(OBS, spaces.Discrete(2))
    optimizer = algo.make_optimizer(parameter)
    trained = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    assert trained == parameter.flat.num_params - 1  # the coefficient travels in the buffer, untrained
    assert algo.end_round(parameter, {"kl": 0.05}) == {}  # changed in place, nothing for the runtime to act on
    assert float(parameter.constants["kl_coeff"]) == pytest.approx(0.3)  # kl > 2 target: x1.5
    algo.end_round(parameter, {"kl": 0.001})
    assert float(parameter.constants["kl_coeff"]) == pytest.approx(0.15)  # kl < target/2: x0.5
    algo.end_round(parameter, {"kl": math.nan})
    assert float(parameter.constants["kl_coeff"]) == pytest.approx(0.15)
    learner.flat.load_(parameter.flat.params)  # what a learner reads from the weight board
    assert float(learner.constants["kl_coeff"]) == pytest.approx(0.15)
    assert len(list(algo.minibatches({"advantages": torch.zeros(8)}, torch.Generator()))) == 3 * 2
    off = make_algorithm(PPOConfig(kl_coeff=0.0), MODEL, AggregationConfig())
    model = off.make_model(OBS, spaces.Discrete(2))
    assert off.uses_window and off.end_round(model, {"kl": 1.0}) == {} and float(model.constants["kl_coeff"]) == 0.0


def test_end_round_may_return_only_what_the_parameter_rank_acts_on():
    from hpcrl.algos import make_algorithm
    from hpcrl.algos.base import round_changes

    algo = make_algorithm(PPOConfig(), MODEL, AggregationConfig())
    assert round_changes(algo, None) == {} and round_changes(algo, {"active_actors": 2}) == {"active_actors": 2}
    with pytest.raises(ValueError, match=r"^ppo.end_round returned kl_coeff; it may return only active_actors") as e:
        round_changes(algo, {"kl_coeff": 0.3})
    assert "\n" not in str(e.value)


def test_prepare_batch_recomputes_each_fragments_values_from_one_forward():
    torch.manual_seed(4)
    policy = ActorCritic(OBS, spaces.Discrete(2), MODEL)
    cfg = PPOConfig(gamma=0.5, gae_lambda=1.0)

    def fragment(T, N, with_last_obs):
        zeros = torch.zeros(T, N)
        f = {"obs": torch.rand(T, N, 4), "actions": torch.zeros(T, N, dtype=torch.long), "rewards": torch.ones(T, N),
             "terminated": zeros.bool(), "truncated": zeros.bool(), "behaviour_logp": zeros,
             "values": torch.full((T, N), 7.0), "final_values": zeros, "last_value": torch.full((N,), 9.0)}
        if with_last_obs:
            f["last_obs"] = torch.rand(N, 4)
        return f

    # shapes differ; the middle one has no last_obs and keeps the actor's values
    frags = [fragment(4, 3, True), fragment(2, 5, False), fragment(3, 2, True)]
    batch = prepare_batch(frags, cfg, policy=policy)
    one_by_one = [prepare_batch(f, cfg, policy=policy) for f in frags]
    for k in batch:
        torch.testing.assert_close(batch[k], torch.cat([b[k] for b in one_by_one]))
    torch.testing.assert_close(one_by_one[1]["values"], torch.full((10,), 7.0))
    with torch.no_grad():
        torch.testing.assert_close(one_by_one[2]["values"], policy.value(frags[2]["obs"].reshape(-1, 4)))
        torch.testing.assert_close(one_by_one[2]["returns"][-2:], 1.0 + 0.5 * policy.value(frags[2]["last_obs"]))


def test_a_whole_batch_minibatch_is_the_batch_itself():
    batch = {"advantages": torch.arange(6.0), "obs": torch.rand(6, 4)}
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    (mb,) = list(minibatches(batch, 6, g))
    assert all(mb[k] is batch[k] for k in batch)  # no gather, no copy: a CUDA graph copies it in once
    assert torch.equal(g.get_state(), state)  # and no shuffle drawn
    assert len(list(minibatches(batch, 4, g))) == 2
