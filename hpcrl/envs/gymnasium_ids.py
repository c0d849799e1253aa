"""hpcrl's env ids in Gymnasium's registry, so ``gym.make("hpcrl/Lorenz-v0")`` and ``gym.make_vec`` work.

:func:`register_with_gymnasium` runs when Gymnasium is imported after ``import hpcrl`` or was
before it (:mod:`hpcrl.gymnasium_hook`). It only records entry-point strings: no env module is
imported until an env is made.

What each kind of hpcrl id becomes in Gymnasium:

- ``gym`` (Lorenz, LES, OpenFOAM, Atari): ``entry_point``; ``gym.make`` and ``gym.make_vec``
  (sync / async) work as for any Gymnasium env;
- ``batched`` (``hpcrl/CartPole-v1`` ...): ``vector_entry_point``; ``gym.make_vec(id, num_envs=N)``
  builds the tensor env (observations are torch tensors; ``device=`` as a kwarg); ``gym.make``
  raises one line saying to use ``make_vec``;
- ``parallel`` (PettingZoo, multi-agent): not a Gymnasium env; ``gym.make`` raises one line saying
  to use ``hpcrl.envs.make``.
"""
from __future__ import annotations

from hpcrl.envs.registry import hpcrl_env_ids, spec


class NotAGymnasiumEnv(ValueError):
    """gym.make on an hpcrl id that is a vector env or a PettingZoo env (one line: what to call instead)."""


def _refuse(env_id: str, kind: str):
    def entry_point(**kwargs):
        if kind == "batched":
            raise NotAGymnasiumEnv(f"{env_id} is a batched vector env (N tensor instances): use "
                                   f"gymnasium.make_vec({env_id!r}, num_envs=N), not gymnasium.make")
        raise NotAGymnasiumEnv(f"{env_id} is a multi-agent PettingZoo ParallelEnv, not a Gymnasium env: use "
                               f"hpcrl.envs.make({env_id!r})")
    entry_point.__name__ = f"not_a_gymnasium_env_{kind}"
    return entry_point


def register_with_gymnasium() -> None:
    """Add every hpcrl id to ``gymnasium.registry`` (ids already there are left alone)."""
    import gymnasium

    for env_id in hpcrl_env_ids():
        if env_id in gymnasium.registry:
            continue
        s = spec(env_id)
        if s.kind == "gym":
            gymnasium.register(env_id, entry_point=s.entry_point)
        elif s.kind == "batched":
            gymnasium.register(env_id, entry_point=_refuse(env_id, "batched"), vector_entry_point=s.entry_point)
        else:
            gymnasium.register(env_id, entry_point=_refuse(env_id, "parallel"))
