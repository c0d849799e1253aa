"""Live scalars: TensorBoard event files in ``RUN_DIR/tensorboard/``, written as the run goes.

The :class:`~hpcrl.runtime.record.run_record.RunRecord` hands its :class:`LiveScalars` each ended
round (its rounds row and the numbers it kept), the parameter rank's newest load numbers and each
evaluation; the x axis is env steps (those the learners consumed, the rounds table's
``env_steps_total``). Rounds are merged until :data:`WRITE_SECONDS` have passed since the last
write, so a run of a hundred rounds a second writes two events a second, and a run of one round
a minute one a minute; :meth:`LiveScalars.flush` (before a checkpoint) and :meth:`LiveScalars.close`
write what is left. Tags (NaN values, e.g. of a merge without episodes, are left out):

    episode/return_mean, return_min, return_max, length_mean, count   the merged rounds' episodes
    episode/return_window              the stop rule's mean return (what stop.target_return is compared with)
    throughput/env_steps_per_second    env steps consumed / wall seconds of the merged rounds
    train/<stat>                       mean over their gradients: loss, policy_loss, value_loss, entropy, kl
                                       (the fused loop: each of the algorithm's stats over its iterations)
    staleness/mean, max; gradients/admitted, dropped (in the merged rounds), queued (now);
    learners/active_groups; actors/active; learner_cycle/<phase>_seconds (per gradient cycle);
    parameter/absorption_rate, arrival_rate, busy_fraction      the roles only, not the fused loop
    eval/return_mean, eval/length_mean  each evaluation, at the env steps of the round end that asked for it

One write is one TensorBoard ``Event`` holding every value as a ``Summary.Value`` (what
``torch.utils.tensorboard.SummaryWriter.add_scalar`` writes, one per event), queued for tensorboard's
``EventFileWriter``, whose own thread frames it and flushes the file every ``io.flush_seconds``.
Measured (CPU seconds of the loop's thread, 2 shared cores): a write of 35 tags merging 25 rounds
of 20 gradients costs the loop about 0.7 ms (0.13 ms of it building and queueing the event), the
writer thread about 0.4 ms more (tensorboard's pure-Python CRC-32C of the event's ~700 bytes): at
two writes a second, under 0.3% of a core. Between writes a round costs a list append.

``tensorboard`` is imported when the first :class:`Scalars` is made, on the parameter rank only
(about 0.15 s); no other rank imports it.

Resume: the resumed job writes a new event file in the same folder that starts with a
``SessionLog.START`` event one step past the checkpoint's env steps, so TensorBoard drops the
earlier file's points that the resumed run redoes.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hpcrl.runtime.clock import WALL, Clock

TENSORBOARD_DIR = "tensorboard"
"""The event files' folder in the run directory (``tensorboard --logdir RUN_DIR/tensorboard``)."""

WRITE_SECONDS = 0.5
"""Least seconds (of the run's clock) between two round events (rounds in between are merged into the next)."""

TRAIN_STATS = ("loss", "policy_loss", "value_loss", "entropy", "kl")
"""The learners' gradient stats (transport.control.GRAD_STATS) written as ``train/<name>``."""


class Scalars:
    """One event file; :meth:`add` queues an event, tensorboard's writer thread writes it."""

    def __init__(self, folder: Path, flush_seconds: float, resume_step: int | None = None, clock: Clock = WALL) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self.clock = Event, clock
        self.folder = Path(folder)
        self._writer = EventFileWriter(str(self.folder), max_queue_size=64, flush_secs=flush_seconds)
        if resume_step is not None:
            self._writer.add_event(Event(wall_time=clock.unix(), step=int(resume_step) + 1,
                                         session_log=SessionLog(status=SessionLog.START)))
        self.writes, self.seconds = 0, 0.0  # what add cost the caller

    def add(self, step: int, values: Mapping[str, float]) -> None:
        """One event at env step ``step`` holding each finite value of ``values`` under its tag."""
        t = time.perf_counter()  # real seconds: what writing costs this process
        event = self._event(wall_time=self.clock.unix(), step=int(step))
        add = event.summary.value.add  # in place: Summary(value=[Summary.Value(...)]) copies, 2.5x the time
        for tag, v in values.items():
            if v is not None and math.isfinite(v):
                add(tag=tag, simple_value=v)
        if event.summary.value:
            self._writer.add_event(event)
        self.writes += 1
        self.seconds += time.perf_counter() - t

    def flush(self) -> None:
        """Everything queued so far on disk (waits for the writer thread)."""
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class LiveScalars:
    """What a run's :class:`Scalars` are given and when: merged rounds, load numbers, evaluations."""

    def __init__(self, scalars: Scalars, env_steps: int = 0) -> None:
        self.scalars = scalars
        self.clock = scalars.clock
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
            self.scalars.add(self.step, {"eval/return_mean": float(np.mean([ep["return"] for ep in episodes])),
                                         "eval/length_mean": float(np.mean([ep["length"] for ep in episodes]))})

    def write(self) -> None:
        """The rounds kept since the last write as one event (nothing without any)."""
        if self.rounds:
            self.scalars.add(self.step, self.merged())
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

    def flush(self) -> None:
        self.write()
        self.scalars.flush()

    def close(self) -> None:
        self.write()
        self.scalars.close()


def _mean(values: np.ndarray) -> float:
    """Mean of the finite values; NaN without any."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else math.nan


def open_scalars(run_dir: Path, io, resume_step: int | None = None, clock: Clock = WALL) -> LiveScalars | None:
    """The run's :class:`LiveScalars` (``io``: the config's io section), or None with ``io.tensorboard`` false
    or, after one line on stderr, without the tensorboard package (the run goes on without live scalars)."""
    if not io.tensorboard:
        return None
    try:
        scalars = Scalars(Path(run_dir) / TENSORBOARD_DIR, io.flush_seconds, resume_step, clock)
    except ImportError as exc:
        print(f"hpcrl: io.tensorboard: no live scalars ({exc}; pip install tensorboard, "
              "or set io.tensorboard=false)", file=sys.stderr, flush=True)
        return None
    return LiveScalars(scalars, resume_step or 0)
