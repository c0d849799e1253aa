"""run.h5 as every runner keeps it: rows of every table, each round's statistics, progress and summary.

The parameter role (MPI and serial runners) and the fused loop tell a :class:`RunRecord` what
happened and the record writes the rows; it knows no MPI, no admission rule and no algorithm:

    create(...), reopen(...)           run.h5 made for a new run, or reopened to resume one (with the
                                       allocations row of the batch job it runs in, if any)
    arrived()                          a gradient came out of the mailbox (counted)
    gradient(rec, admitted, reason, version, round, ...)   its row (admitted, refused, or left at shutdown)
    step(step, adm, version, round, lr, active, t_agg, t_pub)   an applied step: updates + gradients rows
    consumed(env_steps, learner_seconds)   what the learners reported with a gradient (the round's counts)
    fragment(report, env_steps)        an actor's fragment report: actors and episodes rows, returns
    fragments(actors, episodes, env_steps)   a node's reports as columns (actors.reports=node): the same rows
    node_summary(summary)              a node's sums (actors.reports=summary): the round's statistics and the
                                       node file's rows (its rows are in nodes/node-RRRRR.h5, not here)
    actor_park, actor_join, activity, group_row, joining_job, evaluation   the other ranks' messages
                                       (hpcrl.runtime.messages) as rows
    weight_fetches(rows)               what rank 0's weight board served per version (Board.fetch_rows)
    collect(table, source)             rows another object keeps, taken with each load row and flush
    group_event(group, action, reason, active, ...)   rank 0 activated or parked a learner group
    active(groups)                     the active learner groups changed without a row (the round keeps the most)
    iterations(first, times, stats, episodes, ...)   the fused loop's window of iterations, fetched from the
                                       device at once: its updates and episodes rows
    end_round(round, consumed, threshold, active) -> what algo.end_round is given; the rounds row
    load(clock)                        a parameter_load row (where rank 0's time went)
    stats(...), summary(...)           the progress line's numbers and the closing summary

With ``io.loggers`` each round's numbers, the load numbers and each evaluation also go to the
run's live scalars (:mod:`hpcrl.runtime.record.scalars`: TensorBoard, W&B or MLflow events of merged
rounds at most every half second, x = env steps), never one per gradient.

Frequent rows (gradients, updates, actors, episodes) go through a :class:`RowBuffer`, appended a
table at a time; rows from other ranks carry Unix times and are stored from the run's start.
"""
from __future__ import annotations

import functools
import json
import math
import operator
from collections import deque
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hpcrl.io import RunFile
from hpcrl.io.schema import ELASTIC_ACTIONS, ELASTIC_REASONS, GRADIENT_REASONS, RUN_FILE
from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.messages import (ActorParked, Evaluation, FragmentReport, GroupEvent, JoiningJob, LearnerActivity,
                                    NodeSummary, SamplerEvent)
from hpcrl.runtime.record.allocation import batch_job
from hpcrl.runtime.record.cycle_profile import PARAMETER_PHASES
from hpcrl.runtime.record.round_stats import mean_kl, new_round, round_row
from hpcrl.runtime.record.rows import RowBuffer
from hpcrl.runtime.record.scalars import LiveScalars, open_scalars
from hpcrl.runtime.record.stop_rule import StopRule
from hpcrl.staleness import GradientRecord

REASON = {name: i for i, name in enumerate(GRADIENT_REASONS)}
GROUP_ACTION = {name: i for i, name in enumerate(ELASTIC_ACTIONS)}
GROUP_REASON = {name: i for i, name in enumerate(ELASTIC_REASONS)}
PUSH_TIMINGS = frozenset({"compute_seconds", "mailbox_wait_seconds", "new_env_steps", "busy_seconds", "inner_steps"})
"""What a learner adds to its gradient's stats about the push itself, not the algorithm (learner.push)."""


