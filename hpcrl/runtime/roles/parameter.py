"""The parameter rank's loop: admit gradients, step the optimizer, publish weights, keep the record.

Each pass: copy finished gradients out of the mailbox (never waiting on a learner); after
each arrival ask the admission policy (hpcrl.staleness) what to apply; apply each admitted
step (``algo.apply``: one optimizer step on ``(1/H) sum_c (alpha_c/alpha_0) g_c``) and publish
the new version; drain the actors' fragment reports (episodes) and the learners' activity rows;
every half second let the elastic rule (runtime/roles/elastic.py: actors' supply of env steps vs the
groups' measured capacity) activate or park a learner group (runtime/roles/active_groups.py); stop on ``stop.*`` or a signal,
checkpoint, and take part in the shutdown.

Adam and Stellaris' per-gradient learning rate (Eq. 4): the optimizer keeps its base rate
alpha_0 and receives each gradient scaled by alpha_c/alpha_0 before averaging, so with SGD
the update is exactly the paper's ``theta -= (1/H) sum_c alpha_c g_c``; with Adam the moment
estimates are those of the gradients actually applied (see hpcrl.staleness for what Adam's
normalisation does to a shared scale).

Update push (``learners.push: update``): what arrives is a group's whole update on a batch; it is admitted the same
way and the admitted mean is applied with the outer step (``hpcrl.algos.outer_step``) instead of ``algo.apply``;
the lr schedule is then the groups' (rank 0 sets the CONSUMED word before it publishes), and each group's
optimizer state, sent after each update, is kept for the checkpoint. The two push modes are objects with one
interface (runtime/roles/push_apply.py), as the admission policies are (hpcrl.staleness).

Parameter shards (``aggregation.shards`` > 1): this rank owns shard 0's floats and optimizer state and decides for
all; ``self.shards`` (runtime/roles/shard_lead.py, an object as the push modes are) sends each step to the other
shards, waits after each publish until every shard has the version, and gives ``end_round`` and the checkpoint the
whole weights.

Rounds (Stellaris k, RLlib training iterations) end each time the learners have consumed
another ``plan.round_steps`` environment steps; ``policy.end_round`` and ``algo.end_round``
(e.g. PPO's adaptive KL coefficient) are called then, the latter with the round's episodes and
the learners' ``algo.learner_report`` results; rows from ``algo.records()`` go to run.h5.

Active actors: ``algo.end_round`` may return ``active_actors`` (MARLess actor scaling; the one key of
``hpcrl.algos.base.ROUND_CHANGES``, any other is an error). Actor ranks 0 .. n-1 then sample and the others
park (the ACTIVE_ACTORS counter word; a parked actor blocks in ``counters.wait_until`` and reports its
park, table ``actor_parks``), and the next round holds ``plan.round_steps_for(n)`` environment steps: the
round's data shrinks with its actors.
"""
from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from hpcrl.algos.base import round_changes
from hpcrl.config import (AggregationConfig, DebugConfig, EvalConfig, IOConfig, LaunchConfig, LearnersConfig,
                          StopConfig)
from hpcrl.io.rollback import record_counts
from hpcrl.io.schema import TRAJ_DIR
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.node_combine import push_records
from hpcrl.runtime.clock import Work
from hpcrl.runtime.messages import (ActorParked, Evaluation, FragmentReport, GroupEvent, JoiningJob, LearnerActivity,
                                    NodeReports, NodeSummary, PushHeader, SamplerEvent, Startup)
from hpcrl.runtime.roles.fragment_handlers import FragmentHandlers
from hpcrl.runtime.record.checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint
from hpcrl.runtime.record.cycle_profile import PARAMETER_PHASES, PhaseClock
from hpcrl.runtime.roles.active_groups import ActiveGroups
from hpcrl.runtime.roles.actor_ledger import ActorLedger
from hpcrl.runtime.roles.push_apply import apply_mode
from hpcrl.runtime.roles.shard_lead import lead_shards
from hpcrl.runtime.roles.freed_places import places_for
from hpcrl.runtime.record.run_record import RunRecord
from hpcrl.runtime.record.stop_rule import StopRule
from hpcrl.staleness import GradientRecord, make_policy

