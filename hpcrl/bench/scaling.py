"""Scaling: env steps/s and gradients/s versus actor ranks and learner groups, with parallel efficiency.

For every env config and every (actors N, learner groups G) of the grid this runs a fresh
``hpcrl run CONFIG -o actors.count=N -o learners.groups=G -o learners.min_active=G`` for a fixed
step budget (no target return) and reads its run.h5: env steps/s over the sampling span (first
fragment's start to last fragment, start-up excluded), the actors' busy share, gradients/s over
the gradient span, the learner cycle by phase (``learner_cycles``: ms per gradient) and the
parameter rank's work by phase per gradient received (``parameter_load``). Parallel efficiency is the per-actor rate against the run
with the fewest actors (1 by default) at the same G. The env's per-core ceiling is measured in
this process before the runs: Gymnasium ``env.step`` on one env, and the actors' own env backend
(``env.num_envs`` envs in lock-step) with random actions, no policy. Hopper runs pipelined
(``THROUGHPUT`` below), not with the shipped config's on-policy sampling. With G groups the round is G
times the config's ``algo.train_batch_size``, so every group trains the batch one group would (the same
minibatches and gradients per env step at every G).

    hpcrl bench scaling [--envs cartpole,hopper] [--actors 1,2,4] [--groups 1,2] [--steps 30000]
                        [--hopper-steps 20000] [--oversubscribe] [-o KEY=VALUE ...]

A 16-core node: ``--actors 1,2,4,8,12 --groups 1,2,4``. Runs with more ranks than cores (1 + G + N)
need ``--oversubscribe`` (passed on to ``hpcrl run``) and are marked in the table.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ENVS = {"cartpole": CONFIGS / "cartpole.yaml", "hopper": CONFIGS / "hopper.yaml"}
# hopper.yaml is CleanRL's PPO step for step (on-policy sampling, sync admission, 64-row minibatches): actors wait
# for the learner by design, so more actors cannot go faster. The grid runs it pipelined, as a throughput job
# with gradient pushes (Stellaris'); -o overrides after these restore any of them. Each actor steps 8 envs in
# 128-step fragments (the shipped config has CleanRL's one env per actor, for learning quality), as every earlier
# scaling table did.
THROUGHPUT = {"hopper": ["actors.on_policy=false", "aggregation.policy=stellaris", "aggregation.d=0.96",
                         "learners.push=gradient", "algo.minibatch_size=256", "env.num_envs=8",
                         "actors.fragment_length=128"]}


def env_ceiling(config: Path, seconds: float = 1.5) -> dict:
    """Raw env steps/s on this core: one Gymnasium env, and the actor backend's num_envs envs (random actions)."""
    import gymnasium as gym

    from hpcrl.config import load_config
    from hpcrl.runtime.roles.env_backends import make_backend

    cfg = load_config(config)
    env = gym.make(cfg.env.id, **cfg.env.kwargs)
    env.reset(seed=0)
    actions = [env.action_space.sample() for _ in range(256)]
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
        steps += len(actions)
    single = steps / (time.perf_counter() - start)
    env.close()
    backend = make_backend(cfg.env)
    backend.reset(0)
    space = backend.action_space
    batches = [np.stack([space.sample() for _ in range(backend.num_envs)]) for _ in range(64)]
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for a in batches:
            backend.step(a)
        steps += len(batches) * backend.num_envs
    vector = steps / (time.perf_counter() - start)
    backend.close()
    return {"env_id": cfg.env.id, "num_envs": cfg.env.num_envs, "single": single, "backend": vector}


def run_point(config: Path, actors: int, groups: int, steps: int, run_dir: Path, overrides: list[str],
              oversubscribe: bool, timeout: float) -> dict:
    """One ``hpcrl run`` of the grid; its rates from run.h5."""
    sets = [f"actors.count={actors}", f"learners.groups={groups}", f"learners.min_active={groups}",
            f"stop.total_env_steps={steps}", "stop.target_return=null", "io.log_seconds=60",
            f"io.run_dir={run_dir}", *THROUGHPUT.get(config.stem, []), *overrides,
            *([f"algo.train_batch_size={groups * train_batch_size(config, overrides)}"] if groups > 1 else [])]
    cmd = [sys.executable, "-m", "hpcrl", "run", str(config), *[a for o in sets for a in ("-o", o)],
           *(["--oversubscribe"] if oversubscribe else [])]
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"{config.name} N={actors} G={groups}: hpcrl run failed ({res.returncode}):\n"
                           f"{res.stdout[-2000:]}{res.stderr[-2000:]}")
    return {"actors": actors, "groups": groups, "wall": wall, **record_rates(run_dir / "run.h5", actors)}


