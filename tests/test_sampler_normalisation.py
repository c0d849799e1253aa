"""The sampler's running statistics: a one-row update gives the general (Chan et al.) formula's numbers to the bit,
non-finite rows included; and a backend's ``Step.ended`` says whether any instance ended."""
import numpy as np
import pytest

from hpcrl.config import load_config
from hpcrl.runtime.roles.env_backends import make_backend
from hpcrl.runtime.roles.sampler import RunningMeanStd


def _general(rms: RunningMeanStd, x: np.ndarray) -> None:
    """The batch formula with n = 1 written out, as update() computes it for n > 1."""
    n = x.shape[0]
    m, v = x.mean(axis=0), x.var(axis=0)
    delta, total = m - rms.mean, rms.count + n
    rms.mean = rms.mean + delta * n / total
    rms.var = (rms.var * rms.count + v * n + delta ** 2 * rms.count * n / total) / total
    rms.count = total


@pytest.mark.parametrize("shape", [(11,), ()])
def test_one_row_update_is_the_general_formula_bit_for_bit(shape):
    rng = np.random.default_rng(3)
    fast, ref = RunningMeanStd(shape), RunningMeanStd(shape)
    for x in rng.normal(size=(3000, 1) + shape) * rng.uniform(0.1, 50) + rng.uniform(-5, 5):
        fast.update(x)
        _general(ref, x)
    assert np.array_equal(fast.mean, ref.mean) and np.array_equal(fast.var, ref.var) and fast.count == ref.count


def test_one_row_update_keeps_non_finite_as_np_var_does():
    fast, ref = RunningMeanStd((3,)), RunningMeanStd((3,))
    row = np.array([[2.0, np.inf, np.nan]])
    with np.errstate(invalid="ignore"):
        fast.update(row)
        _general(ref, row)
    np.testing.assert_array_equal(fast.mean, ref.mean)
    np.testing.assert_array_equal(fast.var, ref.var)  # inf's variance is NaN there, not inf
    assert np.isnan(fast.var[1])


@pytest.mark.parametrize("env_id", ["CartPole-v1", "hpcrl/CartPole-v1"])  # Gymnasium's envs; hpcrl's batched one
def test_step_ended_says_whether_any_instance_ended(env_id):
    cfg = load_config(None, [f"env.id={env_id}", "env.num_envs=2"])  # a constant push ends an episode in ~10 steps
    backend = make_backend(cfg.env)
    backend.reset(0)
    ended_steps = []
    for t in range(60):
        step = backend.step(np.ones(2, np.int64))
        assert step.ended == bool((step.terminated | step.truncated).any())
        if step.ended:
            ended_steps.append(t)
    assert ended_steps and len(ended_steps) < 60
    backend.close()
