"""Seconds per env step of each part of a serial run on one core, against the env alone and a plain-torch PPO update.

Runs the real serial job (every role in one process, ``torch.set_num_threads(1)``) for ``--steps`` env steps
under cProfile with a per-thread CPU-time clock (``time.thread_time``), one profile per role thread, and maps
the roles' real functions to the parts of issue 42: env step, observation normalisation, policy forward,
action sampling, fragment and record writes, TensorBoard, progress, the learner's update, the parameter
rank's apply and publish, plus "other" (what no part claims) and "setup" (process CPU outside the profiled
role loops: building the roles, imports, closing). The two limits are measured in the same process afterwards: the same Gymnasium env
stepped with random actions for the same number of steps, and a plain-torch PPO update (the config's MLP
shapes, minibatch size, epochs, Adam; no hpcrl code) per env step of its batch.

    hpcrl bench step-cost [CONFIG] [--steps 8192] [--out FILE.json] [-o KEY=VALUE ...] [--against REV [--repeat 2]]

``--against REV``: the same measurement of the code at git revision REV (a worktree of it, its own process each
time) and of this checkout, taken in turns ``--repeat`` times each (old, new, new, old, ...: a shared machine's load
falls on both), and a table of both per part (medians) with the ratio old / new. A CONFIG inside this repository
is each side's own file (a shipped config as each revision ships it); any other file is the same for both.

Profiling inflates every part alike; compare shares and ratios, not the absolute microseconds with an
unprofiled run's steps/s.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import tempfile
import threading
import time
from pathlib import Path

PARTS = ("env step", "observation normalisation", "policy forward", "action sampling",
         "fragment and record writes", "TensorBoard", "progress", "learner update",
         "parameter apply and publish", "other", "setup")
"""Every row of the table, in order (a part a config does not have shows 0 with a note)."""


def _profiled_threads(profiles: dict):
    """Wrap threading.Thread.run so each thread started inside runs under its own thread-CPU cProfile."""
    original = threading.Thread.run

    def run(self):
        prof = cProfile.Profile(time.thread_time)
        profiles[self.name] = prof
        prof.enable()
        try:
            original(self)
        finally:
            prof.disable()

    return original, run


def _stats(prof: cProfile.Profile) -> dict:
    prof.create_stats()
    return pstats.Stats(prof).stats  # (file, line, func) -> (cc, nc, tt, ct, callers)


def _total(stats: dict) -> float:
    return sum(v[2] for v in stats.values())


def _ct_from_outside(stats: dict, match, outside) -> float:
    """Inclusive seconds of functions matching ``match`` counted only on calls from callers where ``outside``
    holds (so nested calls of one part are not counted twice)."""
    total = 0.0
    for key, (_cc, _nc, _tt, _ct, callers) in stats.items():
        if not match(key):
            continue
        for caller, cstats in callers.items():
            if outside(caller):
                total += cstats[3]
    return total


def _in(*fragments):
    """Functions of files whose path holds one of ``fragments`` (module bodies, i.e. imports, excluded)."""
    return lambda key: key[2] != "<module>" and any(f in key[0].replace(os.sep, "/") for f in fragments)


def _func(file_fragment: str, *names):
    return lambda key: file_fragment in key[0].replace(os.sep, "/") and key[2] in names


def _not(pred):
    return lambda key: not pred(key)


RECORD_FILES = _in("hpcrl/io/", "hpcrl/runtime/record/rows", "hpcrl/runtime/record/run_record",
                   "hpcrl/runtime/record/scalars", "hpcrl/runtime/transport/", "h5py/")
TB_FILES = _in("tensorboard", "hpcrl/runtime/record/loggers")
PROGRESS_FILES = _in("hpcrl/runtime/record/progress")


def _actor_parts(stats: dict) -> dict:
    env = _ct_from_outside(stats, _func("hpcrl/runtime/roles/env_backends", "step"),
                           _not(_in("hpcrl/runtime/roles/env_backends")))
    norm = _ct_from_outside(stats, _func("hpcrl/runtime/roles/sampler", "_norm_obs", "_scale_rewards"),
                            _func("hpcrl/runtime/roles/sampler", "sample"))
    policy = _ct_from_outside(stats, _func("hpcrl/models", "act", "act_numpy", "value"), _not(_in("hpcrl/models")))
    forward = (_ct_from_outside(stats, _func("torch/nn/modules/module", "_wrapped_call_impl"), _in("hpcrl/models"))
               + _ct_from_outside(stats, _func("hpcrl/models", "run_mlp"), _in("hpcrl/models"))  # the fast path's layers
               + _ct_from_outside(stats, _func("hpcrl/inference", "run_numpy_mlp"), _in("hpcrl/inference")))  # numpy's
    sampling = max(policy - forward, 0.0) + _ct_from_outside(
        stats, _func("hpcrl/runtime/roles/sampler", "env_action"), _func("hpcrl/runtime/roles/sampler", "sample"))
    writes = _ct_from_outside(stats, RECORD_FILES, _not(RECORD_FILES))
    tb = _ct_from_outside(stats, TB_FILES, _not(TB_FILES))
    progress = _ct_from_outside(stats, PROGRESS_FILES, _not(PROGRESS_FILES))
    parts = {"env step": env, "observation normalisation": norm, "policy forward": forward,
             "action sampling": sampling, "fragment and record writes": writes, "TensorBoard": tb,
             "progress": progress}
    parts["other"] = max(_total(stats) - sum(parts.values()), 0.0)
    return parts


def _parameter_parts(stats: dict) -> dict:
    tb = _ct_from_outside(stats, TB_FILES, _not(TB_FILES))
    progress = _ct_from_outside(stats, PROGRESS_FILES, _not(PROGRESS_FILES))
    writes = _ct_from_outside(stats, RECORD_FILES, _not(RECORD_FILES))
    apply = max(_total(stats) - tb - progress - writes, 0.0)
    return {"TensorBoard": tb, "progress": progress, "fragment and record writes": writes,
            "parameter apply and publish": apply}


def profile_run(config: str | None, steps: int, overrides: list[str], run_dir: Path) -> dict:
    """Run the serial job and return {part: CPU seconds}, env steps, process CPU seconds and notes."""
    import torch

    from hpcrl.config import load_config
    from hpcrl.runtime.plan import make_plan
    from hpcrl.runtime.runners import serial

    torch.set_num_threads(1)
    cfg = load_config(config, [f"stop.total_env_steps={steps}", "stop.target_return=null",
                               f"io.run_dir={run_dir}", *overrides])
    plan = make_plan(cfg)
    from hpcrl.runtime.roles.parameter import ParameterRank

    profiles: dict[str, cProfile.Profile] = {}
    original, wrapped = _profiled_threads(profiles)
    parameter_run = ParameterRank.run
    main = cProfile.Profile(time.thread_time)

    def profiled_parameter_run(self):
        main.enable()
        try:
            parameter_run(self)
        finally:
            main.disable()

    threading.Thread.run, ParameterRank.run = wrapped, profiled_parameter_run
    cpu0 = time.process_time()
    try:
        result = serial.run(plan, run_dir, progress="plain")
    finally:
        threading.Thread.run, ParameterRank.run = original, parameter_run
    cpu = time.process_time() - cpu0
    if result.exit_code != 0:
        raise RuntimeError(f"serial run failed: {result.message}\n{result.details}")
    parts = dict.fromkeys(PARTS, 0.0)
    for name, prof in profiles.items():
        stats = _stats(prof)
        if "-actor-" in name:
            for k, v in _actor_parts(stats).items():
                parts[k] += v
        elif "-learner-" in name:
            parts["learner update"] += _total(stats)
        else:
            parts["other"] += _total(stats)
    for k, v in _parameter_parts(_stats(main)).items():
        parts[k] += v
    profiled = sum(parts.values())
    parts["setup"] = max(cpu - profiled, 0.0)  # the main thread outside the parameter rank's loop
    env_steps = int(result.summary.get("env_steps") or result.summary.get("env_steps_total") or steps)
    notes = {}
    if parts["TensorBoard"] == 0.0:
        notes["TensorBoard"] = "off in this config (io.loggers has no tensorboard)"
    return {"parts": parts, "env_steps": env_steps, "process_cpu_seconds": cpu, "profiled_seconds": profiled, "notes": notes,
            "env_id": cfg.env.id, "cfg": cfg}


def env_alone(env_id: str, steps: int, seed: int = 0) -> float:
    """Seconds per step of the Gymnasium env stepped with random actions (resets included)."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    t0 = time.process_time()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    seconds = time.process_time() - t0
    env.close()
    return seconds / steps


