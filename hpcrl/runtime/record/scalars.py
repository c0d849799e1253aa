"""Live scalars: what a run's trackers (``io.loggers``: TensorBoard by default, W&B, MLflow) are sent as it goes.

The :class:`~hpcrl.runtime.record.run_record.RunRecord` hands its :class:`LiveScalars` each ended
round (its rounds row and the numbers it kept), the parameter rank's newest load numbers and each
evaluation; the x axis is env steps (those the learners consumed, the rounds table's
``env_steps_total``). Rounds are merged until :data:`WRITE_SECONDS` have passed since the last
write, so a run of a hundred rounds a second writes two events a second, and a run of one round
a minute one a minute; :meth:`LiveScalars.flush` (before a checkpoint) and :meth:`LiveScalars.close`
write what is left. Each write goes to every logger (:mod:`hpcrl.runtime.record.loggers`) with the
same tags and values (NaN values, e.g. of a merge without episodes, are left out):

    episode/return_mean, return_min, return_max, length_mean, count   the merged rounds' episodes
    episode/return_window              the stop rule's mean return (what stop.target_return is compared with)
    throughput/env_steps_per_second    env steps consumed / wall seconds of the merged rounds
    train/<stat>                       mean over their gradients: loss, policy_loss, value_loss, entropy, kl
                                       (the fused loop: each of the algorithm's stats over its iterations)
    staleness/mean, max; gradients/admitted, dropped (in the merged rounds), queued (now);
    learners/active_groups; actors/active; learner_cycle/<phase>_seconds (per gradient cycle);
    parameter/absorption_rate, arrival_rate, busy_fraction      the roles only, not the fused loop
    eval/return_mean, eval/length_mean  each evaluation, at the env steps of the round end that asked for it

Measured (CPU seconds of the loop's thread, 2 shared cores): a TensorBoard write of 35 tags merging
25 rounds of 20 gradients costs the loop about 0.7 ms (0.13 ms of it building and queueing the
event), tensorboard's writer thread about 0.4 ms more (its pure-Python CRC-32C of the event's ~700
bytes): at two writes a second, under 0.3% of a core. Between writes a round costs a list append.
The other loggers' costs are in :mod:`hpcrl.runtime.record.loggers`.

The trackers are imported when the loggers are opened, on the parameter rank only (tensorboard about
0.15 s); no other rank imports one.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.record.loggers import Logger, open_loggers

WRITE_SECONDS = 0.5
"""Least seconds (of the run's clock) between two round events (rounds in between are merged into the next)."""

TRAIN_STATS = ("loss", "policy_loss", "value_loss", "entropy", "kl")
"""The learners' gradient stats (transport.control.GRAD_STATS) written as ``train/<name>``."""


class LiveScalars:
    """What a run's loggers are given and when: merged rounds, load numbers, evaluations."""

    def __init__(self, loggers: Sequence[Logger], env_steps: int = 0, clock: Clock = WALL) -> None:
        self.loggers = list(loggers)
        self.clock = clock
        self.writes, self.seconds = 0, 0.0  # what the writes cost the caller
        self.step = env_steps  # env steps at the last round's end
        self.rounds: list[tuple[dict, dict]] = []  # (rounds row, kept numbers) not yet written
        self.queued, self.window_return = 0, math.nan  # of the newest kept round
        self.load_now: dict[str, float] = {}
        self.written_at = self.clock.now()

    def round(self, row: dict[str, Any], kept: dict[str, Any], queued: int, window_return: float) -> None:
        """A round ended (``row``: its rounds row; ``kept``: RunRecord's numbers of it; ``queued``: gradients
        waiting now; ``window_return``: the stop rule's mean return); written once WRITE_SECONDS have passed."""
        self.rounds.append((row, kept))
        self.step, self.queued, self.window_return = row["env_steps_total"], queued, window_return
        if self.clock.now() - self.written_at >= WRITE_SECONDS:
            self.write()

    def load(self, absorption: float, arrival: float, busy: float) -> None:
        """The parameter rank's newest parameter_load numbers (written with the next round event)."""
        self.load_now = {"parameter/absorption_rate": absorption, "parameter/arrival_rate": arrival,
                         "parameter/busy_fraction": busy}

    def evaluation(self, episodes: Sequence[Mapping[str, Any]]) -> None:
        if episodes:
            self._send(self.step, {"eval/return_mean": float(np.mean([ep["return"] for ep in episodes])),
                                   "eval/length_mean": float(np.mean([ep["length"] for ep in episodes]))})

    def write(self) -> None:
        """The rounds kept since the last write as one event (nothing without any)."""
        if self.rounds:
            self._send(self.step, self.merged())
            self.rounds, self.load_now = [], {}
        self.written_at = self.clock.now()

    def merged(self) -> dict[str, float]:
        """The tags of the module doc over the kept rounds."""
        rows = [row for row, _ in self.rounds]

        def cat(key):
            return np.asarray([x for _, kept in self.rounds for x in kept[key]], dtype=np.float64)

        returns, lengths = cat("returns"), cat("lengths")
        seconds = sum(row["duration"] for row in rows)
        out = {"episode/return_mean": _mean(returns), "episode/return_window": self.window_return,
               "episode/return_min": float(returns.min()) if returns.size else math.nan,
               "episode/return_max": float(returns.max()) if returns.size else math.nan,
               "episode/length_mean": _mean(lengths), "episode/count": sum(row["episodes"] for row in rows),
               "throughput/env_steps_per_second": sum(row["env_steps"] for row in rows) / seconds
               if seconds > 0 else math.nan,
               **{f"train/{name}": _mean(values) for name, values in self._train().items()}}
        if "active_groups" not in rows[-1]:  # the fused loop: no roles, no queues
            return out
        staleness = cat("staleness")
        out.update({"staleness/mean": _mean(staleness),
                    "staleness/max": float(staleness.max()) if staleness.size else math.nan,
                    "gradients/admitted": sum(kept["admitted"] for _, kept in self.rounds),
                    "gradients/dropped": sum(kept["dropped"] for _, kept in self.rounds),
                    "gradients/queued": self.queued, "learners/active_groups": max(r["active_groups"] for r in rows),
                    "actors/active": max(r["active_actors"] for r in rows), **self.load_now})
        cycles = sum(kept["cycle_count"] for _, kept in self.rounds)
        for name in {name for _, kept in self.rounds for name in kept["cycles"]} if cycles else ():
            out[f"learner_cycle/{name}"] = sum(kept["cycles"].get(name, 0.0) for _, kept in self.rounds) / cycles
        return out

    def _train(self) -> dict[str, np.ndarray]:
        """Each learner stat's values over the kept rounds: the fused loop's algorithm stats per iteration,
        else TRAIN_STATS per gradient."""
        if self.rounds[0][1]["algo_stats"]:
            names = self.rounds[0][1]["algo_stats"]
            return {name: np.concatenate([part for _, kept in self.rounds for part in kept["algo_stats"].get(name, ())])
                    for name in names}
        stats = [s for _, kept in self.rounds for s in kept["grad_stats"]]
        return {name: np.fromiter((s.get(name, math.nan) for s in stats), float, len(stats)) for name in TRAIN_STATS}

    def _send(self, step: int, values: Mapping[str, float]) -> None:
        """The finite values at env step ``step`` to every logger (nothing without any). A logger that fails is
        dropped after one line on stderr: the run goes on, run.h5 holds every number."""
        t = time.perf_counter()  # real seconds: what writing costs this process
        finite = {tag: float(v) for tag, v in values.items() if v is not None and math.isfinite(v)}
        if finite:
            self._each("scalars", step, finite)
        self.writes += 1
        self.seconds += time.perf_counter() - t

    def _each(self, method: str, *args) -> None:
        for logger in list(self.loggers):
            try:
                getattr(logger, method)(*args)
            except Exception as exc:  # a tracker's own error (a full disk, a server gone): not the run's end
                self.loggers.remove(logger)
                print(f"hpcrl: io.loggers: {type(logger).__name__}.{method} failed ({type(exc).__name__}: {exc}); "
                      "no more live scalars to it", file=sys.stderr, flush=True)

    def tail(self, kept: Mapping[str, Any], window_return: float, env_steps: int | None = None) -> None:
        """The part of a round the run ended in (``kept``: RunRecord's numbers of it), written at the end so the
        last point holds the episode that met the stop rule: the return window and env steps (``env_steps``,
        the summary's) are then the summary's."""
        self.write()
        self.step = env_steps if env_steps is not None else self.step + kept["env_steps"]
        values = {"episode/return_window": window_return, "episode/count": kept["episodes"]}
        if kept["episodes"]:  # no mean of no episodes (a run that stopped on a round's end)
            values["episode/return_mean"] = _mean(np.asarray(kept["returns"], dtype=np.float64))
        self._send(self.step, values)

    def flush(self) -> None:
        self.write()
        self._each("flush")

    def close(self) -> None:
        self.write()
        self._each("close")


def _mean(values: np.ndarray) -> float:
    """Mean of the finite values; NaN without any."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def open_scalars(run_dir: Path, io, name: str = "run", resume_step: int | None = None, clock: Clock = WALL
                 ) -> LiveScalars | None:
    """The run's :class:`LiveScalars` (``io``: the config's io section; ``name``: the config's name, the W&B
    project and MLflow experiment), or None when no logger is named or none could start."""
    loggers = open_loggers(run_dir, io, name, resume_step, clock)
    return LiveScalars(loggers, resume_step or 0, clock) if loggers else None
