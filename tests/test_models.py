"""FlatParameters are true views; ActorCritic on Discrete and Box spaces."""
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.config import ModelConfig
from hpcrl.errors import ConfigError
from hpcrl.models import ActorCritic, FlatParameters, _inverse_cdf_draw

OBS = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
CFG = ModelConfig(hidden_sizes=[16, 16], activation="tanh")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_flat_params_are_views_of_one_buffer():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    before = [p.detach().clone() for p in net.parameters()]
    flat = FlatParameters(net)
    assert flat.num_params == 3 * 5 + 5 + 5 * 2 + 2
    torch.testing.assert_close(flat.params, torch.cat([b.flatten() for b in before]))
    x = torch.randn(7, 3)
    y0 = net(x).detach()
    flat.numpy()[:] = 0.0  # writing the buffer changes the module
    assert torch.count_nonzero(net(x)) == 0
    flat.load_(torch.cat([b.flatten() for b in before]))
    torch.testing.assert_close(net(x), y0)
    with pytest.raises(ValueError):
        flat.load_(np.zeros(3, dtype=np.float32))


def test_grads_land_in_flat_buffer():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    flat = FlatParameters(net)
    net(torch.randn(4, 3)).pow(2).sum().backward()
    expected = torch.cat([p.grad.flatten() for p in net.parameters()]).clone()
    assert torch.count_nonzero(flat.grads) > 0
    torch.testing.assert_close(flat.grads, expected)
    net.zero_grad()  # sets .grad to None: detached from the buffer
    assert not flat.grads_attached()
    flat.zero_grad()
    assert flat.grads_attached() and torch.count_nonzero(flat.grads) == 0
    net(torch.randn(4, 3)).sum().backward()
    torch.testing.assert_close(flat.grads, torch.cat([p.grad.flatten() for p in net.parameters()]))
    # an optimizer stepping the module writes into the buffer
    ptr = flat.params.data_ptr()
    torch.optim.SGD(net.parameters(), lr=0.1).step()
    assert flat.params.data_ptr() == ptr and net.weight.data_ptr() == ptr


@pytest.mark.parametrize("device", DEVICES)
def test_actor_critic_discrete(device):
    torch.manual_seed(0)
    ac = ActorCritic(OBS, spaces.Discrete(3), CFG, device=device)
    obs = np.random.default_rng(0).uniform(-1, 1, (8, 4)).astype(np.float32)
    a, logp, v = ac.act(obs)
    assert a.shape == (8,) and logp.shape == (8,) and v.shape == (8,)
    assert a.device.type == device and a.dtype == torch.int64
    logp2, ent, v2 = ac.evaluate(obs, a)
    torch.testing.assert_close(logp2, logp)
    torch.testing.assert_close(v2, v)
    assert torch.all(ent > 0)
    # output layer init gain 0.01: a near-uniform policy
    assert torch.allclose(logp, torch.full_like(logp, -np.log(3)), atol=0.05)
    assert ac.flat.num_params == sum(p.numel() for p in ac.parameters())


def test_discrete_act_and_evaluate_are_categoricals_own_numbers():
    """act/evaluate skip building a Categorical: act draws with Categorical's frequencies (never an
    action of probability 0) and returns its log-probs; evaluate gives its log-probs and entropy,
    also where a probability underflows to 0 (entropy stays finite, as Categorical's)."""
    torch.manual_seed(0)
    ac = ActorCritic(OBS, spaces.Discrete(3), CFG)
    with torch.no_grad():  # a trained-looking policy: far from uniform
        ac.pi[0][-1].weight.mul_(3e4)
    obs = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, (64, 4)), dtype=torch.float32)
    reference = torch.distributions.Categorical(logits=ac.pi(obs).detach())
    a, logp, _ = ac.act(obs)
    torch.testing.assert_close(logp, reference.log_prob(a))
    assert (reference.probs.gather(-1, a.unsqueeze(-1)) > 0).all()
    logp2, entropy, _ = ac.evaluate(obs, a)
    torch.testing.assert_close(logp2.detach(), reference.log_prob(a))
    torch.testing.assert_close(entropy.detach(), reference.entropy())
    assert torch.isfinite(entropy).all() and (reference.probs == 0).any()


def test_discrete_draws_follow_the_policy():
    """Frequencies of 40,000 draws per row within 4 standard errors of the probabilities, including
    a probability of exactly 0 (never drawn) and a near-deterministic row."""
    logits = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, -1.0], [-math.inf, 1.0, 0.0], [30.0, 0.0, 0.0]])
    log_probs = torch.log_softmax(logits, -1)
    torch.manual_seed(3)
    draws = torch.cat([_inverse_cdf_draw(log_probs) for _ in range(40_000)], dim=1)  # [4, 40000]
    freq = torch.stack([(draws == k).double().mean(1) for k in range(3)], dim=1)
    p = log_probs.exp().double()
    se = (p * (1 - p) / draws.shape[1]).sqrt()
    assert ((freq - p).abs() <= 4 * se + 1e-12).all(), (freq, p)
    assert (freq[2, 0] == 0) and (freq[3, 0] == 1)


