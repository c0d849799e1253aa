"""A parallel env's copies stepped together (its registered ``copies``) against its PettingZoo copies, in turns.

For each hpcrl env id that registers ``copies`` (hpcrl/envs/registry.py), an actor's ``--copies`` copies are built
both ways from the same seed and stepped ``--steps`` times with the same random actions, in ``--rounds`` turns
(PettingZoo first in even rounds, the copies first in odd ones, so a shared machine's load falls on both). Prints the
CPU milliseconds (``time.process_time``) per step of all copies, the median of the rounds, and the ratio PettingZoo /
copies; and whether the two gave the same observations and rewards, bit for bit.

    hpcrl bench env-copies [--copies 8] [--steps 200] [--rounds 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _timed(backend, actions: np.ndarray, seed: int) -> tuple[float, list]:
    """CPU seconds per step over ``actions``, and each step's observations and rewards."""
    backend.reset(seed=seed)
    out = []
    t = time.process_time()
    for a in actions:
        step = backend.step(a)
        out.append((step.obs.tobytes(), step.rewards.tobytes()))
    return (time.process_time() - t) / len(actions), out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench env-copies", description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=8, help="copies of the env per actor (env.num_envs; default 8)")
    p.add_argument("--steps", type=int, default=200, help="steps per round (default 200)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each timing both (default 5)")
    args = p.parse_args(argv)
    if min(args.copies, args.steps, args.rounds) < 1:
        p.error("--copies, --steps and --rounds are 1 or more")
    from hpcrl.config import EnvConfig
    from hpcrl.envs import make
    from hpcrl.envs.registry import hpcrl_env_ids, spec
    from hpcrl.runtime.roles.env_backends import CopiesBackend, ParallelBackend, make_backend

    print(f"{'env':32s} {'copies':>6s} {'PettingZoo ms/step':>19s} {'copies ms/step':>15s} {'ratio':>7s} "
          f"{'same':>5s}", flush=True)
    for env_id in hpcrl_env_ids():
        if spec(env_id).load_copies() is None:
            continue
        together = make_backend(EnvConfig(id=env_id, num_envs=args.copies))
        assert isinstance(together, CopiesBackend)
        apart = ParallelBackend([make(env_id) for _ in range(args.copies)], env_id)
        rng = np.random.default_rng(0)
        slow, fast, same = [], [], True
        for r in range(args.rounds):
            actions = rng.integers(0, apart.action_space.n, (args.steps, apart.num_envs))
            order = [(apart, slow), (together, fast)]
            results = {}
            for backend, times in (order if r % 2 == 0 else order[::-1]):
                seconds, record = _timed(backend, actions, seed=r)
                times.append(seconds)
                results[id(backend)] = record
            same &= results[id(apart)] == results[id(together)]
        s, f = float(np.median(slow)) * 1e3, float(np.median(fast)) * 1e3
        print(f"{env_id:32s} {args.copies:6d} {s:19.3f} {f:15.3f} {s / f:7.1f} {'yes' if same else 'NO':>5s}",
              flush=True)
        if not same:
            return 1
    return 0
