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
millions of steps).

Checkpoints are the roles' format (:mod:`hpcrl.runtime.record.checkpoint`: ``params``, ``optimizer``,
``version``, ``round``, ``env_steps``, the record's counts and row counts, RNG states) plus what only this
loop holds, under ``fused``: the env's state and generator, the last observation and the rollout buffer.
One is written after a window every ``io.checkpoint_every`` iterations (at least
``io.checkpoint_min_seconds`` apart) and at the end; ``--resume`` cuts run.h5 back to the checkpoint's
rows and goes on from its iteration, so a resumed run continues the one that stopped exactly.
SIGTERM, SIGUSR1 and a first Ctrl-C stop after the current iteration with a checkpoint and the summary;
a second Ctrl-C stops at once (the last periodic checkpoint is where ``--resume`` goes on).
"""
from __future__ import annotations

import signal
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from hpcrl.algos import make_algorithm
from hpcrl.algos.ha2c import no_argument_checks
from hpcrl.algos.rollout import EpisodeLog, Rollout, collect
from hpcrl.envs import registry
from hpcrl.envs.classic.base import resolve_device
from hpcrl.errors import ConfigError
from hpcrl.runtime import collector
from hpcrl.runtime.plan import Plan, Sections
from hpcrl.runtime.record.checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint
from hpcrl.runtime.record.run_record import RunRecord
from hpcrl.runtime.record.stop_rule import StopRule
from hpcrl.runtime.runners import RunResult
from hpcrl.runtime.signals import EXIT_STOPPED, STOP_SIGNALS, early_signal
from hpcrl.runtime.topology import one_process_rank_map

ENV_STATE = ("state", "elapsed", "episode_return", "episode_count")
"""The batched env's per-instance tensors (hpcrl.envs.classic.base.BatchedEnv) a checkpoint keeps."""


def make_env(cfg: Sections, device: torch.device, num_envs: int | None = None):
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

    def __init__(self, cfg: Sections, env, device: torch.device):
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

    def state(self, obs) -> dict[str, Any]:
        """What only this loop holds, for a checkpoint's ``fused`` entry (host copies)."""
        env = self.env
        return {"obs": obs.cpu().clone(), "filled": self.filled, "generator": env.generator.get_state(),
                "env": {name: getattr(env, name).cpu().clone() for name in ENV_STATE},
                "buffer": {f.name: getattr(self.buffer, f.name).cpu().clone() for f in fields(self.buffer)}}

    def load_state(self, s: dict[str, Any]):
        """Put a checkpoint's ``fused`` entry back (env, buffer); returns the observation to go on from."""
        env = self.env
        for name in ENV_STATE:
            getattr(env, name).copy_(s["env"][name])
        env.generator.set_state(s["generator"])
        for f in fields(self.buffer):
            getattr(self.buffer, f.name).copy_(s["buffer"][f.name])
        self.filled = s["filled"]
        return s["obs"].to(env.device)


def check_config(cfg: Sections) -> None:
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


def _progress(progress: Any, cfg: Sections):
    if progress is None or hasattr(progress, "update"):
        return progress
    from hpcrl.runtime.record.progress import ProgressEmitter

    return ProgressEmitter(progress, cfg.io.log_seconds)


class StopRequest:
    """SIGTERM, SIGUSR1 and a first Ctrl-C ask the loop to stop after its iteration (with a checkpoint and the
    summary); a second Ctrl-C raises KeyboardInterrupt at once. A stop signal that came while the command was
    starting (:func:`hpcrl.runtime.signals.early_signal`) counts too."""

    def __init__(self) -> None:
        self.received: int | None = early_signal()
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "StopRequest":
        for s in (*STOP_SIGNALS, signal.SIGINT):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)

    def _handle(self, signum, _frame) -> None:
        if signum == signal.SIGINT and self.received is not None:
            raise KeyboardInterrupt
        self.received = self.received or signum

    def reason(self) -> str | None:
        return None if self.received is None else f"signal {signal.Signals(self.received).name}"


def run(plan: Plan, run_dir: Path, resume: bool = False, progress: Any = None) -> RunResult:
    """Train the plan's algorithm on its env in this process; write ``run_dir/run.h5`` and checkpoints; the result
    holds the summary. ``resume``: go on from the run's newest checkpoint.

    progress: None (quiet), a mode for :class:`hpcrl.runtime.record.progress.ProgressEmitter`
    ("tty", "plain", "pipe") or an object with ``update(stats)`` and ``finish(summary)``.
    """
    collector.resume()  # runtime/collector.py
    run_dir = Path(run_dir)
    with StopRequest() as stop:
        try:
            summary = _train(plan.sections, run_dir, progress, resume, stop)
        except KeyboardInterrupt:  # the second Ctrl-C: run.h5 was closed on the way out
            from hpcrl.runtime.runners.mpiexec import how_to_go_on

            return RunResult.failed("fused", run_dir, "ended by a second Ctrl-C without waiting for a checkpoint; "
                                    f"{how_to_go_on(run_dir)}", EXIT_STOPPED)
    return RunResult.ended("fused", run_dir, summary)