def one_group_config(config: Path, overrides: list[str]):
    """The config every run of ``config`` starts from (THROUGHPUT, then the user's overrides)."""
    from hpcrl.config import load_config

    return load_config(config, [*THROUGHPUT.get(config.stem, []), *overrides])


def train_batch_size(config: Path, overrides: list[str]) -> int:
    """The one-group job's ``algo.train_batch_size`` (G groups get G times it: each its batch, as one group has)."""
    return one_group_config(config, overrides).algo.train_batch_size


def learner_device(config: Path, overrides: list[str]) -> str:
    """Where the runs' learners compute: ``learners.device``, with auto resolved as the learner ranks do."""
    import torch

    learners = one_group_config(config, overrides).learners
    device = learners.device
    if device == "auto":
        device = f"cuda (auto: {torch.cuda.get_device_name()})" if torch.cuda.is_available() else "cpu (auto)"
    if device.startswith("cuda"):
        device += ", CUDA graphs" if learners.cuda_graphs else ", eager"
    return device


def record_rates(run_h5: Path, actors: int) -> dict:
    """Env steps/s, actor busy share, gradients/s, the learner cycle (mean ms per gradient by phase, from
    ``learner_cycles``) and the parameter rank's work per gradient received (ms by phase, ``parameter_load``)."""
    from hpcrl.io import read_table
    from hpcrl.runtime.record.cycle_profile import LEARNER_PHASES, PARAMETER_PHASES

    a = read_table(run_h5, "actors", ["time", "steps", "sample_seconds", "transport_wait_seconds"])
    began = a["time"] - a["sample_seconds"] - a["transport_wait_seconds"]
    span = float(a["time"].max() - began.min())
    g = read_table(run_h5, "gradients", ["time"])
    g_span = float(g["time"].max() - g["time"].min()) if g["time"].size > 1 else float("nan")
    c = read_table(run_h5, "learner_cycles", ["cycle_seconds", *(f"{p}_seconds" for p in LEARNER_PHASES)])
    cycle = {p: 1e3 * float(np.mean(c[f"{p}_seconds"])) if c["cycle_seconds"].size else float("nan")
             for p in ("cycle", *LEARNER_PHASES)}
    load = read_table(run_h5, "parameter_load", ["gradients", *(f"{p}_seconds" for p in PARAMETER_PHASES)])
    received = int(load["gradients"].sum())
    parameter = {p: 1e3 * float(load[f"{p}_seconds"].sum()) / received if received else float("nan")
                 for p in PARAMETER_PHASES}
    return {"env_steps": int(a["steps"].sum()), "steps_per_s": float(a["steps"].sum()) / span,
            "busy": float(a["sample_seconds"].sum()) / (actors * span),
            "grads": int(g["time"].size), "grads_per_s": (g["time"].size - 1) / g_span if g_span > 0 else float("nan"),
            "cycle_ms": cycle, "parameter_ms": parameter}


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench scaling", description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="cartpole,hopper", help=f"comma-separated, from {', '.join(ENVS)}")
    p.add_argument("--actors", type=ints, default=[1, 2, 4], help="actor ranks N (default 1,2,4)")
    p.add_argument("--groups", type=ints, default=[1, 2], help="learner groups G, all active (default 1,2)")
    p.add_argument("--steps", type=int, default=30_000, help="env steps per CartPole run (default 30000)")
    p.add_argument("--hopper-steps", type=int, default=20_000, help="env steps per Hopper run (default 20000)")
    p.add_argument("--oversubscribe", action="store_true", help="allow more ranks than cores (hpcrl run --oversubscribe)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take (default 900)")
    p.add_argument("--out", help="keep the run directories here (default: a temporary directory, removed)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    args = p.parse_args(argv)
    envs = [e.strip() for e in args.envs.split(",") if e.strip()]
    bad = [e for e in envs if e not in ENVS]
    if bad:
        p.error(f"unknown env(s) {', '.join(bad)}; choose from {', '.join(ENVS)}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-scaling-"))
    out.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", file=sys.stderr, flush=True)
    failed: list[str] = []
    try:
        for env in envs:
            ceiling = env_ceiling(ENVS[env])
            steps = args.steps if env == "cartpole" else args.hopper_steps
            points = []
            for G in args.groups:
                for N in args.actors:
                    print(f"{env}: {N} actor(s), {G} learner group(s), {steps} steps ...", file=sys.stderr, flush=True)
                    try:
                        points.append(run_point(ENVS[env], N, G, steps, out / f"{env}-N{N}-G{G}", args.overrides,
                                                args.oversubscribe, args.timeout))
                    except (RuntimeError, subprocess.TimeoutExpired) as e:  # the other points still count
                        failed.append(f"{env} N={N} G={G}: {str(e).strip().splitlines()[-1]}")
                        print(f"  failed: {failed[-1]}", file=sys.stderr, flush=True)
            if points:
                print_table(env, ceiling, points, cores, steps, learner_device(ENVS[env], args.overrides))
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    for line in failed:
        print(f"not measured: {line}")
    return 1 if failed else 0


