"""The fused single-device loop: seed 003's setting, chosen by the serial runner (:mod:`hpcrl.runtime.runners.serial`)
when one actor and one learner group would share one device with a batched tensor env.

The actor, learner and parameter roles become one loop on ``learners.device`` with no queues and
no host copies per step, calling the same algorithm object the roles call (:mod:`hpcrl.algos.base`):
``algo.sample`` acts, the fragment (``actors.fragment_length`` steps of ``env.num_envs`` instances)
enters a device buffer of ``algo.kept_fragments`` fragments, ``algo.prepare_rollout`` builds the
batch, ``algo.update`` trains (``compute_gradient`` + ``apply``, or the paper's own order within a step).

The loop never waits for the host: every ``algo.stats_every`` iterations it fetches the episode
log and the per-iteration stats from the device (one synchronisation) and tells the run's
:class:`~hpcrl.runtime.record.run_record.RunRecord`, which writes ``run.h5``'s ``episodes``,
``updates`` and ``rounds`` rows (one round is one such window of iterations), the progress numbers
and the summary as for the roles; then it reports progress and checks the stop rule. Episode times
are those of the iteration that ended them. No per-step trajectories are written (10K instances x
millions of steps), and there are no checkpoints.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import torch

from hpcrl.algos import make_algorithm
from hpcrl.algos.ha2c import no_argument_checks
from hpcrl.algos.rollout import EpisodeLog, Rollout, collect
from hpcrl.config import RunConfig
from hpcrl.envs import registry
from hpcrl.envs.classic.base import resolve_device
from hpcrl.errors import ConfigError
from hpcrl.runtime.plan import Plan
from hpcrl.runtime.record.run_record import RunRecord
from hpcrl.runtime.record.stop_rule import StopRule
from hpcrl.runtime.runners import RunResult
from hpcrl.runtime.topology import one_process_rank_map


def make_env(cfg: RunConfig, device: torch.device, num_envs: int | None = None):
    """The batched env of cfg.env (``num_envs`` instances, default env.num_envs) on ``device``.

    ConfigError unless env.id names a batched env and env.kwargs are its keyword arguments.
    """
    spec = registry.spec(cfg.env.id)
    if spec is None or spec.kind != "batched":
        batched = [i for i in registry.hpcrl_env_ids() if registry.spec(i).kind == "batched"]
        hint = f" (did you mean hpcrl/{cfg.env.id}?)" if f"hpcrl/{cfg.env.id}" in batched else ""
        raise ConfigError(f"env.id: the fused loop needs a batched environment, got {cfg.env.id!r}{hint}; "
                          f"allowed: {', '.join(batched)}")
    try:
        return registry.make(cfg.env.id, num_envs=num_envs or cfg.env.num_envs, device=device, **cfg.env.kwargs)
    except TypeError as exc:  # an unknown or misspelt keyword argument
        raise ConfigError(f"env.kwargs: {exc} ({cfg.env.id})") from None


class FusedLoop:
    """One actor, one learner and the parameter role as one device-resident loop (see the module doc)."""

    def __init__(self, cfg: RunConfig, env, device: torch.device):
        self.cfg, self.env = cfg, env
        self.algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
        self.model = self.algo.make_model(env.single_observation_space, env.single_action_space, device)
        self.optimizer = self.algo.make_optimizer(self.model)
        T = cfg.actors.fragment_length
        box = not self.model.discrete
        self.buffer = Rollout.allocate(self.algo.kept_fragments * T, env.num_envs, env.single_observation_space.shape,
                                       self.model.action_shape, torch.float32 if box else torch.int64, device)
        self.filled = 0
        """Steps of the buffer holding data (it fills up over the first kept_fragments iterations)."""

    def act(self, obs):
        return self.algo.sample(self.model, obs)

    def iteration(self, obs, episodes: EpisodeLog):
        """One fragment of every instance into the buffer, one update; returns (last obs, stats tensor)."""
        T = self.cfg.actors.fragment_length
        with no_argument_checks():
            self.buffer.shift(T)
            obs = collect(self.env, obs, self.act, self.buffer.last(T), episodes)
            self.filled = min(self.filled + T, self.buffer.steps)
            batch = self.algo.prepare_rollout(self.buffer.last(self.filled), self.model)
            stats = self.algo.update(batch, self.model, self.optimizer)
        return obs, torch.stack([stats[k] for k in self.algo.stats])


def check_config(cfg: RunConfig) -> None:
    """Raise ConfigError for what :func:`run` would reject (device, env id and kwargs, algo vs action space),
    using a one-instance env on the CPU: nothing is written or allocated on the device."""
    if not cfg.algo.fused_loop:
        from hpcrl.algos.registry import ALGORITHMS

        fused = [name for name, e in ALGORITHMS.items() if e.config.fused_loop]
        raise ConfigError(f"algo.name: the fused loop runs {', '.join(fused)}, got {cfg.algo.name!r}")
    resolve_device(cfg.learners.device)
    cpu = torch.device("cpu")
    env = make_env(cfg, cpu, num_envs=1)
    make_algorithm(cfg.algo, cfg.model, cfg.aggregation).make_model(env.single_observation_space,
                                                                     env.single_action_space, cpu)


def _progress(progress: Any, cfg: RunConfig):
    if progress is None or hasattr(progress, "update"):
        return progress
    from hpcrl.runtime.record.progress import ProgressEmitter

    return ProgressEmitter(progress, cfg.io.log_seconds)


def run(plan: Plan, run_dir: Path, resume: bool = False, progress: Any = None) -> RunResult:
    """Train the plan's algorithm on its env in this process; write ``run_dir/run.h5``; the result holds the summary.

    progress: None (quiet), a mode for :class:`hpcrl.runtime.record.progress.ProgressEmitter`
    ("tty", "plain", "pipe") or an object with ``update(stats)`` and ``finish(summary)``.
    SIGTERM stops like Ctrl-C (KeyboardInterrupt): run.h5 is closed with everything fetched so far.
    No checkpoints, so no ``resume``.
    """
    if resume:
        raise ConfigError("--resume: not supported by the fused loop (it writes no checkpoints)")

    def stop(_signum, _frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        summary = _train(plan.config, Path(run_dir), progress)
    finally:
        signal.signal(signal.SIGTERM, old)
    return RunResult.ended("fused", Path(run_dir), summary)


def _train(cfg: RunConfig, run_dir: Path, progress: Any) -> dict[str, Any]:
    check_config(cfg)
    device = resolve_device(cfg.learners.device)
    torch.manual_seed(cfg.env.seed)
    env = make_env(cfg, device)
    loop = FusedLoop(cfg, env, device)
    T, N, K = cfg.actors.fragment_length, env.num_envs, cfg.algo.stats_every
    episodes = EpisodeLog(K * T, N, device)
    losses = torch.zeros(K, len(loop.algo.stats), device=device)
    view = _progress(progress, cfg)

    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.yaml").is_file():
        (run_dir / "config.yaml").write_text(cfg.to_yaml())
    record = RunRecord.create(run_dir, cfg.io, cfg.to_yaml(), one_process_rank_map(), StopRule(cfg.stop),
                              attrs={"runner": "serial", "fused": True})
    iteration, stop_reason = 0, None
    obs, _ = env.reset(seed=cfg.env.seed)
    start = time.monotonic()
    try:
        while stop_reason is None:
            times = []
            for k in range(K):  # no host synchronisation inside this loop
                obs, losses[k] = loop.iteration(obs, episodes)
                times.append(record.now())
                iteration += 1
                stop_reason = record.stop_rule.reason(iteration * T * N, time.monotonic() - start)
                if stop_reason:
                    break
            first = iteration - len(times)
            values = losses[:len(times)].cpu().numpy()
            record.iterations(first, times, dict(zip(loop.algo.stats, values.T)), episodes.fetch(), T, N,
                              cfg.algo.reported_lr(), first // K)
            record.end_round(first // K, iteration * T * N)
            record.maybe_flush()
            stop_reason = stop_reason or record.stop_rule.reason(iteration * T * N, time.monotonic() - start)
            stats = record.stats(iteration * T * N, cfg.stop.total_env_steps, iteration, 1, 1, first // K,
                                 time.monotonic() - start)
            if view is not None:
                view.update(stats)
    finally:
        record.close()
    summary = record.summary(stats, stop_reason, run_dir, device=str(device), num_envs=N,
                             env_steps_per_second=stats["env_steps"] / max(stats["elapsed"], 1e-9))
    if view is not None:
        view.finish(summary)
    return summary
