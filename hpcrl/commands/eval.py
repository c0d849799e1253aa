"""`hpcrl eval RUN_DIR`: play a run's checkpointed policy for N episodes and print mean/std return and length.

The policy acts greedily (as a run's evaluation episodes) or, with ``--sampled``, samples as training
does, through the run's env, observation normalisation and action mapping (:mod:`hpcrl.policy`).
``--video DIR`` records every episode as an mp4 (every frame; Gymnasium envs).
A parallel (PettingZoo) env's episodes are reported for all agents and per policy group.
"""
from __future__ import annotations

import argparse

import numpy as np

from hpcrl.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (config.yaml, checkpoints/)")
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="a checkpoint file (default: the run's newest intact one in RUN_DIR/checkpoints)")
    parser.add_argument("--episodes", type=int, default=10, metavar="N",
                        help="episodes, one per env copy, played together (default 10)")
    parser.add_argument("--sampled", action="store_true",
                        help="sample actions as training does (default: the greedy action, as evaluation episodes)")
    parser.add_argument("--seed", type=int, metavar="S",
                        help="episode i starts from seed S + i (default: the run's eval.seed)")
    parser.add_argument("--video", metavar="DIR",
                        help="record each episode as an mp4 in DIR (Gymnasium envs; MuJoCo through MUJOCO_GL)")


def main(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        raise ConfigError(f"--episodes {args.episodes}: at least 1")
    # a line at once, then one per phase: torch's import, the checkpoint and the episodes (with video, the
    # longest part) take seconds each
    print(f"hpcrl eval: loading the checkpoint of {args.run_dir}", flush=True)
    from hpcrl.policy.load import load_policy, read_run_config
    from hpcrl.policy.play import play, prepare_rendering

    if args.video:  # before the first env of the run renders: MUJOCO_GL is read once per process
        prepare_rendering(read_run_config(args.run_dir).env.id)
    policy = load_policy(args.run_dir, args.checkpoint)
    seed = policy.cfg.eval.seed if args.seed is None else args.seed
    lines = report(policy, args, seed, None)
    print(lines[0] + (f"; recording videos in {args.video}" if args.video else ""), flush=True)
    result = play(policy, args.episodes, sampled=args.sampled, seed=seed, video_dir=args.video)
    for line in report(policy, args, seed, result)[1:]:
        print(line)
    return 0


def _stats(x: np.ndarray, fmt: str) -> str:
    """Mean and std (two decimals), min and max in ``fmt``."""
    return f"mean {x.mean():.2f}  std {x.std():.2f}  (min {x.min():{fmt}}, max {x.max():{fmt}})"


def report(policy, args, seed: int, result) -> list[str]:
    """The lines ``hpcrl eval`` prints: what is played, then return and length (per policy group for MARL);
    the first only while ``result`` is None (before the episodes)."""
    cfg, steps = policy.cfg, policy.state.get("env_steps")
    agents = policy.agents
    mode = "sampled" if args.sampled else "greedy"
    env = f"{cfg.env.id}" + (f" ({len(agents)} agents)" if agents else "")
    trained = f", {steps:,} env steps" if isinstance(steps, (int, np.integer)) else ""
    norm = "" if policy.normalizer_actor is None else f", obs statistics of actor {policy.normalizer_actor}"
    lines = [f"hpcrl eval: {policy.run_dir}: {env}, {cfg.algo.name}, checkpoint version {policy.version}{trained}"
             f"{norm}; {args.episodes} {mode} episode{'s' if args.episodes > 1 else ''}, seeds {seed}.."
             f"{seed + args.episodes - 1}"]
    if result is None:
        return lines
    width = len("return per agent") if agents else len("return")
    lines.append(f"  {'return per agent' if agents else 'return':<{width}}  {_stats(result.returns, '.2f')}")
    lines.append(f"  {'length':<{width}}  {_stats(result.lengths, 'd')}")
    if agents:
        A = len(agents)
        agent_of = np.arange(result.returns.size) % A  # instance k * A + j is agent j of copy k
        policy_of = policy.policy_of()
        groups = {}
        for j, name in enumerate(agents):
            groups.setdefault(policy_of[j] if policy_of else name, []).append(j)
        for key, members in groups.items():
            label = f"policy {key} ({', '.join(agents[j] for j in members)})" if policy_of else f"agent {key}"
            rows = np.isin(agent_of, members)
            lines.append(f"  {label}: return {_stats(result.returns[rows], '.2f')}")
    if result.videos:
        lines.append(f"  videos  {len(result.videos)} mp4 in {args.video} ({result.videos[0].name}, ...)")
    return lines