class _Checkpoints:
    """The loop's checkpoints: periodic (``io.checkpoint_every`` iterations, ``io.checkpoint_min_seconds``
    apart) and final; each holds the record's rows so far, so --resume cuts back to it."""

    def __init__(self, cfg: Sections, loop: FusedLoop, record: RunRecord, run_dir: Path, wall_before: float):
        self.cfg, self.loop, self.record, self.run_dir = cfg, loop, record, run_dir
        self.wall_before, self.start = wall_before, time.monotonic()
        self.last_updates, self.last_time = record.updates, time.monotonic()

    def wall(self) -> float:
        """Seconds this run has trained, the jobs before a resume included."""
        return self.wall_before + time.monotonic() - self.start

    def due(self) -> bool:
        io = self.cfg.io
        return (self.record.updates - self.last_updates >= io.checkpoint_every
                and time.monotonic() - self.last_time >= io.checkpoint_min_seconds)

    def save(self, obs, iteration: int, rounds: int) -> Path:
        from hpcrl.io.rollback import record_counts

        record, loop = self.record, self.loop
        record.flush()
        env_steps = iteration * self.cfg.actors.fragment_length * loop.env.num_envs
        path = save_checkpoint(self.run_dir, {
            "params": loop.model.flat.params.detach().cpu().clone(), "optimizer": loop.optimizer.state_dict(),
            "version": iteration, "round": rounds, "consumed": env_steps, "env_steps": env_steps,
            "episodes": record.episodes, "updates": record.updates, "gradients": record.gradients,
            "admitted": record.admitted, "returns": list(record.stop_rule.returns), "actors": 1,
            "wall_seconds": self.wall(), "rng": rng_state(), "normalizers": [],
            "record": record_counts(self.run_dir, run_file=record.file), "fused": loop.state(obs)})
        self.last_updates, self.last_time = record.updates, time.monotonic()
        return path


def _open(cfg: Sections, run_dir: Path, loop: FusedLoop, resume: bool) -> tuple[RunRecord, dict[str, Any] | None]:
    """run.h5 made, or (``resume``) cut back to the newest checkpoint and reopened; the checkpoint's state."""
    if not resume:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / "config.yaml").is_file():
            (run_dir / "config.yaml").write_text(cfg.yaml)
        return RunRecord.create(run_dir, cfg.io, cfg.yaml, one_process_rank_map(), StopRule(cfg.stop),
                                attrs={"runner": "serial", "fused": True}, name=cfg.name), None
    from hpcrl.runtime.runners.job import roll_back_record

    state = load_checkpoint(run_dir)
    if state is None:
        raise ConfigError(f"--resume: no checkpoint in {run_dir}")
    if "fused" not in state:
        raise ConfigError(f"--resume: the checkpoint in {run_dir} was not written by the fused loop")
    rolled_back = roll_back_record(run_dir)
    stop_rule = StopRule(cfg.stop)
    stop_rule.add_returns(state["returns"])
    record = RunRecord.reopen(run_dir, cfg.io, one_process_rank_map(), stop_rule,
                              {"discarded": rolled_back, "version": state["version"]},
                              {k: state[k] for k in ("episodes", "updates", "gradients", "admitted")},
                              env_steps=state["env_steps"], name=cfg.name)
    return record, state


def _train(cfg: Sections, run_dir: Path, progress: Any, resume: bool, stop: StopRequest) -> dict[str, Any]:
    check_config(cfg)
    device = resolve_device(cfg.learners.device)
    torch.manual_seed(cfg.env.seed)
    env = make_env(cfg, device)
    loop = FusedLoop(cfg, env, device)
    T, N, K = cfg.actors.fragment_length, env.num_envs, cfg.algo.stats_every
    episodes = EpisodeLog(K * T, N, device)
    losses = torch.zeros(K, len(loop.algo.stats), device=device)
    view = _progress(progress, cfg)

    record, state = _open(cfg, run_dir, loop, resume)
    iteration, rounds, wall_before = 0, 0, 0.0
    if state is None:
        obs, _ = env.reset(seed=cfg.env.seed)
    else:
        loop.model.flat.load_(state["params"])
        loop.optimizer.load_state_dict(state["optimizer"])
        obs = loop.load_state(state["fused"])
        iteration, rounds, wall_before = state["version"], state["round"], state["wall_seconds"]
        restore_rng(state["rng"])
    checkpoints = _Checkpoints(cfg, loop, record, run_dir, wall_before)

    def stats_now() -> dict[str, Any]:
        return record.stats(iteration * T * N, cfg.stop.total_env_steps, iteration, 1, 1, max(rounds - 1, 0),
                            checkpoints.wall())

    stop_reason = stop.reason() or record.stop_rule.reason(iteration * T * N, checkpoints.wall(), rounds)
    try:
        while stop_reason is None:
            times = []
            for k in range(K):  # no host synchronisation inside this loop
                obs, losses[k] = loop.iteration(obs, episodes)
                times.append(record.now())
                iteration += 1
                stop_reason = stop.reason() or record.stop_rule.reason(iteration * T * N, checkpoints.wall())
                if stop_reason:
                    break
            first = iteration - len(times)
            values = losses[:len(times)].cpu().numpy()
            record.iterations(first, times, dict(zip(loop.algo.stats, values.T)), episodes.fetch(), T, N,
                              cfg.algo.reported_lr(), rounds)
            record.end_round(rounds, iteration * T * N)
            rounds += 1
            record.maybe_flush()
            stop_reason = stop_reason or record.stop_rule.reason(iteration * T * N, checkpoints.wall(), rounds)
            if view is not None:
                view.update(stats_now())
            if stop_reason is None and checkpoints.due():
                checkpoints.save(obs, iteration, rounds)
        ckpt = checkpoints.save(obs, iteration, rounds)
        stats = stats_now()
    finally:
        record.close()
    summary = record.summary(stats, stop_reason, run_dir, {"checkpoint": str(ckpt)}, device=str(device),
                             num_envs=N, env_steps_per_second=stats["env_steps"] / max(stats["elapsed"], 1e-9))
    if view is not None:
        view.finish(summary)
    return summary