def plain_torch_update(obs_dim: int, act_dim: int, discrete: bool, hidden: list[int], batch: int,
                       minibatch: int, epochs: int, lr: float, updates: int = 2) -> float:
    """Seconds per env step of a PPO update written in plain torch: separate tanh MLPs, clipped surrogate,
    value loss, Adam, grad-norm clip; ``epochs`` passes of shuffled minibatches over a batch of ``batch``."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    def mlp(out: int) -> nn.Sequential:
        layers, last = [], obs_dim
        for h in hidden:
            layers += [nn.Linear(last, h), nn.Tanh()]
            last = h
        return nn.Sequential(*layers, nn.Linear(last, out))

    pi, vf = mlp(act_dim), mlp(1)
    log_std = nn.Parameter(torch.zeros(act_dim))
    params = [*pi.parameters(), *vf.parameters(), *([] if discrete else [log_std])]
    opt = torch.optim.Adam(params, lr=lr, eps=1e-5)
    obs = torch.randn(batch, obs_dim)
    actions = torch.randint(act_dim, (batch,)) if discrete else torch.randn(batch, act_dim)
    old_logp, adv, ret = -torch.rand(batch), torch.randn(batch), torch.randn(batch)
    t0 = time.process_time()
    for _ in range(updates):
        for _ in range(epochs):
            for idx in torch.randperm(batch).split(minibatch):
                out = pi(obs[idx])
                if discrete:
                    dist = torch.distributions.Categorical(logits=out)
                    logp = dist.log_prob(actions[idx])
                else:
                    dist = torch.distributions.Normal(out, log_std.exp())
                    logp = dist.log_prob(actions[idx]).sum(-1)
                ratio = (logp - old_logp[idx]).exp()
                a = adv[idx]
                surrogate = torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a).mean()
                loss = -surrogate + 0.5 * (vf(obs[idx]).squeeze(-1) - ret[idx]).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                opt.step()
    return (time.process_time() - t0) / (updates * batch)


def measure(config: str | None, steps: int, overrides: list[str]) -> dict:
    import gymnasium as gym
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="hpcrl-step-cost-") as tmp:
        run = profile_run(config, steps, overrides, Path(tmp) / "run")
    cfg = run.pop("cfg")
    n = run["env_steps"]
    space = gym.make(cfg.env.id)
    obs_dim = int(np.prod(space.observation_space.shape))
    discrete = isinstance(space.action_space, gym.spaces.Discrete)
    act_dim = int(space.action_space.n) if discrete else int(np.prod(space.action_space.shape))
    space.close()
    algo = cfg.algo
    out = {"config": config or "(default job)", "env_id": cfg.env.id, "env_steps": n,
           "parts_us": {k: 1e6 * v / n for k, v in run["parts"].items()},
           "process_cpu_us": 1e6 * run["process_cpu_seconds"] / n,
           "profiled_us": 1e6 * run["profiled_seconds"] / n, "notes": run["notes"],
           "env_alone_us": 1e6 * env_alone(cfg.env.id, steps),
           "plain_torch_update_us": 1e6 * plain_torch_update(
               obs_dim, act_dim, discrete, list(cfg.model.hidden_sizes), int(algo.train_batch_size),
               int(algo.minibatch_size), int(algo.num_sgd_iter), float(algo.lr))}
    out["total_us"] = sum(out["parts_us"].values())
    out["loop_us"] = out["total_us"] - out["parts_us"]["setup"]
    out["hpcrl_over_env_alone"] = out["loop_us"] / out["env_alone_us"]
    out["update_over_plain_torch"] = out["parts_us"]["learner update"] / out["plain_torch_update_us"]
    return out


def table(res: dict) -> str:
    total = res["total_us"]
    lines = [f"{res['env_id']}: {res['env_steps']} env steps, serial runner, one thread",
             f"{'part':<30} {'us/step':>10} {'share':>7}"]
    for k, v in res["parts_us"].items():
        note = f"  ({res['notes'][k]})" if k in res["notes"] else ""
        lines.append(f"{k:<30} {v:>10.1f} {100 * v / total:>6.1f}%{note}")
    lines += [f"{'total (sum of parts)':<30} {total:>10.1f}",
              f"{'process CPU (measured)':<30} {res['process_cpu_us']:>10.1f}",
              f"{'per step without setup':<30} {res['loop_us']:>10.1f}",
              f"{'limit: env alone':<30} {res['env_alone_us']:>10.1f}",
              f"{'limit: plain-torch PPO update':<30} {res['plain_torch_update_us']:>10.1f}",
              f"hpcrl / env alone: {res['hpcrl_over_env_alone']:.1f}x; "
              f"update part / plain-torch update: {res['update_over_plain_torch']:.2f}x"]
    return "\n".join(lines)


def _one_run(python: str, root: Path, config: str | None, steps: int, overrides: list[str], out: Path) -> dict:
    """One ``hpcrl bench step-cost`` of the code under ``root`` in its own process; its JSON results."""
    argv = [python, "-m", "hpcrl", "bench", "step-cost", *([config] if config else []), "--steps", str(steps),
            "--out", str(out)] + [w for o in overrides for w in ("-o", o)]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    subprocess.run(argv, cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def against(rev: str, config: str | None, steps: int, overrides: list[str], repeat: int) -> dict:
    """Medians of ``repeat`` measurements each of revision ``rev`` (a temporary git worktree) and of this checkout,
    taken in turns; {"old": res, "new": res, "runs": {"old": [...], "new": [...]}}."""
    import statistics
    import sys

    here = Path(__file__).resolve().parents[2]
    config = Path(config).resolve() if config else None
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="hpcrl-step-cost-ab-") as tmp:
        tree = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(here), "worktree", "add", "--detach", str(tree), rev], check=True,
                       capture_output=True)
        configs = {"new": config, "old": config}
        if config is not None and config.is_relative_to(here):  # the revision's own copy of a shipped config
            configs["old"] = tree / config.relative_to(here)
        try:
            for i in range(repeat):
                for side in (("old", "new") if i % 2 == 0 else ("new", "old")):
                    root = tree if side == "old" else here
                    cfg = str(configs[side]) if configs[side] is not None else None
                    runs[side].append(_one_run(sys.executable, root, cfg, steps, overrides,
                                               Path(tmp) / f"{side}-{i}.json"))
        finally:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(tree)], capture_output=True)

    def median(side: str) -> dict:
        res = dict(runs[side][0])
        res["parts_us"] = {k: statistics.median(r["parts_us"][k] for r in runs[side]) for k in res["parts_us"]}
        for k in ("process_cpu_us", "total_us", "loop_us", "env_alone_us", "plain_torch_update_us"):
            res[k] = statistics.median(r[k] for r in runs[side])
        return res

    return {"rev": rev, "old": median("old"), "new": median("new"), "runs": runs}


def ratio_table(ab: dict) -> str:
    """Both sides per part (medians) and old / new."""
    old, new = ab["old"], ab["new"]
    lines = [f"{new['env_id']}: {new['env_steps']} env steps, serial runner, one thread; {len(ab['runs']['new'])} runs "
             f"each, in turns; old = {ab['rev']}",
             f"{'part':<30} {'old us/step':>12} {'new us/step':>12} {'old/new':>8}"]
    rows = [(k, old["parts_us"][k], new["parts_us"][k]) for k in new["parts_us"]]
    rows += [("per step without setup", old["loop_us"], new["loop_us"]),
             ("limit: env alone", old["env_alone_us"], new["env_alone_us"]),
             ("limit: plain-torch PPO update", old["plain_torch_update_us"], new["plain_torch_update_us"])]
    for k, o, n in rows:
        ratio = f"{o / n:>8.2f}" if n > 0 else f"{'-':>8}"
        lines.append(f"{k:<30} {o:>12.1f} {n:>12.1f} {ratio}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench step-cost", description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="config file (default: the default job)")
    p.add_argument("--steps", type=int, default=8192, help="env steps of the profiled run (default 8192)")
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("-o", dest="overrides", action="append", default=[], help="KEY=VALUE config override")
    p.add_argument("--against", metavar="REV", help="also measure git revision REV, in turns with this checkout")
    p.add_argument("--repeat", type=int, default=2, help="with --against: measurements of each side (default 2)")
    args = p.parse_args(argv)
    if args.against:
        ab = against(args.against, args.config, args.steps, args.overrides, args.repeat)
        print(ratio_table(ab))
        if args.out:
            Path(args.out).write_text(json.dumps(ab, indent=1))
        return 0
    res = measure(args.config, args.steps, args.overrides)
    print(table(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0
