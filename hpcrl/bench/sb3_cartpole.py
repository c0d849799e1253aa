"""The default job vs Stable-Baselines3's RL Zoo PPO on CartPole-v1: env steps and wall-clock to 475.

Both sides train CartPole-v1 until the mean return of the last 20 episodes reaches 475 (the
default job's stop rule), once per seed, in this script, one after the other on the same
machine. The hpcrl side is ``hpcrl run`` with no config (4 MPI ranks; ``--runner serial`` to
compare the one-process runner); the SB3 side is ``python -c`` running RL Zoo's tuned CartPole
PPO (8 envs x 32 steps, batch 256, 20 epochs, gamma 0.98, lambda 0.8, lr and clip range falling
linearly from 1e-3 and 0.2 over 1e5 steps), each in its own process. Reported per side: seeds
that reached 475, env steps to it, training seconds (hpcrl: the record's last round end; SB3:
``learn()``), process seconds (command start to exit, start-up included), and the ratios.

    hpcrl bench sb3-cartpole [--seeds 5] [--runner mpi|serial] [--max-steps 150000] [-o KEY=VALUE ...]

Needs ``pip install 'hpcrl[bench]'`` (stable-baselines3) for the SB3 side.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The SB3 side as one `python -c` program: RL Zoo's hyperparameters for CartPole-v1 (ppo.yml).
SB3_PROGRAM = """
import json, sys, time, collections
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

seed, target, window, max_steps = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
linear = lambda start: (lambda remaining: remaining * start)

class StopAtTarget(BaseCallback):
    def __init__(self):
        super().__init__()
        self.returns = collections.deque(maxlen=window)
        self.reached = False
    def _on_step(self):
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(info["episode"]["r"])
        self.reached = len(self.returns) == window and sum(self.returns) / window >= target
        return not self.reached

env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
            ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed, device="cpu")
stop = StopAtTarget()
start = time.monotonic()
model.learn(total_timesteps=max_steps, callback=stop)
print(json.dumps({"reached": stop.reached, "env_steps": int(model.num_timesteps),
                  "train_seconds": time.monotonic() - start}))
"""


def run_sb3(seed: int, max_steps: int) -> dict:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", SB3_PROGRAM, str(seed), "475", "20", str(max_steps)],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"SB3 seed {seed} failed: {out.stderr.strip().splitlines()[-1:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {**result, "process_seconds": time.monotonic() - start}


def run_hpcrl(seed: int, max_steps: int, runner: str, run_dir: Path, extra: list[str] = ()) -> dict:
    from hpcrl.io import read_table

    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "hpcrl.cli", "run", "--runner", runner, "-o", f"env.seed={seed}",
                          "-o", f"stop.total_env_steps={max_steps}", "-o", f"io.run_dir={run_dir}",
                          *[a for o in extra for a in ("-o", o)]],
                         capture_output=True, text=True, timeout=3600)
    process_seconds = time.monotonic() - start
    if out.returncode != 0:
        raise RuntimeError(f"hpcrl run seed {seed} failed (exit {out.returncode}): {out.stderr.strip()[-300:]}")
    rounds = read_table(run_dir / "run.h5", "rounds")
    return {"reached": "stop.target_return" in out.stdout, "env_steps": int(rounds["env_steps_total"][-1]),
            "train_seconds": float(rounds["start"][-1] + rounds["duration"][-1]),
            "process_seconds": process_seconds}


def describe(results: list[dict]) -> str:
    ok = [r for r in results if r["reached"]]
    if not ok:
        return f"0/{len(results)}"

    def mean_sd(key: str, fmt: str) -> str:
        values = [r[key] for r in ok]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):{fmt}} +- {sd:{fmt}}"

    return (f"{len(ok)}/{len(results)}  steps {mean_sd('env_steps', '.0f')}  train s {mean_sd('train_seconds', '.1f')}"
            f"  process s {mean_sd('process_seconds', '.1f')}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench sb3-cartpole", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--runner", choices=["mpi", "serial"], default="mpi")
    p.add_argument("--max-steps", type=int, default=150_000, help="give up on a seed after this many env steps")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for the hpcrl side (e.g. learners.push=update)")
    args = p.parse_args(argv)
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        print("hpcrl bench sb3-cartpole: needs stable-baselines3: pip install 'hpcrl[bench]'", file=sys.stderr)
        return 2

    print(f"# CartPole-v1 to a mean of 475 over 20 episodes; {args.seeds} seeds; hpcrl runner {args.runner}"
          + "".join(f" -o {o}" for o in args.overrides))
    print(f"{'seed':>4} {'side':6} {'reached':>7} {'env steps':>10} {'train s':>8} {'process s':>10}")
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            for side, results, run in (("hpcrl", ours, lambda: run_hpcrl(seed, args.max_steps, args.runner,
                                                                         Path(tmp) / f"seed{seed}", args.overrides)),
                                       ("sb3", theirs, lambda: run_sb3(seed, args.max_steps))):
                r = run()
                results.append(r)
                print(f"{seed:>4} {side:6} {str(r['reached']):>7} {r['env_steps']:>10} {r['train_seconds']:>8.1f} "
                      f"{r['process_seconds']:>10.1f}", flush=True)
    print(f"\nhpcrl: {describe(ours)}\nsb3:   {describe(theirs)}")
    under_40k = sum(r["reached"] and r["env_steps"] < 40_000 for r in ours)
    print(f"hpcrl seeds at 475 in fewer than 40K env steps: {under_40k}/{len(ours)}")
    both = [(a, b) for a, b in zip(ours, theirs) if a["reached"] and b["reached"]]
    if both:
        for key in ("train_seconds", "process_seconds"):
            ratio = statistics.mean(a[key] for a, _ in both) / statistics.mean(b[key] for _, b in both)
            print(f"hpcrl / sb3 {key.replace('_', ' ')}: {ratio:.2f}x (seeds both reached)")
    return 0
