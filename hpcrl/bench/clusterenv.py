"""ClusterEnv vs Gymnasium's AsyncVectorEnv: env steps/s on a cheap and an expensive env, and PPO's time to 475.

Part 1, per env id: the same ``--num-envs`` copies stepped ``--steps`` times with random actions
through SyncVectorEnv (in process), AsyncVectorEnv (one process per env, pipes + shared memory;
the baseline) and ClusterEnv (``--workers`` MPI ranks started with mpiexec, each stepping its envs
in one batch); env steps/s, ratios to AsyncVectorEnv, and ClusterEnv's overhead per vector step
over stepping the same envs in process (its transport cost). Part 2 (``--learning``): the
CleanRL-style example (examples/cleanrl_ppo_clusterenv.py) to a mean return of 475 on CartPole-v1
with ``--env-backend gym`` and ``cluster``, same seed, same script. Part 3 (on unless ``--cleanrl-steps 0``):
the unmodified-CleanRL case, the example's whole loop with torch's default threads against SyncVectorEnv
(:mod:`hpcrl.bench.clusterenv_cleanrl`).

    hpcrl bench clusterenv [--envs CartPole-v1,Hopper-v5] [--num-envs 8] [--workers 2] [--steps 2000] [--learning]
                           [--cleanrl-steps 16384] [--cleanrl-repeats 3]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cleanrl_ppo_clusterenv.py"


def steps_per_second(make, num_envs: int, steps: int, seed: int = 0) -> tuple[float, float]:
    """(env steps/s, microseconds per vector step) over ``steps`` random-action steps after a warm-up."""
    env = make()
    try:
        env.reset(seed=seed)
        env.action_space.seed(seed)
        actions = [env.action_space.sample() for _ in range(min(steps, 256))]
        for i in range(20):
            env.step(actions[i % len(actions)])
        t = time.perf_counter()
        for i in range(steps):
            env.step(actions[i % len(actions)])
        dt = time.perf_counter() - t
    finally:
        env.close()
    return steps * num_envs / dt, dt / steps * 1e6


def throughput(env_id: str, num_envs: int, workers: int, steps: int,
               waits: tuple[str, ...] = ("socket",)) -> dict[str, tuple[float, float]]:
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    import hpcrl

    same = {"autoreset_mode": AutoresetMode.SAME_STEP}
    rows = {
        "sync (in process)": steps_per_second(
            lambda: gym.make_vec(env_id, num_envs, vectorization_mode="sync", vector_kwargs=same), num_envs, steps),
        "AsyncVectorEnv": steps_per_second(
            lambda: gym.make_vec(env_id, num_envs, vectorization_mode="async", vector_kwargs=same), num_envs, steps),
    }
    for wait in waits:
        rows[f"ClusterEnv ({workers} w, {wait})"] = steps_per_second(
            lambda: hpcrl.ClusterEnv(env_id, num_envs, workers=workers, wait=wait), num_envs, steps)
    return rows


def time_to_target(backend: str, workers: int, seed: int, timeout: float) -> tuple[bool, int, float, float]:
    """(reached, env steps, seconds to the target, wall s of the whole script) of the example."""
    cmd = [sys.executable, str(EXAMPLE), "--env-backend", backend, "--workers", str(workers), "--seed", str(seed)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.perf_counter() - t
    m = re.search(r"RESULT .*reached=(\w+) steps=(\d+) seconds=([\d.]+)", out.stdout)
    if not m:
        raise RuntimeError(f"example failed ({backend}): {(out.stderr or out.stdout)[-400:]}")
    return m[1] == "True", int(m[2]), float(m[3]), wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench clusterenv", description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="CartPole-v1,Hopper-v5", help="comma-separated env ids (a cheap and an expensive one)")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=2000, help="vector steps per measurement")
    p.add_argument("--wait", default="socket,poll", help="ClusterEnv wait modes to measure (socket: doorbell; poll)")
    p.add_argument("--learning", action="store_true", help="also time the PPO example to 475 (minutes)")
    p.add_argument("--cleanrl-steps", type=int, default=16384,
                   help="env steps per run of the unmodified-CleanRL loop (0: skip that part)")
    p.add_argument("--cleanrl-repeats", type=int, default=3, help="runs per case of the unmodified-CleanRL loop")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per example run")
    args = p.parse_args(argv)

    print(f"# env steps/s, {args.num_envs} envs, {args.steps} vector steps, {os.cpu_count()} cores "
          f"(load average {os.getloadavg()[0]:.1f})")
    print(f"{'env':<14} {'backend':<26} {'env steps/s':>12} {'us/vector step':>15} {'vs Async':>9}")
    for env_id in [e for e in args.envs.split(",") if e]:
        rows = throughput(env_id, args.num_envs, args.workers, args.steps, tuple(args.wait.split(",")))
        base = rows["AsyncVectorEnv"][0]
        for name, (sps, us) in rows.items():
            print(f"{env_id:<14} {name:<26} {sps:>12.0f} {us:>15.0f} {sps / base:>8.2f}x")
        for name, (_, us) in rows.items():
            if name.startswith("ClusterEnv"):
                print(f"{env_id:<14} {name}: overhead per vector step over in-process stepping "
                      f"{us - rows['sync (in process)'][1]:.0f} us")
    if args.cleanrl_steps > 0:
        from hpcrl.bench import clusterenv_cleanrl

        clusterenv_cleanrl.report(args.cleanrl_steps, args.workers, args.cleanrl_repeats, args.seed, args.timeout)
    if args.learning:
        print(f"\n# {EXAMPLE.name}: CartPole-v1 to a mean return of 475 (last 20 episodes), seed {args.seed}")
        print(f"{'backend':<10} {'reached':>8} {'env steps':>10} {'s to 475':>9} {'script s':>9} {'ratio':>6}")
        results = {b: time_to_target(b, args.workers, args.seed, args.timeout) for b in ("gym", "cluster")}
        base = results["gym"][2]
        for b, (ok, steps, secs, wall) in results.items():
            print(f"{b:<10} {str(ok):>8} {steps:>10d} {secs:>9.1f} {wall:>9.1f} {secs / base:>5.2f}x")
    return 0
