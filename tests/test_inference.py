"""The actor's numpy policy call (hpcrl/inference.py) against ActorCritic.act, and who uses it."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.algos.base import Algorithm
from hpcrl.config import ModelConfig
from hpcrl.inference import NumpyActorCritic
from hpcrl.models import ActorCritic

OBS = spaces.Box(-1.0, 1.0, shape=(11,), dtype=np.float32)
CFG = ModelConfig(hidden_sizes=[64, 64], activation="tanh")
SPACES = {"box": spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32), "discrete": spaces.Discrete(4)}


def trained(action_space, activation="tanh", seed=0) -> ActorCritic:
    torch.manual_seed(seed)
    model = ActorCritic(OBS, action_space, ModelConfig(hidden_sizes=[64, 64], activation=activation))
    with torch.no_grad():
        model.flat.params.add_(0.3 * torch.randn(model.flat.num_params))  # a trained policy, not the init's
    return model


def both(model, obs, seed=3):
    """(torch act as numpy, numpy act) on the same draws: each from a generator seeded alike."""
    model.sampling_generator = torch.Generator().manual_seed(seed)
    expected = [t.numpy() for t in model.act(obs)]
    model.sampling_generator = torch.Generator().manual_seed(seed)
    return expected, model.act_numpy(obs)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("kind", sorted(SPACES))
def test_the_numpy_act_gives_acts_numbers_for_the_same_draws(kind, activation):
    model = trained(SPACES[kind], activation)
    assert model._numpy is not None
    rng = np.random.default_rng(0)
    for rows in (1, 8):
        for _ in range(50):
            obs = rng.standard_normal((rows, 11)).astype(np.float32)
            expected, got = both(model, obs)
            for name, e, g in zip(("action", "log-prob", "value"), expected, got):
                assert g.shape == e.shape and g.dtype == e.dtype, name
                if kind == "discrete" and name == "action":
                    assert np.array_equal(g, e)  # the same uniform draws pick the same actions
                else:
                    np.testing.assert_allclose(g, e, rtol=0, atol=2e-5, err_msg=name)


def test_the_numpy_act_follows_the_weights_loaded_into_the_flat_buffer():
    """An actor loads each version into model.flat in place: the numpy views see it with no rebuild (and a copy of
    the weights taken at construction would be caught here)."""
    model, other = trained(SPACES["box"], seed=0), trained(SPACES["box"], seed=1)
    obs = np.random.default_rng(1).standard_normal((1, 11)).astype(np.float32)
    before = both(model, obs)[1]
    model.flat.load_(other.flat.params)
    expected, got = both(model, obs)
    np.testing.assert_allclose(got[0], expected[0], rtol=0, atol=2e-5)
    assert np.abs(got[0] - before[0]).max() > 1e-2


def test_networks_numpy_cannot_run_fall_back_to_act_exactly():
    model = trained(SPACES["box"])
    model._numpy = None  # as for a CNN, uint8 frames or GPU weights
    obs = np.random.default_rng(2).standard_normal((8, 11)).astype(np.float32)
    expected, got = both(model, obs)
    for e, g in zip(expected, got):
        assert np.array_equal(e, g)
    image = ActorCritic(spaces.Box(0, 255, (4, 84, 84), np.uint8), SPACES["discrete"],
                        ModelConfig(hidden_sizes=[16], activation="relu", torso="cnn"))
    assert image._numpy is None and NumpyActorCritic.of(image) is None


def test_an_algorithm_with_an_act_of_its_own_keeps_it():
    class Noisy(Algorithm):
        def act(self, model, obs):
            a, logp, v = model.act(obs)
            return a + 100.0, logp, v

    model = trained(SPACES["box"])
    obs = np.zeros((1, 11), np.float32)
    assert np.all(Noisy(None, CFG).act_numpy(model, obs)[0] > 50)
    assert np.all(np.abs(Algorithm(None, CFG).act_numpy(model, obs)[0]) < 50)  # the model's numpy act