REPORTS_TURN_SECONDS, REPORTS_PER_DRAIN = 2e-3, 8
"""Rank 0 handles reports for about this long per turn of its loop (8 at a time), then looks at its mailbox again.
Drained whole, a backlog of node summaries (hundreds of nodes; each costs rank 0 a fraction of a millisecond) kept a
push waiting for tens of milliseconds, and under the groups' allreduce every group waits for group 0's push."""


class StopSignal:
    """SIGTERM / SIGUSR1 set a flag that the loop reads (checkpoint, then a clean stop). A signal that
    arrived while the rank was still starting (:func:`hpcrl.runtime.signals.early_signal`) counts too."""

    def __init__(self) -> None:
        from hpcrl.runtime.signals import STOP_SIGNALS, early_signal

        self.received: int | None = early_signal()
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.received = signum


@dataclass(frozen=True)
class ParameterSettings:
    """The config sections the parameter rank owns."""

    aggregation: AggregationConfig
    """The admission policy, the mailbox, the outer step of update pushes."""
    learners: LearnersConfig
    """Which groups are active: learners.active_range and the elastic rule's settings."""
    stop: StopConfig
    io: IOConfig
    """run.h5 and the checkpoints."""
    eval: EvalConfig
    """When to ask the last actor for evaluation episodes."""
    launch: LaunchConfig
    """The watchdog's silences."""
    debug: DebugConfig
    config_yaml: str
    """The resolved config (run.h5 keeps it)."""
    name: str = "run"
    """The config's name (the live scalars' W&B project and MLflow experiment)."""