class RunRecord:
    def __init__(self, run_file: RunFile, stop_rule: StopRule, episodes: int = 0, updates: int = 0,
                 gradients: int = 0, admitted: int = 0, scalars: LiveScalars | None = None) -> None:
        self.file = run_file
        self.scalars = scalars
        self.rows = RowBuffer(run_file)
        self.stop_rule = stop_rule
        self.episodes, self.updates, self.gradients, self.admitted = episodes, updates, gradients, admitted
        self.round_t0 = run_file.now()
        self.current = new_round()
        self.staleness_recent: deque[int] = deque(maxlen=64)
        self.last_stats: dict[str, float] = {}  # the newest iteration's or gradient's algorithm numbers
        self.summary_env_steps: int | None = None
        self.last_evaluation: dict[str, float] = {}  # the newest evaluation's mean return (the summary's line)
        self._load_counts = (gradients, admitted, updates)
        self.node_rows: dict[int, dict[str, int]] = {}  # actors.reports=summary: each node file's committed rows
        self.node_steps: dict[int, int] = {}  # ... and each actor's steps its rows there report
        self._sources: list[tuple[str, Callable[[], Mapping[str, Sequence]]]] = []

    @classmethod
    def create(cls, run_dir: Path, io, config_yaml: str, rank_map: Mapping[str, Sequence], stop_rule: StopRule,
               attrs: Mapping[str, Any], traj_layout=None, num_actors: int | None = None, clock: Clock = WALL,
               name: str = "run") -> "RunRecord":
        """A new ``run_dir/run.h5`` (``io``: the config's io section; ``attrs``: file attributes such as the runner;
        ``clock``: the parameter rank's, whose times the tables hold; ``name``: the config's, the live scalars'
        W&B project and MLflow experiment)."""
        run_file = RunFile.create(Path(run_dir) / RUN_FILE, config_yaml, rank_map, io.compression,
                                  traj_layout=traj_layout, num_actors=num_actors, flush_seconds=io.flush_seconds,
                                  attrs=attrs, unix=clock.unix)
        return cls(run_file, stop_rule, scalars=open_scalars(run_dir, io, name, clock=clock))._started()

    @classmethod
    def reopen(cls, run_dir: Path, io, rank_map: Mapping[str, Sequence], stop_rule: StopRule, note: Mapping[str, Any],
               counts: Mapping[str, int], traj_layout=None, num_actors: int | None = None,
               env_steps: int = 0, clock: Clock = WALL, name: str = "run") -> "RunRecord":
        """``run_dir/run.h5`` reopened to resume (``note``: what the resume cut back, kept as JSON in the file;
        ``counts``: the checkpoint's episodes, updates, gradients and admitted; ``env_steps``: its env steps,
        where the live scalars go on)."""
        run_file = RunFile.open_append(Path(run_dir) / RUN_FILE, flush_seconds=io.flush_seconds, note=json.dumps(note),
                                       rank_map=rank_map, traj_layout=traj_layout, num_actors=num_actors,
                                       unix=clock.unix)
        return cls(run_file, stop_rule, **counts,
                   scalars=open_scalars(run_dir, io, name, resume_step=env_steps, clock=clock))._started()

    def _started(self) -> "RunRecord":
        """The allocations row of this start, when it runs inside a batch job."""
        job = batch_job()
        if job is not None:
            self.rows.add("allocations", {"time": self.file.now(), **job})
        return self

    def now(self) -> float:
        return self.file.now()

    def times(self, row: dict, keys) -> dict:
        """Rows from other ranks carry Unix times; the tables count from the run start."""
        t0 = self.file.start_unix
        return {k: (np.asarray(v, dtype=np.float64) - t0 if k in keys else v) for k, v in row.items()}

    # ---- gradients and steps ---------------------------------------------------------------
    def arrived(self, pushes: int = 1) -> None:
        self.gradients += pushes

    def consumed(self, env_steps: int, learner_seconds: float) -> None:
        self.current["env_steps"] += env_steps
        self.current["learner_seconds"] += learner_seconds

    def gradient(self, rec: GradientRecord, admitted: bool, reason: str, version: int, round_index: int,
                 staleness: int | None = None, scale: float = math.nan, now: float | None = None) -> None:
        now = self.file.now() if now is None else now
        self.admitted += int(admitted)
        self.current["admitted" if admitted else "dropped"] += 1
        self.rows.add("gradients", {
            "time": rec.received_at, "group": rec.group, "seq": rec.seq, "base_version": rec.base_version,
            "staleness": version - rec.base_version if staleness is None else staleness,
            "round": round_index, "lr_scale": scale, "samples": rec.samples, "loss": rec.stats.get("loss", math.nan),
            "admitted": int(admitted), "reason": REASON[reason], "queue_seconds": now - rec.received_at,
            "compute_seconds": rec.stats.get("compute_seconds", math.nan),
            "mailbox_wait_seconds": rec.stats.get("mailbox_wait_seconds", math.nan),
            "inner_steps": _whole(rec.stats.get("inner_steps", 0.0)),
        })

    def step(self, step, adm, version: int, round_index: int, lr: float, active: int, t_agg: float,
             t_pub: float) -> None:
        """An applied step (version ``version``): its updates row and its gradients' rows."""
        now = self.file.now()
        stale = [adm.staleness[rec.key] for rec, _ in step]
        losses = [rec.stats.get("loss", math.nan) for rec, _ in step]
        self.updates += 1
        for rec, scale in step:
            self.gradient(rec, True, "admitted", version, round_index, adm.staleness[rec.key], scale, now)
        r = self.current
        self.staleness_recent.extend(stale)
        r["staleness"].extend(stale)
        r["loss"].extend(losses)
        r["grad_stats"].extend(rec.stats for rec, _ in step)  # the round's kl, the live scalars' train/ means
        # the newest gradient's algorithm numbers (PPO: losses, kl, entropy, clip fraction) for `hpcrl -v`'s line
        self.last_stats = {k: v for k, v in step[-1][0].stats.items() if k not in PUSH_TIMINGS and v == v}
        r["updates"] += 1
        # most steps hold one gradient: plain floats then (numpy's reductions cost 5 us each, per update)
        loss_mean, loss_min, loss_max = ((losses[0],) * 3 if len(losses) == 1
                                         else (float(np.mean(losses)), float(np.min(losses)), float(np.max(losses))))
        self.rows.add("updates", {
            "time": now, "version": version, "round": round_index, "num_gradients": len(step),
            "staleness_mean": sum(stale) / len(stale), "staleness_max": int(max(stale)),
            "threshold": math.nan if adm.threshold is None else adm.threshold, "lr": lr,
            "loss_mean": loss_mean, "loss_min": loss_min, "loss_max": loss_max,
            "active_groups": active, "aggregate_seconds": t_agg, "publish_seconds": t_pub,
        })

    # ---- the other ranks' rows ---------------------------------------------------------------
    def fragment(self, report: FragmentReport, env_steps: int) -> None:
        """An actor's fragment report: its actors row, its finished episodes (``env_steps``: the run's now)."""
        r = self.current
        r["actor_seconds"] += report.sample_seconds
        r["actors"].add(report.actor)
        self.rows.add("actors", self.times(report.row(), ("time",)))
        cols = r["episode_columns"]  # what algo.end_round reads of the round's episodes (round_stats["episodes"])
        for ep in report.episodes:
            self.rows.add("episodes", {**self.times(ep.row(), ("time",)), "env_steps": env_steps})
            self.stop_rule.add_returns([ep.episode_return])
            r["returns"].append(ep.episode_return)
            r["lengths"].append(ep.length)
            cols["actor"].append(ep.actor)
            cols["env_index"].append(ep.env_index)
            cols["return"].append(ep.episode_return)
        self.episodes += len(report.episodes)
        r["episodes"] += len(report.episodes)

    def fragments(self, actors: Mapping[str, list], episodes: Mapping[str, list], env_steps: int) -> None:
        """A node's fragment reports as columns (``FragmentColumns``: actors.reports=node): the rows and the round's
        statistics of as many :meth:`fragment` calls, in their order, appended as one block per table."""
        r = self.current
        # the same sum as report by report, in the same order (sum() may compensate: Python 3.12's does)
        r["actor_seconds"] = functools.reduce(operator.add, actors["sample_seconds"], r["actor_seconds"])
        r["actors"].update(actors["actor"])
        self.rows.add_columns("actors", self.times(dict(actors), ("time",)))
        n = len(episodes["actor"])
        if n:
            self.rows.add_columns("episodes", {**self.times(dict(episodes), ("time",)), "env_steps": [env_steps] * n})
        self._ended(episodes["actor"], episodes["env_index"], episodes["return"], episodes["length"])

    def node_summary(self, summary: NodeSummary) -> None:
        """A node's sums (``actors.reports: summary``): the round's statistics of its fragments and episodes, as
        :meth:`fragments` keeps them, and how far its node file went (for the checkpoint); the rows themselves
        are in the node file."""
        r = self.current
        seconds, steps = summary.actor_sum("sample_seconds"), summary.actor_sum("steps")
        actors = summary.actor_sum("actor").astype(np.int64).tolist()
        r["actor_seconds"] += float(seconds.sum())
        r["actors"].update(actors)
        for actor, n in zip(actors, steps.astype(np.int64).tolist()):
            self.node_steps[actor] = self.node_steps.get(actor, 0) + n
        self.node_rows[summary.node] = {"actors": summary.rows[0], "episodes": summary.rows[1]}
        whole = [summary.episode(c).astype(np.int64).tolist() for c in ("actor", "env_index", "length")]
        self._ended(whole[0], whole[1], summary.episode("return").tolist(), whole[2])

    def _ended(self, actors: list, env_index: list, returns: list, lengths: list) -> None:
        """Episodes ended on the actors (their columns, in order): the stop rule's returns and the round's."""
        r = self.current
        self.stop_rule.add_returns(returns)
        r["returns"].extend(returns)
        r["lengths"].extend(lengths)
        cols = r["episode_columns"]  # what algo.end_round reads of the round's episodes
        cols["actor"].extend(actors)
        cols["env_index"].extend(env_index)
        cols["return"].extend(returns)
        self.episodes += len(returns)
        r["episodes"] += len(returns)

    def actor_park(self, parked: ActorParked) -> None:
        self.file.append("actor_parks", self.times(parked.row(), ("time",)))

    def actor_join(self, event: SamplerEvent) -> None:
        self.file.append("actor_joins", self.times(event.row(), ("time",)))

    def weight_fetches(self, rows: Mapping[str, Sequence[int]]) -> None:
        """What rank 0's weight board served per version (``Board.fetch_rows``: columns of ``weight_fetches``)."""
        if rows and len(rows["version"]):
            self.file.append("weight_fetches", dict(rows))

    def collect(self, table: str, source: Callable[[], Mapping[str, Sequence]]) -> None:
        """Rows another object keeps for ``table`` (``source()``: columns, maybe empty), taken with every load row
        (twice a second) and at every :meth:`flush` (before a checkpoint counts the rows)."""
        self._sources.append((table, source))

    def _collect(self) -> None:
        for table, source in self._sources:
            rows = source()
            if rows and len(next(iter(rows.values()))):
                self.file.append(table, dict(rows))

    def activity(self, activity: LearnerActivity) -> None:
        """A learner group's batch: its learner_activity row, its learner_cycles, its algo report."""
        if activity.algo_report is not None:  # algo.learner_report -> algo.end_round
            self.current["reports"].append(activity.algo_report)
        self.file.append("learner_activity", self.times(activity.row(), ("time_start", "time_end")))
        cycles = activity.cycles
        if cycles and cycles["time"]:
            self.file.append("learner_cycles", self.times(cycles, ("time",)))
            r = self.current
            r["cycle_count"] += len(cycles["time"])
            for name, values in cycles.items():
                if name.endswith("_seconds"):
                    r["cycles"][name] = r["cycles"].get(name, 0.0) + float(np.sum(values))

    def group_row(self, event: GroupEvent) -> None:
        """A learner group's park ended, or its joining ranks joined or left: an elastic_events row."""
        self.file.append("elastic_events", self.times(event.row(), ("time",)))

    def joining_job(self, job: JoiningJob) -> None:
        """The batch job of a door's joining ranks (learners/actors.elastic=jobs): an allocations row."""
        self.rows.add("allocations", self.times(job.row(), ("time",)))

    def evaluation(self, evaluation: Evaluation) -> None:
        head = {"time": evaluation.time - self.file.start_unix, "round": evaluation.round,
                "policy_version": evaluation.policy_version}
        rows = [ep.row() for ep in evaluation.episodes]
        for row in rows:
            self.file.append("eval_episodes", {**head, **row})
        if rows:  # the summary's evaluation line: the newest evaluation's
            returns = [float(row["return"]) for row in rows]
            self.last_evaluation = {"eval_return": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
                                    "eval_episodes": len(returns), "eval_version": evaluation.policy_version}
        if self.scalars is not None:
            self.scalars.evaluation(rows)

    def active(self, groups: int) -> None:
        """The active learner groups now (the round's rows keep the most it had)."""
        self.current["active_max"] = max(self.current["active_max"], groups)

    def group_event(self, group: int, action: str, reason: str, active: int, supply: float = math.nan,
                    capacity: float = math.nan, load: float = math.nan, waiting: int = -1) -> None:
        """Rank 0 activated or parked ``group`` (``action`` and ``reason``: names of io.schema's ELASTIC_ACTIONS
        and ELASTIC_REASONS; the elastic rule's numbers when it decided): an elastic_events row."""
        self.active(active)
        self.file.append("elastic_events", {
            "time": self.file.now(), "group": group, "action": GROUP_ACTION[action], "reason": GROUP_REASON[reason],
            "active_groups": active, "supply_rate": supply, "group_rate": capacity, "load": load,
            "fragments_waiting": waiting})

    # ---- the fused loop ------------------------------------------------------------------------
    def iterations(self, first: int, times: Sequence[float], stats: Mapping[str, np.ndarray],
                   episodes: Mapping[str, np.ndarray], fragment_length: int, instances: int, lr: float,
                   round_index: int) -> None:
        """Iterations ``first`` + 1 .. ``first`` + len(times) of the fused loop, fetched from the device at once
        (``times``: when each ended). Each sampled one fragment of ``fragment_length`` steps of ``instances``
        envs and applied one gradient at once: an updates row each (version = the iteration's number;
        ``stats``: the algorithm's per-iteration numbers, the first its loss). ``episodes``: those the
        iterations ended (``row``: the step since ``first``'s end, ``env_index``, ``return``, ``length``),
        an episodes row each, at the time and version of the iteration that ended it."""
        n, steps = len(times), fragment_length * instances
        loss = next(iter(stats.values()))
        self.gradients, self.admitted, self.updates = self.gradients + n, self.admitted + n, self.updates + n
        self.file.append("updates", {"time": times, "version": np.arange(first + 1, first + n + 1),
                                     "round": round_index, "num_gradients": 1, "lr": lr, "loss_mean": loss})
        self.last_stats = {name: float(values[-1]) for name, values in stats.items()}
        r = self.current
        for name, values in stats.items():
            r["algo_stats"].setdefault(name, []).append(values)
        r["env_steps"] += n * steps
        r["updates"] += n
        r["loss"].extend(loss)
        returns = episodes["return"]
        if len(returns):
            it = episodes["row"] // fragment_length
            self.file.append("episodes", {
                "time": np.asarray(times)[it], "actor": 0, "env_index": episodes["env_index"], "return": returns,
                "length": episodes["length"], "policy_version": first + it,
                "env_steps": ((first * fragment_length + episodes["row"] + 1) * instances).astype(np.int64)})
        self.stop_rule.add_returns(returns)
        r["returns"].extend(returns)
        r["lengths"].extend(episodes["length"])
        self.episodes += len(returns)
        r["episodes"] += len(returns)

    # ---- rounds, load, progress ------------------------------------------------------------
    def end_round(self, round_index: int, consumed: int, threshold: float | None = None,
                  active: int | None = None, queued: int = 0) -> dict[str, Any]:
        """The rounds row of the round that ended (and its live scalars); returns what ``algo.end_round`` is
        given of it.

        ``active``: the active learner groups; None for the fused loop, whose row leaves empty what only the
        roles measure (threshold, staleness, learner and actor seconds, active actors and groups).
        ``queued``: gradients waiting in the admission queue now."""
        r, now = self.current, self.file.now()
        row = round_row(r, round_index, self.round_t0, now, consumed, threshold, active)
        self.file.append("rounds", row)
        if self.scalars is not None:
            self.scalars.round(row, r, queued, self.stop_rule.mean_return())
        self.round_t0 = now
        self.current = new_round()
        return {"kl": mean_kl(r), "round": round_index, "episodes": r["episode_columns"], "reports": r["reports"]}

    def algo_rows(self, records: dict[str, list[dict]]) -> None:
        for table, rows in records.items():
            for row in rows:
                self.file.append(table, row)

    def load(self, clock) -> None:
        """One parameter_load row: the interval since the last one (gradients in, phases, absorption rate)."""
        self._collect()
        elapsed, sec = clock.take()
        cpu = clock.cpu_take()
        g0, a0, u0 = self._load_counts
        self._load_counts = (self.gradients, self.admitted, self.updates)
        n = self.gradients - g0
        work = sec["receive"] + sec["admit"] + sec["apply"] + sec["publish"]
        self.rows.flush()
        absorption, arrival = n / work if n and work > 0 else math.nan, n / elapsed if elapsed > 0 else math.nan
        self.file.append("parameter_load", {
            "time": self.file.now(), "interval_seconds": elapsed, "gradients": n, "applied": self.admitted - a0,
            "updates": self.updates - u0, **{f"{p}_seconds": sec[p] for p in PARAMETER_PHASES}, "cpu_seconds": cpu,
            "absorption_rate": absorption, "arrival_rate": arrival,
        })
        if self.scalars is not None:
            self.scalars.load(absorption, arrival, work / elapsed if elapsed > 0 else math.nan)

    def stats(self, env_steps: int, total_steps: int, version: int, active: int, groups: int, round_index: int,
              elapsed: float) -> dict[str, Any]:
        """The progress line's numbers."""
        return {
            "env_steps": env_steps, "total_steps": total_steps, "episodes": self.episodes,
            "mean_return": self.stop_rule.mean_return(), "version": version,
            "staleness": float(np.mean(self.staleness_recent)) if self.staleness_recent else math.nan,
            "active_groups": active, "groups": groups, "round": round_index, "elapsed": elapsed,
            "target_return": self.stop_rule.cfg.target_return, "max_wall_seconds": self.stop_rule.cfg.max_wall_seconds,
            "max_rounds": self.stop_rule.cfg.max_rounds, **self.last_stats,
        }

    def summary(self, stats: Mapping[str, Any], stop_reason: str | None, run_dir: Path,
                files: Mapping[str, str] | None = None, **extra: Any) -> dict[str, Any]:
        """The closing summary every runner prints and returns: the last progress numbers (``stats``), why the
        run stopped, the gradient counts, the runner's ``extra`` facts and the files (run.h5, ``files``, config)."""
        self.summary_env_steps = stats.get("env_steps")  # the last live scalars' x (close)
        return {**stats, "stop_reason": stop_reason, "run_dir": str(run_dir),
                "return_window": self.stop_rule.cfg.return_window, "gradients": self.gradients,
                "admitted": self.admitted, **self.last_evaluation, **extra,
                "files": {"record": str(self.file.path), **(files or {}), "config": str(Path(run_dir) / "config.yaml")}}

    # ---- the file ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Every kept row into the file, and the file to disk (before a checkpoint counts the rows); the live
        scalars too (their writer thread also flushes them every io.flush_seconds)."""
        self._collect()
        self.rows.flush()
        self.file.flush()
        if self.scalars is not None:
            self.scalars.flush()

    def maybe_flush(self) -> None:
        self.file.maybe_flush(self.file.now())  # every io.flush_seconds of the run's clock

    def close(self) -> None:
        self.rows.flush()
        self.file.close()
        if self.scalars is not None:
            # the round the run stopped in; or, stopped on a round's end, the env steps the summary counted past it
            # (the counter holds a last fragment whose report came after the round closed)
            ahead = self.summary_env_steps is not None and self.summary_env_steps != self.scalars.step
            if self.current["episodes"] or self.current["env_steps"] or ahead:
                self.scalars.tail(self.current, self.stop_rule.mean_return(), self.summary_env_steps)
            self.scalars.close()

    def close_on_error(self) -> None:
        """Flush what is buffered (called before MPI_Abort)."""
        for step in (self.rows.flush, self.file.close, *((self.scalars.close,) if self.scalars is not None else ())):
            try:
                step()
            except Exception:
                pass


def _whole(value: float) -> int:
    """A count that travelled as a float64 stat (NaN from a learner that did not send it: 0)."""
    return int(value) if value == value else 0
