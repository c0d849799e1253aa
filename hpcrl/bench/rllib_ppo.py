"""RLlib's PPO on a Stellaris workload, with the Stellaris artifact's RLlib settings: the baseline its files call rllib.

The artifact (IntelliSys-Lab/Stellaris-SC24, ``evaluation/experiment/config.py`` and ``env.py``) runs RLlib's
synchronous PPO with 16 rollout workers of one env, 256-step fragments, a 4,096-step train batch taken as one
minibatch for 10 passes (``sgd_minibatch_size = train_batch_size``, ``num_sgd_iter`` 10), and otherwise RLlib's PPO
defaults (lr 5e-5, gamma 0.99, lambda 1.0, clip 0.3, vf_clip 10, kl_coeff 0.2, a 256 x 256 tanh network). This
bench sets exactly those on RLlib's current API stack (``minibatch_size``, ``num_epochs``; the artifact's Ray
predates them). It runs ``--rounds`` rounds, or as many as the workload's ``stop.total_env_steps`` holds, and
evaluates after each round as hpcrl's runs do (``eval.episodes`` greedy episodes: the Gaussian's mean, on env copies
seeded ``eval.seed + k * episodes + i``), in this process, so both sides are evaluated alike.

Per seed it writes ``OUT/NAME-sSEED/`` (``--name``, default rllib) (a seed whose folder holds ``rounds.jsonl`` is done and skipped; one
stopped part way starts again):

- ``rounds.jsonl``: per round, its env steps (RLlib's lifetime count), seconds since the start, and the evaluation's
  returns (``rounds.jsonl.partial`` until the seed's last round);
- the artifact's ``rllib~ENV~ppo~info.csv`` and ``~timeline.csv`` (ENV as the artifact names it: Hopper-v3), with
  the round's evaluation returns and wall-clock; cost and staleness columns are 0 (RLlib's PPO has neither).

Needs ``ray[rllib]``, which is not an hpcrl dependency:
``pip install "ray[rllib]"`` in a venv that has hpcrl (``hpcrl bench rllib-ppo`` says so when it is missing).

    hpcrl bench rllib-ppo [--config stellaris/hopper_ppo.yaml] [--seeds 0] [--rounds N] [--env-runners 16]
                          [--out DIR] [--name rllib]
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

from hpcrl.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ARTIFACT_ENVS = {"Hopper": "Hopper-v3", "Humanoid": "Humanoid-v3", "Walker2d": "Walker2d-v3"}
INFO_COLUMNS = ("round_id", "duration", "num_rollout_workers", "num_envs_per_worker", "episodes_this_iter",
                "learner_time", "actor_time", "eval_reward_max", "eval_reward_mean", "eval_reward_min",
                "eval_reward_std", "staleness_max", "staleness_mean", "staleness_min", "staleness_std",
                "learner_loss", "cost", "serverless_bound")


def artifact_config(cfg, env_runners: int, seed: int):
    """RLlib's PPOConfig as the artifact sets it, for hpcrl config ``cfg``'s env, fragment and batch."""
    from ray.rllib.algorithms.ppo import PPOConfig

    batch = cfg.algo.train_batch_size
    return (PPOConfig()
            .environment(env=cfg.env.id)
            .framework("torch")
            .env_runners(num_env_runners=env_runners, num_envs_per_env_runner=cfg.env.num_envs,
                         rollout_fragment_length=batch // (env_runners * cfg.env.num_envs),
                         batch_mode="truncate_episodes")
            .training(train_batch_size_per_learner=batch, minibatch_size=batch, num_epochs=10)
            .debugging(seed=seed, log_level="ERROR"))


def greedy_returns(module, env_id: str, episodes: int, seed: int) -> list[float]:
    """``episodes`` episodes of the module's greedy policy (its Gaussian's mean), one env copy each, seeded
    ``seed + i`` (hpcrl's Evaluator protocol)."""
    import gymnasium as gym
    import torch

    out = []
    for i in range(episodes):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                dist = module.forward_inference({"obs": torch.as_tensor(obs, dtype=torch.float32)[None]})
            mean = dist["action_dist_inputs"][0, : env.action_space.shape[0]].numpy()
            obs, reward, terminated, truncated, _ = env.step(np.clip(mean, env.action_space.low, env.action_space.high))
            total += float(reward)
            done = terminated or truncated
        env.close()
        out.append(total)
    return out


def run_seed(cfg, seed: int, rounds: int, env_runners: int, out: Path, name: str = "rllib", say=print) -> Path:
    import ray

    run_dir = out / f"{name}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    env_name = ARTIFACT_ENVS.get(cfg.env.id.split("-v")[0], cfg.env.id)
    ray.init(num_cpus=max(2, env_runners + 1), include_dashboard=False, ignore_reinit_error=True,
             log_to_driver=False)
    algo = artifact_config(cfg, env_runners, seed).build_algo()
    info = [list(INFO_COLUMNS)]
    timeline = [["Wall clock time (s)", "Episodic reward"], [0, 0]]
    start = time.monotonic()
    try:
        with open(run_dir / "rounds.jsonl.partial", "w") as rows:
            for k in range(rounds):
                result = algo.train()
                seconds = time.monotonic() - start
                returns = greedy_returns(algo.get_module(), cfg.env.id, cfg.eval.episodes,
                                         cfg.eval.seed + k * cfg.eval.episodes)
                steps = int(result.get("num_env_steps_sampled_lifetime", (k + 1) * cfg.algo.train_batch_size))
                rows.write(json.dumps({"round": k + 1, "env_steps": steps, "seconds": seconds,
                                       "eval_returns": returns}) + "\n")
                rows.flush()
                r = np.asarray(returns)
                info.append([k + 1, seconds, env_runners, cfg.env.num_envs, 0, 0, 0, r.max(), r.mean(), r.min(),
                             r.std(), 0, 0, 0, 0, 0, 0, ""])
                timeline += [[seconds, x] for x in returns]
                say(f"rllib seed {seed} round {k + 1}/{rounds}: {steps:,} env steps, eval {r.mean():.1f}, "
                    f"{seconds:.0f} s")
    finally:
        algo.stop()
        ray.shutdown()
    for name, table in (("info", info), ("timeline", timeline)):
        with open(run_dir / f"rllib~{env_name}~ppo~{name}.csv", "w", newline="") as fh:
            csv.writer(fh).writerows(table)
    (run_dir / "rounds.jsonl.partial").rename(run_dir / "rounds.jsonl")  # whole: what an analysis reads
    return run_dir


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench rllib-ppo", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="stellaris/hopper_ppo.yaml", help="an hpcrl workload config (its env, "
                   "batch, budget and evaluation); default stellaris/hopper_ppo.yaml")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    p.add_argument("--rounds", type=int, help="rounds per seed (default: the config's stop.total_env_steps / batch)")
    p.add_argument("--env-runners", type=int, default=16, help="RLlib env runners (the artifact's 16)")
    p.add_argument("--out", default="rllib-ppo", help="results folder (default ./rllib-ppo)")
    p.add_argument("--name", default="rllib", help="the runs' folders are NAME-sSEED (default rllib; beside a sweep of "
                   "several configs, CONFIG-rllib, e.g. hopper-rllib)")
    args = p.parse_args(argv)
    try:
        import ray  # noqa: F401
        from ray.rllib.algorithms.ppo import PPOConfig  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"hpcrl bench rllib-ppo needs RLlib ({exc}); pip install 'ray[rllib]'") from None
    from hpcrl.config import load_config

    path = Path(args.config) if Path(args.config).is_file() else CONFIGS / args.config
    cfg = load_config(path)
    if cfg.eval.episodes < 1:
        raise ConfigError(f"{path}: eval.episodes is 0; the baseline is compared on evaluation episodes")
    rounds = args.rounds or -(-cfg.stop.total_env_steps // cfg.algo.train_batch_size)
    if rounds < 1 or args.env_runners < 1:
        p.error("--rounds and --env-runners must be at least 1")
    if cfg.algo.train_batch_size % (args.env_runners * cfg.env.num_envs):
        p.error(f"--env-runners {args.env_runners}: the batch of {cfg.algo.train_batch_size} steps must split into "
                "equal fragments")
    for seed in [int(s) for s in args.seeds.split(",")]:
        if (Path(args.out) / f"{args.name}-s{seed}" / "rounds.jsonl").is_file():
            print(f"rllib seed {seed}: done already ({Path(args.out) / f'{args.name}-s{seed}'})", flush=True)
            continue
        print(f"wrote {run_seed(cfg, seed, rounds, args.env_runners, Path(args.out), args.name)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