class ParameterRank:
    """Owns the policy, the optimizer, the admission policy and run.h5."""

    def __init__(self, job, settings: ParameterSettings) -> None:
        self.job, self.settings, self.plan = job, settings, job.plan
        self.model, self.algo = job.model, job.algo
        self.flat = self.model.flat
        self._optimizer = None  # built on first use (see optimizer)
        # the other parameter shards (aggregation.shards): told each decision; this rank steps its own slice
        self.shards = lead_shards(job, settings.launch.watchdog_seconds)
        # what the groups push: gradients (the algorithm's optimizer steps) or updates (the outer step)
        self.push_mode = apply_mode(self.plan.push, self.algo, self.shards.model(self.model), self.plan.lr_schedule,
                                    settings.aggregation, self.plan.groups)
        self._postprocess_groups = self.plan.postprocess_groups
        self.policy = make_policy(self.settings.aggregation)
        self.counters, self.mailbox, self.board = job.counters, job.mailbox, job.board
        G = self.plan.groups
        self.version = 0
        self.round = 0
        self.consumed = 0  # env steps the learners trained on
        self.env_steps_start = 0  # env steps before this (resumed) job
        self.stop_rule = StopRule(self.settings.stop)
        self.seq_next = [0] * G
        self.group_nodes = job.topo.group_nodes  # each group's node: the order of a step's sum
        self.places = places_for(self.plan.on_policy, self.counters, G, self.push_mode.batches_in)
        self.ledger = ActorLedger(self.plan.actors)  # each actor's next fragment number and newest statistics
        self.wall_before = 0.0  # wall seconds of earlier jobs of this run (resume)
        self.queue: list[GradientRecord] = []
        self.groups = ActiveGroups(settings.learners, self.counters, self._new_version, settings.debug.active_groups)
        self.active_actors = self.plan.actors  # actor ranks 0 .. active_actors-1 sample (algo.end_round)
        self.round_end = self.plan.round_steps  # consumed env steps at which the current round ends
        self.stop_reason: str | None = None
        self.signals = StopSignal()
        self.time = job.clock  # wall or virtual (launch.runner=sim)
        self.fault = control.FaultInjector(self.settings.debug, job.rank, clock=job.clock)
        launch = settings.launch
        self.watchdog = control.Watchdog([r.role for r in job.topo.roles], job.topo.nodes, self.plan.groups,
                                         launch.watchdog_warn_seconds, launch.watchdog_seconds, job.clock)
        self.backoff = job.parameter_nap  # short under MPI (RMA progress), a doorbell in one process
        self.record = self._open_record()
        self.handlers = self._handlers()
        self.record.collect("weight_fetches", self._weight_fetch_rows)  # what the weight board served, per version
        self.summary: dict[str, Any] = {}  # the closing summary (after run)
        self.t0 = self.time.now()
        self._last_ckpt_update = self.record.updates
        self._last_ckpt_time = self.time.now()
        self._next_elastic = 0.0
        self.clock = PhaseClock(PARAMETER_PHASES, job.clock)  # where this rank's time goes (parameter_load)
        self.lap = self.clock.lap

    @property
    def optimizer(self):
        """Built on first use (the first applied step, a checkpoint, a resume), after the first publish:
        hpcrl's Adam costs nothing to build, but a torch.optim optimizer (``algo.optimizer: sgd``) imports
        torch._dynamo (about 1.5 s of CPU), which would delay every actor's first step."""
        if self._optimizer is None:
            self._optimizer = self.push_mode.make_optimizer()
        return self._optimizer

    # ---- set-up --------------------------------------------------------------------------
    def _open_record(self) -> RunRecord:
        """run.h5 made, or reopened after restoring the checkpoint (``--resume``)."""
        job, io = self.job, self.settings.io
        files = {"traj_layout": job.traj_layout, "num_actors": self.plan.actors} if self.plan.trajectory_files else {}
        if not job.resume:
            return RunRecord.create(job.run_dir, io, self.settings.config_yaml, job.topo.rank_map(), self.stop_rule,
                                    {"runner": job.runner, "num_params": self.flat.num_params}, **files,
                                    clock=job.clock, name=self.settings.name)
        state = load_checkpoint(job.run_dir)
        if state is None:
            raise RuntimeError(f"--resume: no checkpoint in {job.run_dir}")
        self._restore(state)
        return RunRecord.reopen(job.run_dir, io, job.topo.rank_map(), self.stop_rule,
                                {"discarded": job.rolled_back, "version": self.version},
                                {k: state[k] for k in ("episodes", "updates", "gradients", "admitted")}, **files,
                                env_steps=self.consumed, clock=job.clock, name=self.settings.name)

    def _weight_fetch_rows(self) -> dict:
        """The board's fetch counts per version (rows of a version once it is old enough that no late count can
        come; all of them once every actor and learner group is done)."""
        words = self.counters.read_all()
        return self.board.fetch_rows(final=words[control.ACTORS_DONE] >= self.plan.actors
                                     and words[control.LEARNERS_DONE] >= self.plan.groups)

    def startup_info(self) -> Startup:
        """What every rank learns at start (broadcast by runtime.runners.mpi)."""
        return Startup(start_unix=self.record.file.start_unix, version=self.version, seq_next=tuple(self.seq_next),
                       fragment_next=tuple(self.ledger.fragment_next), normalizers=tuple(self.ledger.normalizers),
                       group_states=self.push_mode.states(self.seq_next))

    def publish_initial(self) -> None:
        self.groups.from_algo(self.algo, self.model, self.record, events=False)
        self.counters.set(control.ACTIVE, self.groups.active)
        self.counters.set(control.ACTIVE_ACTORS, self.active_actors)
        self.counters.set(control.CONSUMED, self.consumed)
        if self.env_steps_start:
            self.counters.add(control.ENV_STEPS, self.env_steps_start)
        self._publish()

    # ---- checkpoint ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        with self.shards.whole_weights(self.flat, self.version):
            params = self.flat.params.detach().cpu().clone()
        return {
            "params": params, "optimizer": self.optimizer.state_dict(), "admission_policy": self.policy,
            "algo_state": self.algo.parameter_state(), "version": self.version, "round": self.round,
            "consumed": self.consumed,
            "env_steps": self.env_steps(), "episodes": self.record.episodes, "updates": self.record.updates,
            "gradients": self.record.gradients, "admitted": self.record.admitted, "returns": list(self.stop_rule.returns),
            "seq_next": list(self.seq_next), "active": self.groups.active,
            # received, counted in seq_next and consumed, not yet admitted: without them a resume
            # would leave a gap in their group's sequence numbers
            "queue": list(self.queue),
            "actors": self.plan.actors, "active_actors": self.active_actors, "round_end": self.round_end,
            "wall_seconds": self.wall_before + self.time.now() - self.t0,
            "rng": rng_state(), **self.ledger.state(),
            # rows of every table and steps of every trajectory file now: --resume cuts back to these
            "record": record_counts(self.job.run_dir, run_file=self.record.file, nodes=self.record.node_rows,
                                    node_steps=self.record.node_steps),
            "inner_states": self.push_mode.states(self.seq_next, self._drain_messages, self.time),
        }

    def _restore(self, s: dict[str, Any]) -> None:
        self.flat.load_(s["params"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.policy = s["admission_policy"]
        self.algo.load_parameter_state(s.get("algo_state", {}))
        self.version, self.round, self.consumed = s["version"], s["round"], s["consumed"]
        # env steps restart from what the trajectory files hold at the checkpoint (sampled, unwritten ones are redone)
        # (less the steps of files found missing or short at the resume: io/rollback.py's lost_steps)
        lost = sum(((self.job.rolled_back or {}).get("lost_steps") or {}).values())
        self.env_steps_start = (sum(s["record"]["traj_steps"].values()) - lost) if "record" in s else s["env_steps"]
        self.ledger.restore(s, self.plan.actors)
        self.stop_rule.add_returns(s["returns"])
        self.seq_next = list(s["seq_next"])
        self.queue = list(s.get("queue", []))
        self.places.restore(self.seq_next)
        self.push_mode.restore(s.get("inner_states", {}), self.seq_next)
        self.groups.restore(s["active"])
        # all of the checkpointing job's actors active: all of this job's too (fragment_next keeps the numbers of
        # actors a smaller job left out, so its length is not that job's actor count)
        A, before = self.plan.actors, s.get("actors", len(s.get("fragment_next", [])))
        self.active_actors = A if s.get("active_actors", before) >= before else min(max(s["active_actors"], 1), A)
        self.round_end = s.get("round_end", (self.round + 1) * self.plan.round_steps)
        self.wall_before = s["wall_seconds"]
        restore_rng(s["rng"])

    def checkpoint(self) -> Path:
        self.record.flush()
        path = save_checkpoint(self.job.run_dir, self.state())
        self._last_ckpt_update = self.record.updates
        self._last_ckpt_time = self.time.now()
        return path

    # ---- the loop ------------------------------------------------------------------------
    def env_steps(self) -> int:
        return self.counters.read(control.ENV_STEPS)

    def run(self) -> None:
        progress = self.job.progress
        lap = self.lap
        self.clock.restart()
        wall_limit_at = self._wall_limit_at()
        while self.stop_reason is None:
            self.fault.check()
            busy = self._receive_gradients()
            busy |= self._drain_messages()
            lap("record")
            now = self.time.now()
            if now >= self._next_elastic or now >= wall_limit_at:  # stop.max_wall_seconds to the turn
                self._next_elastic = now + 0.5
                self._watch()
                self.groups.elastic(now, self.record)
                self._check_stop()
                progress.update(self.stats())
                lap("other")
                self.record.load(self.clock)
            if (self.record.updates - self._last_ckpt_update >= self.settings.io.checkpoint_every
                    and now - self._last_ckpt_time >= self.settings.io.checkpoint_min_seconds):
                self.checkpoint()
                lap("other")
            self.record.maybe_flush()
            lap("record")
            if busy:
                self.backoff.reset()
            else:
                self.backoff.sleep()
                lap("idle")
        self._shutdown()

    def _receive_gradients(self) -> bool:
        got = self.mailbox.poll()
        self.lap("receive" if got else "idle")  # a poll that finds nothing is part of waiting
        for header, grad in got:
            finite = np.isfinite(grad).all()
            for rec in self._arrived(header, grad):  # a node's combined push (learners.combine=node): its groups'
                self._take(rec, finite)
        self.places.publish()
        return bool(got)

    def _take(self, rec: GradientRecord, finite: bool) -> None:
        """One push's record: counted, dropped when its gradient is not finite, else queued and admitted."""
        new_steps = int(rec.stats.get("new_env_steps", 0))
        self.groups.rule.gradient(self.time.now(), new_steps, float(rec.stats.get("busy_seconds", math.nan)))
        self.record.consumed(new_steps, float(rec.stats.get("compute_seconds", 0.0)))
        if not finite:
            self.shards.drop(rec)
            self.places.applied([rec])
            self.consumed += new_steps
            self.record.gradient(rec, False, "nonfinite", self.version, self.round)
            return
        self.queue.append(rec)
        self.time.did(Work.ADMIT)
        self.push_mode.admitting(self.counters, self.consumed + new_steps)
        self.lap("admit")
        self._admit()
        # counted after the step it came with: a batch's last gradient (the one that reports its steps)
        # is applied at the batch's own annealed lr, not the next batch's
        self.consumed += new_steps
        while self.consumed >= self.round_end and self.stop_reason is None:
            self._end_round()
            if self.settings.stop.max_rounds is not None and self.round >= self.settings.stop.max_rounds:
                self._check_stop()  # exactly max_rounds rounds
            self.lap("other")

    def _arrived(self, header: PushHeader, grad: np.ndarray) -> list[GradientRecord]:
        """A push copied out of the mailbox, counted, as the admission policy's records."""
        recs = push_records(header, grad, self.plan.combine, self.group_nodes, len(control.GRAD_STATS),
                            self.record.now())
        self.record.arrived(len(recs))
        for rec in recs:
            self.seq_next[rec.group] = max(self.seq_next[rec.group], rec.seq + 1)
        return recs

    def _admit(self) -> None:
        lap = self.lap
        pushing = self.push_mode.pushing(self.groups.active, self._postprocess_groups)
        while (adm := self.policy.admit(self.queue, self.version, pushing)) is not None:
            lap("admit")
            for step in adm.steps:
                if self.push_mode.lr_schedule is not None:
                    self._set_lr()
                self.shards.step(self.version + 1, step, self.optimizer.param_groups[0]["lr"])
                self.push_mode.apply(self.optimizer, self.algo.aggregate(step))
                self.time.did(Work.APPLY)
                self.version += 1
                t_agg = lap("apply")
                self._publish()
                t_pub = lap("publish")
                self.record.step(step, adm, self.version, self.round, self.optimizer.param_groups[0]["lr"],
                                 self.groups.active, t_agg, t_pub)
                self.places.applied(rec for rec, _ in step)
                lap("record")
            adm.remove_from(self.queue)
        lap("admit")
        if self.plan.pacing == "held":
            self.groups.hold(self.queue)

    def _set_lr(self) -> None:
        """The algorithm's schedule at the env steps consumed so far (so a resumed run goes on where it stopped)."""
        lr = self.push_mode.lr_schedule.at(self.consumed)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _new_version(self) -> None:
        self.version += 1
        self._publish()

    def _publish(self) -> None:
        probe = self.job.probe_outputs(self.model) if self.job.probe_size else None
        self.shards.publish(self.version, self.flat.numpy(), probe)  # visible once every shard has it

    def _end_round(self) -> None:
        stats = self.record.end_round(self.round, self.consumed, self.policy.threshold, self.groups.active,
                                      len(self.queue))
        self.policy.end_round(self.round)
        # a changed setting (e.g. the KL coefficient) is in the flat buffer: it reaches the learners
        # with the next published version; what is returned (algos.base.ROUND_CHANGES) is acted on here
        with self.shards.whole_weights(self.flat, self.version):
            changed = round_changes(self.algo, self.algo.end_round(self.model, {
                **stats, "actors": {"count": self.plan.actors, "active": self.active_actors}}))
        schedule = self.settings.debug.active_actors
        if schedule:  # tests of the parking machinery
            changed["active_actors"] = schedule[min(self.round, len(schedule) - 1)]
        if "active_actors" in changed:  # actors 0 .. n-1 sample the next round, the others park
            self.active_actors = min(max(int(changed["active_actors"]), 1), self.plan.actors)
            self.counters.set(control.ACTIVE_ACTORS, self.active_actors)
            for a in range(self.active_actors, self.plan.actors):  # parked actors supply nothing
                self.groups.rule.actor_rate.pop(a, None)
        self.groups.end_round(self.round, self.algo, self.model, self.record)
        self.round_end += self.plan.round_steps_for(self.active_actors)
        self.record.algo_rows(self.algo.records())
        self.round += 1
        if self.settings.eval.episodes and self.round % self.settings.eval.every_rounds == 0:
            self.counters.set(control.EVAL, self.round)  # the last actor evaluates (runtime/roles/evaluation.py)

    def _drain_messages(self) -> bool:
        """The reports that have arrived, each to its handler (``handlers``), for ``REPORTS_TURN_SECONDS`` at the
        most; whether there was any."""
        start, handled = self.time.now(), False
        while True:
            got = self.job.reports.drain(REPORTS_PER_DRAIN)
            for message in got:
                self.handlers[type(message)](message)
            handled |= bool(got)
            if len(got) < REPORTS_PER_DRAIN or self.time.now() - start >= REPORTS_TURN_SECONDS:
                return handled

    def _handlers(self) -> dict[type, Callable[[Any], None]]:
        """The one handler of each message a rank sends here (hpcrl.runtime.messages)."""
        record = self.record
        reports = FragmentHandlers(self.groups, self.ledger, record, self.env_steps,
                                   lambda message: self.handlers[type(message)](message))
        return {FragmentReport: reports.fragment, NodeReports: reports.node, NodeSummary: reports.summary,
                ActorParked: record.actor_park, SamplerEvent: record.actor_join, Evaluation: record.evaluation,
                LearnerActivity: self._learner_activity, GroupEvent: record.group_row, JoiningJob: record.joining_job}

    def _learner_activity(self, activity: LearnerActivity) -> None:
        self.push_mode.group_state(activity.group_state)
        self.record.activity(activity)

    def _watch(self) -> None:
        for line in self.watchdog.check(self.counters.read_all()):
            print(line, flush=True)

    def _wall_limit_at(self) -> float:
        """When (on this job's clock) stop.max_wall_seconds is reached: checked each turn, other rules each 0.5 s."""
        limit = self.settings.stop.max_wall_seconds
        return math.inf if limit is None else self.t0 + limit - self.wall_before

    def _check_stop(self) -> None:
        if self.signals.received is not None:
            self.stop_reason = f"signal {signal.Signals(self.signals.received).name}"
        else:
            self.stop_reason = self.stop_rule.reason(self.env_steps(), self.wall_before + self.time.now() - self.t0,
                                                     self.round)

    def stats(self) -> dict[str, Any]:
        return self.record.stats(self.env_steps(), self.settings.stop.total_env_steps, self.version, self.groups.active,
                                 self.plan.groups, self.round, self.wall_before + self.time.now() - self.t0)

    # ---- the end -------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Tell everyone to stop, keep draining until actors and learners are done, checkpoint."""
        self.counters.set(control.STOP, 1)
        G, A = self.plan.groups, self.plan.actors
        self.backoff.reset()
        while True:
            busy = self._drain_messages()
            for header, grad in self.mailbox.poll():  # pushes that were already under way
                self.queue += self._arrived(header, grad)
                busy = True
            if self.counters.read(control.ACTORS_DONE) >= A and self.counters.read(control.LEARNERS_DONE) >= G:
                if not self._drain_messages():
                    break
            if self.time.now() >= self._next_elastic:  # a stuck rank must not hang the shutdown either
                self._next_elastic = self.time.now() + 0.5
                self._watch()
                self.job.progress.update(self.stats())  # rank 0's heartbeat for the launcher's watch of it
            self.backoff.reset() if busy else self.backoff.sleep()
        for rec in self.queue:
            self.record.gradient(rec, False, "shutdown", self.version, self.round)
        self.queue.clear()
        ckpt = self.checkpoint()
        self.summary = self.record.summary(self.stats(), self.stop_reason, self.job.run_dir, {
            "trajectories": trajectory_files(self.plan, self.job.run_dir),
            "checkpoint": str(ckpt)}, push=self.plan.push, sampled_with=sampled_with(self.plan))
        self.record.close()
        self.shards.close()
        self.job.progress.finish(self.summary)

    def close_on_error(self) -> None:
        """Flush what is buffered (called before MPI_Abort)."""
        self.record.close_on_error()


def sampled_with(plan) -> str:
    """The summary's line on the weights the actors sample with."""
    if plan.on_policy:
        return "the weights the previous batch made (actors.on_policy=true)"
    return "weights up to a batch old: actors sample the next batch while learners train (actors.on_policy=false)"


def trajectory_files(plan, run_dir: Path) -> str:
    """The summary's trajectories line."""
    if not plan.trajectory_files:
        return "none (launch.sim_actors=node)"
    return f"{run_dir / TRAJ_DIR}/actor-NNNNN.h5 ({plan.actors} files)"
