"""The unmodified-CleanRL case: the CleanRL-style example's whole loop (rollout + PPO update) in env steps/s.

CleanRL's scripts leave torch's threads alone (one OpenMP thread per core, spinning between parallel
regions), so this part runs ``examples/cleanrl_ppo_clusterenv.py`` with no ``--torch-threads`` and
with ``OMP_NUM_THREADS`` / ``OMP_WAIT_POLICY`` removed from its environment, for a fixed budget of
env steps (the return target set out of reach), on:

- ``SyncVectorEnv``: ``gym.make_vec(..., vectorization_mode="sync")`` in the training process (the baseline);
- ``ClusterEnv``: the same loop through ``hpcrl.ClusterEnv`` (``head_threads="auto"``: with its workers
  on the head's cores, the head keeps ``max(1, cores - workers)`` torch threads);
- ``ClusterEnv, head_threads=None``: torch's threads left as they are (ClusterEnv before it set them);
- ``SyncVectorEnv, 1 torch thread``: the tuned in-process reference.

Runs alternate between the backends, ``repeats`` times; the table shows each one's median.
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cleanrl_ppo_clusterenv.py"

CASES = {
    "SyncVectorEnv (unmodified)": ["--env-backend", "gym"],
    "ClusterEnv (unmodified)": ["--env-backend", "cluster"],
    "ClusterEnv, head_threads=None": ["--env-backend", "cluster", "--head-threads", "none"],
    "SyncVectorEnv, 1 torch thread": ["--env-backend", "gym", "--torch-threads", "1"],
}
BASELINE = "SyncVectorEnv (unmodified)"


def unmodified_environment() -> dict[str, str]:
    """This process's environment without the thread settings a user of CleanRL would not have made."""
    return {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}


def loop_steps_per_second(extra: list[str], steps: int, workers: int, seed: int, timeout: float) -> float:
    """Env steps/s of the example's loop over ``steps`` env steps (RESULT line: steps / seconds)."""
    cmd = [sys.executable, str(EXAMPLE), *extra, "--workers", str(workers), "--seed", str(seed),
           "--total-timesteps", str(steps), "--target-return", "1e9"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=unmodified_environment())
    m = re.search(r"RESULT .*steps=(\d+) seconds=([\d.]+)", out.stdout)
    if not m:
        raise RuntimeError(f"example failed ({' '.join(extra)}): {(out.stderr or out.stdout)[-400:]}")
    return int(m[1]) / float(m[2])


def run(steps: int, workers: int, repeats: int, seed: int, timeout: float) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(repeats):  # alternate, so a change in the machine's load hits every case alike
        for name, extra in CASES.items():
            results[name].append(loop_steps_per_second(extra, steps, workers, seed, timeout))
    return results


def report(steps: int, workers: int, repeats: int, seed: int = 1, timeout: float = 900.0) -> None:
    print(f"\n# unmodified CleanRL loop (examples/{EXAMPLE.name}, CartPole-v1, 8 envs, {workers} workers): "
          f"{steps} env steps incl. PPO updates, median of {repeats}, {os.cpu_count()} cores "
          f"(load average {os.getloadavg()[0]:.1f} at start, {time.strftime('%Y-%m-%d %H:%M')})")
    results = run(steps, workers, repeats, seed, timeout)
    base = statistics.median(results[BASELINE])
    print(f"{'case':<32} {'env steps/s':>12} {'vs SyncVectorEnv':>17}   runs")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:<32} {med:>12.0f} {med / base:>16.2f}x   {', '.join(f'{v:.0f}' for v in values)}")
    print(f"(load average {os.getloadavg()[0]:.1f} at the end)")
