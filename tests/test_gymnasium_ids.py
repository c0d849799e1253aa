"""hpcrl's env ids in Gymnasium's registry: gym.make / gym.make_vec after ``import hpcrl``, in either import order."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

SCRIPT = """
import sys
{first}
import gymnasium as gym
assert "hpcrl/Lorenz-v0" in gym.registry, "not registered"
env = gym.make("hpcrl/Lorenz-v0")
obs, _ = env.reset(seed=3)
obs2, reward, *_ = env.step(env.action_space.sample())
vec = gym.make_vec("hpcrl/Lorenz-v0", num_envs=2, vectorization_mode="sync")
print(env.spec.id, obs.shape, vec.reset(seed=3)[0].shape, float(reward) in (10.0, -10.0), "gymnasium" in light)
"""


@pytest.mark.parametrize("order", ["hpcrl first", "gymnasium first"])
def test_gym_make_works_after_import_hpcrl(order):
    if order == "hpcrl first":  # import hpcrl stays light: gymnasium comes only with the user's own import
        first = "import hpcrl\nlight = set(sys.modules)"
    else:
        first = "import gymnasium\nimport hpcrl\nlight = set()"
    code = SCRIPT.format(first=first)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["hpcrl/Lorenz-v0", "(6,)", "(2,", "6)", "True", "False"]


def test_without_import_hpcrl_gymnasium_does_not_know_the_ids():
    code = "import gymnasium as gym; print('hpcrl/Lorenz-v0' in gym.registry)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "False"  # the registration above is hpcrl's doing, not a leftover


def test_every_hpcrl_id_is_registered_by_kind():
    import gymnasium as gym

    import hpcrl  # noqa: F401
    from hpcrl.envs import hpcrl_env_ids, spec

    for env_id in hpcrl_env_ids():
        s = gym.spec(env_id)
        kind = spec(env_id).kind
        assert (s.vector_entry_point is not None) == (kind == "batched"), env_id
        if kind == "gym":
            assert s.entry_point == spec(env_id).entry_point


def test_batched_ids_make_vec_and_refuse_make():
    import gymnasium as gym
    import torch

    import hpcrl  # noqa: F401
    from hpcrl.envs.gymnasium_ids import NotAGymnasiumEnv

    envs = gym.make_vec("hpcrl/CartPole-v1", num_envs=5)
    obs, _ = envs.reset(seed=0)
    assert tuple(obs.shape) == (5, 4) and isinstance(obs, torch.Tensor)
    obs, reward, terminated, truncated, _ = envs.step(torch.ones(5, dtype=torch.int64))
    assert np.allclose(np.asarray(reward), 1.0)
    with pytest.raises(NotAGymnasiumEnv, match=r"^hpcrl/CartPole-v1 is a batched vector env .* use "
                                               r"gymnasium.make_vec\('hpcrl/CartPole-v1', num_envs=N\)"):
        gym.make("hpcrl/CartPole-v1")
    with pytest.raises(NotAGymnasiumEnv, match=r"PettingZoo ParallelEnv, not a Gymnasium env: use "
                                               r"hpcrl.envs.make\('hpcrl/MPESimpleSpread-v3'\)"):
        gym.make("hpcrl/MPESimpleSpread-v3")
