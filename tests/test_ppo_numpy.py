"""PPO's hand-written numpy gradient (hpcrl/algos/ppo_numpy.py) against autograd on the same loss, branch by branch."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.algos import ppo_numpy
from hpcrl.algos.ppo import GRADIENT_STATS, autograd_gradient_and_stats, gradient_and_stats, ratio_fn_for
from hpcrl.algos.ppo_config import PPOConfig
from hpcrl.config import AggregationConfig, ModelConfig
from hpcrl.models import ActorCritic

OBS = spaces.Box(-1.0, 1.0, shape=(11,), dtype=np.float32)
SPACES = {"box": spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32), "discrete": spaces.Discrete(4)}


def model_of(kind: str, activation: str = "tanh", seed: int = 0) -> ActorCritic:
    torch.manual_seed(seed)
    model = ActorCritic(OBS, SPACES[kind], ModelConfig(hidden_sizes=[64, 32], activation=activation),
                        constants={"kl_coeff": 0.0})
    with torch.no_grad():  # a policy away from its init, so the ratios spread over and past the clip range
        model.flat.params.add_(0.2 * torch.randn(model.flat.num_params))
    return model


def batch_of(model: ActorCritic, rows: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """A minibatch whose behaviour log-probs are the policy's own plus noise (ratios on both sides of the clip)."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(rows, 11, generator=g)
    if model.discrete:
        actions = torch.randint(0, 4, (rows,), generator=g)
    else:
        actions = torch.randn(rows, 3, generator=g)
    with torch.no_grad():
        logp, _, value = model.evaluate(obs, actions)
    return {"obs": obs, "actions": actions, "behaviour_logp": logp + 0.3 * torch.randn(rows, generator=g),
            "values": value + 0.5 * torch.randn(rows, generator=g), "advantages": torch.randn(rows, generator=g),
            "returns": torch.randn(rows, generator=g)}


def both(model, batch, cfg, kl_coeff=0.0, vf_clip=None):
    by_hand = ppo_numpy.for_model(model)
    assert by_hand is not None
    grad, stats = by_hand.gradient(batch, cfg, kl_coeff, vf_clip)
    got = grad.clone(), stats.clone()
    grad, stats = autograd_gradient_and_stats(batch, model, cfg, kl_coeff=kl_coeff, vf_clip=vf_clip)
    return got, (grad.clone(), stats.clone())


CASES = {
    "plain": ({}, {}),
    "entropy bonus": ({"entropy_coeff": 0.05}, {}),
    "KL penalty": ({}, {"kl_coeff": 0.7}),
    "value clipping": ({}, {"vf_clip": 0.2}),
    "raw advantages": ({"normalize_advantages": False}, {}),
    "no norm clip": ({"max_grad_norm": 1e6}, {}),
    "everything": ({"entropy_coeff": 0.01, "clip": 0.1}, {"kl_coeff": 0.2, "vf_clip": 0.5}),
}


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("kind", sorted(SPACES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_numpy_gradient_is_autograds_within_float_rounding(case, kind, activation):
    cfg_kw, call_kw = CASES[case]
    cfg = PPOConfig(**cfg_kw)
    model = model_of(kind, activation)
    batch = batch_of(model, 256)
    (grad, stats), (ref_grad, ref_stats) = both(model, batch, cfg, **call_kw)
    assert grad.abs().max() > 0
    np.testing.assert_allclose(grad.numpy(), ref_grad.numpy(), rtol=1e-4, atol=2e-6 * ref_grad.abs().max().item())
    np.testing.assert_allclose(stats.numpy(), ref_stats.numpy(), rtol=1e-5, atol=1e-6,
                               err_msg=str(dict(zip(GRADIENT_STATS, ref_stats.tolist()))))
    ratio = dict(zip(GRADIENT_STATS, ref_stats.tolist()))
    assert 0 < ratio["clip_fraction"] < 1, "the batch should put ratios on both sides of the clip range"


def test_a_minibatch_view_and_every_parameter_get_their_gradient():
    """A shuffled minibatch is a strided view of the batch; the log-std and every layer get a gradient slice."""
    model = model_of("box")
    batch = batch_of(model, 512)
    view = {k: v[1::2] for k, v in batch.items()}
    cfg = PPOConfig(max_grad_norm=1e6)
    (grad, _), (ref, _) = both(model, view, cfg)
    np.testing.assert_allclose(grad.numpy(), ref.numpy(), rtol=1e-4, atol=1e-6 * ref.abs().max().item())
    for name, p in model.named_parameters():
        part = ref[model.flat.slice_of(p)]
        if p.requires_grad:
            assert part.abs().max() > 0, name
        else:
            assert (grad[model.flat.slice_of(p)] == 0).all(), name  # the KL constant never trains


def test_gradient_and_stats_takes_the_numpy_path_only_where_it_applies():
    model = model_of("discrete")
    batch = batch_of(model, 64)
    cfg = PPOConfig()
    by_hand, _ = both(model, batch, cfg)
    grad, _ = gradient_and_stats(batch, model, cfg)
    assert torch.equal(grad, by_hand[0])  # the plain-ratio case is the numpy gradient, bit for bit
    truncation = ratio_fn_for(AggregationConfig(policy="stellaris", is_truncation=True, rho=1.0))
    grad, _ = gradient_and_stats(batch, model, cfg, ratio_fn=truncation)
    ref, _ = autograd_gradient_and_stats(batch, model, cfg, ratio_fn=truncation)
    assert torch.equal(grad, ref)
    cnn = ActorCritic(spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8), spaces.Discrete(2),
                      ModelConfig(torso="cnn"))
    assert ppo_numpy.for_model(cnn) is None


def test_the_numpy_gradient_follows_the_weights_loaded_into_the_flat_buffer():
    model, other = model_of("discrete", seed=0), model_of("discrete", seed=1)
    batch = batch_of(model, 128)
    cfg = PPOConfig(max_grad_norm=1e6)
    before = ppo_numpy.for_model(model).gradient(batch, cfg, 0.0, None)[0].clone()
    model.flat.load_(other.flat.params)
    (grad, _), (ref, _) = both(model, batch, cfg)
    np.testing.assert_allclose(grad.numpy(), ref.numpy(), rtol=1e-4, atol=1e-6 * ref.abs().max().item())
    assert (grad - before).abs().max() > 1e-3
