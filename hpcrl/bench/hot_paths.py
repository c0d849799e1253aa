"""The actor's and the learner's hot paths of a git revision against this checkout's, in one process, in turns.

The old side is the revision's own ``models.py``, ``algos/ppo.py`` and ``runtime/roles/sampler.py`` (read with
``git show``, loaded as modules of their own beside this checkout's); both sides build the config's model from the
same seed and time, interleaved for ``--rounds`` rounds (old first in even rounds, new first in odd ones, so a
shared machine's load falls on both): the policy's ``act`` at an actor's batch, the sampler's fragment per env step
(env included), the observation normalisation, and one minibatch gradient of the config's size. CPU seconds
(``time.process_time``), one thread; the ratio old / new is the speed-up.

    hpcrl bench hot-paths [CONFIG] --against REV [--rounds 10]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = {"models": "hpcrl/models.py", "ppo": "hpcrl/algos/ppo.py", "sampler": "hpcrl/runtime/roles/sampler.py"}


def old_module(rev: str, path: str, name: str) -> types.ModuleType:
    """``path`` as it is at git revision ``rev``, loaded as module ``name`` (its imports: this checkout's)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True,
                         check=True).stdout
    mod = types.ModuleType(name)
    mod.__file__ = f"{rev}:{path}"
    sys.modules[name] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


class _Acting:
    """What the sampler calls (``algo.act``, ``algo.act_numpy``, ``algo.value``): the model's own; a revision's
    model without ``act_numpy`` (before hpcrl/inference.py) has its ``act`` converted, as its sampler did."""

    @staticmethod
    def act(model, obs):
        return model.act(obs)

    @staticmethod
    def act_numpy(model, obs):
        if hasattr(model, "act_numpy"):
            return model.act_numpy(obs)
        return tuple(t.cpu().numpy() for t in model.act(obs))

    @staticmethod
    def value(model, obs):
        return model.value(obs)


def cases(config: str | None, rev: str) -> tuple[dict, int]:
    """{name: (old callable, new callable, calls per timing)} and the env steps one sampler call makes."""
    import torch

    import hpcrl.algos.ppo as new_ppo
    import hpcrl.models as new_models
    from hpcrl.config import load_config
    from hpcrl.runtime.roles import sampler as new_sampler

    old = {k: old_module(rev, path, f"hpcrl_at_{k}") for k, path in FILES.items()}
    new = {"models": new_models, "ppo": new_ppo, "sampler": new_sampler}
    cfg = load_config(config, [])
    info = new_sampler.describe_env(cfg.env)
    sides = {}
    for side, mods in (("old", old), ("new", new)):
        torch.manual_seed(cfg.env.seed)
        model = mods["models"].ActorCritic(info.observation_space, info.action_space, cfg.model,
                                           constants={"kl_coeff": cfg.algo.kl_coeff})
        model.sampling_generator = torch.Generator().manual_seed(1)
        sides[side] = (mods, model, mods["sampler"].VectorSampler(cfg.env, 0, cfg.algo.gamma))
    T = 64
    frag, _ = sides["new"][2].sample(_Acting, sides["new"][1], T, 0, 0)
    batch = new_ppo.prepare_batch(frag, cfg.algo, policy=sides["new"][1])
    mb = {k: v[:cfg.algo.minibatch_size] for k, v in batch.items()}

    def of(side: str) -> dict:
        mods, model, sampler = sides[side]
        return {
            "policy act (an actor's batch)": lambda: _Acting.act_numpy(model, sampler.obs),
            "sampler, per env step (env included)": lambda: sampler.sample(_Acting, model, T, 0, 0),
            "observation normalisation": lambda: sampler._norm_obs(sampler.raw_obs, True),
            "minibatch gradient": lambda: mods["ppo"].compute_gradient(
                mb, model, cfg.algo, kl_coeff=model.constants["kl_coeff"], vf_clip=cfg.algo.vf_clip),
        }

    o, n = of("old"), of("new")
    calls = {"policy act (an actor's batch)": 200, "sampler, per env step (env included)": 1,
             "observation normalisation": 200, "minibatch gradient": 20}
    return {k: (o[k], n[k], calls[k]) for k in o}, T * sides["new"][2].num_envs


def measure(config: str | None, rev: str, rounds: int) -> dict[str, tuple[float, float]]:
    """{case: (old, new) CPU microseconds per call (per env step for the sampler)}."""
    import torch

    torch.set_num_threads(1)
    table, steps = cases(config, rev)
    total = {k: [0.0, 0.0] for k in table}
    for r in range(rounds):
        for k, (fo, fn, calls) in table.items():
            for i, f in ((0, fo), (1, fn)) if r % 2 == 0 else ((1, fn), (0, fo)):
                t0 = time.process_time()
                for _ in range(calls):
                    f()
                total[k][i] += (time.process_time() - t0) / calls
    per = {k: (steps if k.startswith("sampler") else 1) for k in table}
    return {k: (1e6 * o / rounds / per[k], 1e6 * n / rounds / per[k]) for k, (o, n) in total.items()}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench hot-paths", description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="config file (default: the default job)")
    p.add_argument("--against", required=True, metavar="REV", help="the git revision of the old side")
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    args = p.parse_args(argv)
    res = measure(args.config, args.against, args.rounds)
    print(f"{args.config or '(default job)'}: old = {args.against}, new = this checkout; CPU us, one thread, "
          f"{args.rounds} rounds in turns")
    print(f"{'part':<40} {'old us':>9} {'new us':>9} {'old/new':>8}")
    for k, (o, n) in res.items():
        print(f"{k:<40} {o:>9.1f} {n:>9.1f} {o / n:>8.2f}")
    return 0