def print_table(env: str, ceiling: dict, points: list[dict], cores: int, steps: int, device: str = "cpu") -> None:
    print(f"\n{env}: {ceiling['env_id']}, {steps} env steps per run, learners on {device}, {cores} cores on this "
          f"machine (load average now {os.getloadavg()[0]:.1f}). Env ceiling on "
          f"one core: gym env.step {ceiling['single']:,.0f} steps/s; actor backend ({ceiling['num_envs']} envs, "
          f"random actions, no policy) {ceiling['backend']:,.0f} steps/s")
    print(f"{'actors':>6} {'groups':>6} {'ranks':>6} {'env steps/s':>12} {'efficiency':>10} {'% of N x ceiling':>16} "
          f"{'actor busy':>10} {'grads/s':>8} {'wall s':>7}  note")
    for pt in points:
        same_g = [q for q in points if q["groups"] == pt["groups"]]
        ref = min(same_g, key=lambda q: q["actors"])
        eff = (pt["steps_per_s"] / pt["actors"]) / (ref["steps_per_s"] / ref["actors"])
        ranks = 1 + pt["groups"] + pt["actors"]
        note = f"oversubscribed ({ranks} ranks on {cores} cores)" if ranks > cores else ""
        if ref["actors"] != 1 and pt is ref:
            note = (note + "; " if note else "") + f"efficiency against N={ref['actors']}"
        ceil = 100 * pt["steps_per_s"] / (pt["actors"] * ceiling["backend"])
        print(f"{pt['actors']:>6} {pt['groups']:>6} {ranks:>6} {pt['steps_per_s']:>12,.0f} {eff:>10.2f} {ceil:>15.1f}% "
              f"{100 * pt['busy']:>9.0f}% {pt['grads_per_s']:>8.1f} {pt['wall']:>7.1f}  {note}")
    print_phases("learner cycle, mean ms per gradient by phase (learner_cycles; phases add up to cycle)",
                 points, "cycle_ms")
    print_phases("parameter rank, ms per gradient received by phase (parameter_load; idle is waiting)",
                 points, "parameter_ms")


def print_phases(title: str, points: list[dict], key: str) -> None:
    """A table of ms per phase, one row per point; phases zero at every point are left out."""
    cols = [p for p in points[0][key] if any(pt[key][p] > 5e-4 for pt in points)] if points else []
    if not cols:
        return
    print(title + ":")
    print(f"{'actors':>6} {'groups':>6} " + " ".join(f"{c:>9}" for c in cols))
    for pt in points:
        print(f"{pt['actors']:>6} {pt['groups']:>6} " + " ".join(f"{pt[key][c]:>9.3f}" for c in cols))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