@pytest.mark.parametrize("device", DEVICES)
def test_actor_critic_box_and_flat_roundtrip(device):
    torch.manual_seed(0)
    ac = ActorCritic(OBS, spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32), CFG, device=device)
    obs = torch.randn(5, 4)
    a, logp, _ = ac.act(obs)
    assert a.shape == (5, 2)
    logp2, ent, _ = ac.evaluate(obs, a)
    torch.testing.assert_close(logp2, logp)
    # log-std starts at 0: entropy of a unit Gaussian per dimension
    torch.testing.assert_close(ent, torch.full((5,), 2 * 0.5 * np.log(2 * np.pi * np.e), device=device, dtype=torch.float32))
    other = ActorCritic(OBS, spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32), CFG, device=device)
    other.flat.load_(ac.flat.params)
    torch.testing.assert_close(other.evaluate(obs, a)[0], logp)
    ac.evaluate(obs, a)[0].sum().backward()
    assert torch.count_nonzero(ac.flat.grads) > 0


def test_unsupported_spaces_raise_config_error():
    with pytest.raises(ConfigError, match="action space"):
        ActorCritic(OBS, spaces.MultiDiscrete([2, 2]), CFG)


def _act_difference(model: ActorCritic, obs: np.ndarray, seed: int = 3) -> float:
    """Largest |fast act - plain act| over actions, log-probs and values, each drawn from the same generator state."""
    model.sampling_generator = torch.Generator().manual_seed(seed)
    fast = model.act(obs)
    model.sampling_generator = torch.Generator().manual_seed(seed)
    plain = model.act_plain(obs)
    return max(float((f.double() - p.double()).abs().max()) for f, p in zip(fast, plain))


@pytest.mark.parametrize("action_space", [spaces.Discrete(3), spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)],
                         ids=["discrete", "box"])
def test_fast_act_is_the_plain_modules_act(action_space):
    """The actor's path (layers called directly, no distribution object) gives the plain modules' and
    torch.distributions' actions, log-probs and values for the same draws, at an actor's batch of 1 and of 8,
    through the actor's own generator and through torch's global one; a fast path on other weights is caught."""
    torch.manual_seed(0)
    model = ActorCritic(OBS, action_space, CFG)
    with torch.no_grad():
        model.flat.params.add_(0.3 * torch.randn(model.flat.num_params))  # a trained policy, not the init's
    rng = np.random.default_rng(0)
    for rows in (1, 8):
        obs = rng.standard_normal((rows, 4)).astype(np.float32)
        assert _act_difference(model, obs) <= 1e-6
        model.sampling_generator = None
        torch.manual_seed(5)
        fast = model.act(obs)
        torch.manual_seed(5)
        plain = model.act_plain(obs)
        for f, p in zip(fast, plain):
            torch.testing.assert_close(f, p, rtol=0, atol=1e-6)
    # the comparison can fail: the fast path reading another network's layers is seen at once
    torch.manual_seed(1)
    other = ActorCritic(OBS, action_space, CFG)
    model._fast = other._fast
    assert _act_difference(model, rng.standard_normal((8, 4)).astype(np.float32)) > 1e-3


def test_box_evaluate_is_the_normals_log_prob_and_entropy():
    """evaluate without the Normal object: the same log-probs, entropies and gradients as torch.distributions.Normal."""
    torch.manual_seed(0)
    model = ActorCritic(OBS, spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32), CFG)
    with torch.no_grad():
        model.log_std.add_(torch.tensor([0.4, -0.7]))
    obs, actions = torch.randn(32, 4), torch.randn(32, 2)

    def grads(fn):
        model.flat.zero_grad()
        logp, ent, v = fn()
        (logp.mean() + 0.1 * ent.mean() + v.pow(2).mean()).backward()
        return [logp, ent, v, model.flat.grads.clone()]

    def plain():
        d = torch.distributions.Normal(model.pi(obs), model.log_std.exp().expand(32, 2))
        return d.log_prob(actions).sum(-1), d.entropy().sum(-1), model.vf(obs).squeeze(-1)

    for f, p in zip(grads(lambda: model.evaluate(obs, actions)), grads(plain)):
        torch.testing.assert_close(f, p, rtol=1e-6, atol=1e-6)
