"""Evaluation episodes: the newest policy acting greedily on env copies of its own (``eval.*``).

The parameter rank requests an evaluation every ``eval.every_rounds`` rounds (control word
EVAL = the rounds ended); the last actor rank sees the request between two fragments, loads
the newest weights and runs one episode on each of its ``eval.episodes`` evaluation copies
with ``algo.greedy`` (no exploration), through its own observation normalisation and action
mapping; the returns go to ``run.h5``'s ``eval_episodes`` table and never into the training
episodes, the stop rule or the env-step count. Evaluation k seeds copy i with
``eval.seed + k * eval.episodes + i``, so runs are reproducible and no two evaluations replay
the same start states.
"""
from __future__ import annotations

import numpy as np

from hpcrl.runtime.messages import EvalEpisode
from hpcrl.runtime.roles.env_backends import make_backend

MAX_EPISODE_STEPS = 1_000_000
"""An evaluation episode longer than this means the env has no time limit: raise, do not hang."""


class Evaluator:
    """``episodes`` greedy episodes per :meth:`run`, one per evaluation env copy."""

    def __init__(self, env_cfg, eval_cfg, sampler) -> None:
        self.backend = make_backend(env_cfg, count=eval_cfg.episodes)
        self.sampler = sampler  # the training envs' observation normalisation and action mapping
        self.seed, self.episodes = eval_cfg.seed, eval_cfg.episodes
        self.done_evaluations = 0

    def run(self, algo, model) -> list[EvalEpisode]:
        """One episode on every copy (a parallel env copy: one per agent); rows env_index, return, length."""
        b, sampler = self.backend, self.sampler
        raw = b.reset(self.seed + self.done_evaluations * self.episodes)
        self.done_evaluations += 1
        N = b.num_envs
        returns, lengths = np.zeros(N), np.zeros(N, dtype=np.int64)
        running = np.ones(N, dtype=bool)
        for _ in range(MAX_EPISODE_STEPS):
            actions = algo.greedy(model, sampler.policy_obs(raw)).cpu().numpy()
            step = b.step(sampler.env_action(actions))
            returns[running] += step.rewards[running]
            lengths[running] += 1
            running &= ~(step.terminated | step.truncated)  # copies that ended keep stepping, uncounted
            if not running.any():
                return [EvalEpisode(env_index=i, episode_return=float(returns[i]), length=int(lengths[i]))
                        for i in range(N)]
            raw = step.obs
        raise RuntimeError(f"evaluation: an episode ran past {MAX_EPISODE_STEPS} steps; the env needs a time "
                           f"limit (e.g. env.kwargs.max_episode_steps) for eval.episodes > 0")

    def close(self) -> None:
        self.backend.close()
