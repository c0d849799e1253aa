"""Batched classic control: env steps/s and rollout+training steps/s vs instances, against Gymnasium.

For each env and instance count N (10 ... 100K on CPU, ... 1M on a GPU) it measures, in the
same process and interleaved (median of ``--repeats`` rounds):

- hpcrl env steps/s: ``step`` of the batched env with random actions (autoreset included);
- Gymnasium's own vectorised env where Gymnasium ships one (CartPole-v1:
  ``gym.make_vec(..., vectorization_mode="vector_entry_point")``) and ``SyncVectorEnv``, as
  ratios hpcrl / Gymnasium;
- rollout+training steps/s: HA2C (discrete actions) or HDDPG (continuous) as configured in
  ``hpcrl/configs/*_ha2c.yaml`` / ``pendulum_hddpg.yaml`` (fragment_length x N steps per update).

    hpcrl bench classic-control [--envs cartpole,acrobot] [--counts 10,100,...] [--device auto]
                                [--threads 1] [--seconds 0.5] [--repeats 3] [--no-training]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Callable

import gymnasium as gym
import torch

from hpcrl.config import load_config
from hpcrl.envs.classic import Acrobot, CartPole, MountainCar, MountainCarContinuous, Pendulum
from hpcrl.envs.classic.base import resolve_device

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ENVS = {  # name: (batched class, Gymnasium id, training config)
    "cartpole": (CartPole, "CartPole-v1", "cartpole_ha2c.yaml"),
    "acrobot": (Acrobot, "Acrobot-v1", "acrobot_ha2c.yaml"),
    "pendulum": (Pendulum, "Pendulum-v1", "pendulum_hddpg.yaml"),
    "mountaincar": (MountainCar, "MountainCar-v0", "cartpole_ha2c.yaml"),
    "mountaincar-continuous": (MountainCarContinuous, "MountainCarContinuous-v0", "pendulum_hddpg.yaml"),
}
CPU_COUNTS = [10, 100, 1_000, 10_000, 100_000]
GPU_COUNTS = CPU_COUNTS + [1_000_000]


def steps_per_second(step: Callable[[], object], per_call: int, seconds: float, sync: Callable[[], None]) -> float:
    """Calls ``step`` for about ``seconds`` (at least twice, after one warm-up call)."""
    step()
    sync()
    calls, start = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - start < seconds:
        step()
        calls += 1
    sync()
    return calls * per_call / (time.perf_counter() - start)


def _cycle(items: list) -> Callable[[], object]:
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % len(items)
        return items[state["i"]]
    return nxt


def hpcrl_env_step(cls, n: int, device: torch.device) -> Callable[[], object]:
    env = cls(num_envs=n, device=device)
    env.reset(seed=0)
    space = env.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        actions = [torch.randint(0, int(space.n), (n,), device=device) for _ in range(8)]
    else:
        actions = [torch.empty(n, *space.shape, device=device).uniform_(float(space.low[0]), float(space.high[0]))
                   for _ in range(8)]
    nxt = _cycle(actions)
    return lambda: env.step(nxt())


def gym_step(env: gym.vector.VectorEnv, n: int) -> Callable[[], object]:
    env.reset(seed=0)
    nxt = _cycle([env.action_space.sample() for _ in range(8)])
    return lambda: env.step(nxt())


def training_step(env_name: str, n: int, device: torch.device):
    """(callable doing one algorithm iteration, env steps per call, description)."""
    from hpcrl.algos.rollout import EpisodeLog
    from hpcrl.runtime.runners.fused import FusedLoop

    cls, _, config = ENVS[env_name]
    cfg = load_config(CONFIGS / config)
    env = cls(num_envs=n, device=device, desync_episodes=True)
    loop = FusedLoop(cfg, env, device)
    T = cfg.actors.fragment_length
    episodes = EpisodeLog(T, n, device)
    box = {"obs": env.reset(seed=0)[0]}

    def iteration():
        box["obs"], _ = loop.iteration(box["obs"], episodes)
        episodes.rows = 0  # discard the episode log (no host fetch while timing)
    return iteration, T * n, f"{cfg.algo.name} ({config})"


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}K"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.1f}x"


def verdict(ours: float | None, baseline: float | None, factor: float) -> str:
    if ours is None or baseline is None:
        return "not measured"
    return "ok" if ours >= factor * baseline else f"BELOW {factor:g}x"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench classic-control", description=__doc__.splitlines()[0])
    p.add_argument("--envs", default=",".join(ENVS), help=f"comma-separated subset of {', '.join(ENVS)}")
    p.add_argument("--counts", help="comma-separated instance counts (default 10..100K on CPU, ..1M on GPU)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: no waiting on a busy second core)")
    p.add_argument("--seconds", type=float, default=0.5, help="seconds per measurement")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--sync-max", type=int, default=100_000, help="largest N for SyncVectorEnv (one Python env each)")
    p.add_argument("--no-training", action="store_true", help="env steps only")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    counts = [int(c) for c in args.counts.split(",")] if args.counts else (
        GPU_COUNTS if device.type == "cuda" else CPU_COUNTS)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    names = [e.strip() for e in args.envs.split(",") if e.strip()]
    unknown = [e for e in names if e not in ENVS]
    if unknown:
        p.error(f"unknown env {unknown[0]!r}; allowed: {', '.join(ENVS)}")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} torch thread(s)"
    print(f"# hpcrl batched classic control on {device} ({where}); medians of {args.repeats} interleaved rounds "
          f"of {args.seconds} s; Gymnasium {gym.__version__} (numpy, 1 core)")
    verdicts = []
    for name in names:
        cls, gym_id, _ = ENVS[name]
        has_vector = gym.spec(gym_id).vector_entry_point is not None
        print(f"\n## {gym_id}")
        print(f"{'instances':>10} {'hpcrl':>10} {'gym vector':>11} {'ratio':>7} {'SyncVecEnv':>11} {'ratio':>8} "
              f"{'hpcrl+train':>12}")
        for n in counts:
            ours_fn = hpcrl_env_step(cls, n, device)
            vec_fn = (gym_step(gym.make_vec(gym_id, num_envs=n, vectorization_mode="vector_entry_point"), n)
                      if has_vector else None)
            sync_fn = gym_step(gym.make_vec(gym_id, num_envs=n, vectorization_mode="sync"), n) \
                if n <= args.sync_max else None
            train = None if args.no_training else training_step(name, n, device)
            rates: dict[str, list[float]] = {"ours": [], "vec": [], "sync": [], "train": []}
            for r in range(args.repeats):
                rates["ours"].append(steps_per_second(ours_fn, n, args.seconds, sync))
                if vec_fn:
                    rates["vec"].append(steps_per_second(vec_fn, n, args.seconds, lambda: None))
                if sync_fn and r == 0:  # slow and steady: one round
                    rates["sync"].append(steps_per_second(sync_fn, n, args.seconds, lambda: None))
                if train:
                    rates["train"].append(steps_per_second(train[0], train[1], args.seconds, sync))
            med = {k: statistics.median(v) if v else None for k, v in rates.items()}
            print(f"{n:>10} {fmt(med['ours']):>10} {fmt(med['vec']):>11} {ratio(med['ours'], med['vec']):>7} "
                  f"{fmt(med['sync']):>11} {ratio(med['ours'], med['sync']):>8} {fmt(med['train']):>12}", flush=True)
            if name == "cartpole" and n in (10_000, 100_000):
                verdicts.append((n, med["ours"], med["vec"], med["sync"], med["train"]))
            del ours_fn, vec_fn, sync_fn, train
        if train_desc := (None if args.no_training else training_step(name, 10, device)[2]):
            print(f"hpcrl+train: {train_desc}, rollout+update steps/s")
    for n, ours, vec, syn, train in verdicts:
        print(f"CartPole N={n}: hpcrl/gym-vector {ratio(ours, vec)} ({verdict(ours, vec, 1)}), "
              f"hpcrl/SyncVectorEnv {ratio(ours, syn)} ({verdict(ours, syn, 50)})")
        if device.type == "cuda" and n == 100_000:
            # seed 003's figures on one A100 at 100K instances
            print(f"CartPole N={n} on {where}: {fmt(ours)} env steps/s ({verdict(ours, 80.4e6, 1)} vs 80.4M), "
                  f"{fmt(train)} env+training steps/s ({verdict(train, 34.3e6, 1)} vs 34.3M, seed 003 on one A100)")
    return 0
