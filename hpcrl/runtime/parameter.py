"""The parameter rank's loop: admit gradients, step the optimizer, publish weights, keep the record.

Each pass: copy finished gradients out of the mailbox (never waiting on a learner); after
each arrival ask the admission policy (hpcrl.staleness) what to apply; apply each admitted
step (``algo.apply``: one optimizer step on ``(1/H) sum_c (alpha_c/alpha_0) g_c``) and publish
the new version; drain the actors' fragment reports (episodes) and the learners' activity rows;
every half second let the elastic rule (runtime/elastic.py: actors' supply of env steps vs the
groups' measured capacity) activate or park a learner group; stop on ``cfg.stop`` or a signal,
checkpoint, and take part in the shutdown.

Adam and Stellaris' per-gradient learning rate (Eq. 4): the optimizer keeps its base rate
alpha_0 and receives each gradient scaled by alpha_c/alpha_0 before averaging, so with SGD
the update is exactly the paper's ``theta -= (1/H) sum_c alpha_c g_c``; with Adam the moment
estimates are those of the gradients actually applied (see hpcrl.staleness for what Adam's
normalisation does to a shared scale).

Rounds (Stellaris k, RLlib training iterations) end each time the learners have consumed
another ``plan.round_steps`` environment steps; ``policy.end_round`` and ``algo.end_round``
(e.g. PPO's adaptive KL coefficient) are called then, the latter with the round's episodes and
the learners' ``algo.learner_report`` results; rows from ``algo.records()`` go to run.h5.

Active actors: ``algo.end_round`` may return ``active_actors`` (MARLess actor scaling). Actor ranks
0 .. n-1 then sample and the others park (the ACTIVE_ACTORS counter word; a parked actor blocks in
``counters.wait_until`` and reports its park, table ``actor_parks``), and the next round holds
``plan.round_steps_for(n)`` environment steps: the round's data shrinks with its actors.
"""
from __future__ import annotations

import json
import math
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from hpcrl.io import RunFile
from hpcrl.io.rollback import record_counts
from hpcrl.io.schema import GRADIENT_REASONS, RUN_FILE, TRAJ_DIR
from hpcrl.runtime import control
from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.checkpoint import load_checkpoint, restore_rng, rng_state, save_checkpoint
from hpcrl.runtime.cycle_profile import PARAMETER_PHASES, PhaseClock
from hpcrl.runtime import elastic
from hpcrl.runtime.rows import RowBuffer
from hpcrl.runtime.stop_rule import StopRule
from hpcrl.staleness import GradientRecord, make_policy

REASON = {name: i for i, name in enumerate(GRADIENT_REASONS)}


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


class ParameterRank:
    """Owns the policy, the optimizer, the admission policy and run.h5."""

    def __init__(self, job) -> None:
        self.job, self.cfg, self.plan = job, job.cfg, job.plan
        self.model, self.algo = job.model, job.algo
        self.flat = self.model.flat
        self._optimizer = None  # built on first use (see optimizer)
        self._lr_schedule = self.plan.lr_schedule  # the algorithm's (PPO: algo.lr_anneal), None: constant
        self._postprocess_groups = self.plan.postprocess_groups
        self.policy = make_policy(self.cfg.aggregation)
        self.counters, self.mailbox, self.board = job.counters, job.mailbox, job.board
        G = self.cfg.learners.groups
        self.version = 0
        self.round = 0
        self.consumed = 0  # env steps the learners trained on
        self.env_steps_start = 0  # env steps before this (resumed) job
        self.episodes = 0
        self.updates = 0
        self.gradients = 0
        self.admitted = 0
        self.stop_rule = StopRule(self.cfg.stop)
        self.seq_next = [0] * G
        self.fragment_next = [0] * self.cfg.actors.count  # each actor's next fragment number (kept on resume)
        self.normalizers: list[dict | None] = [None] * self.cfg.actors.count  # each actor's newest statistics
        self._held: dict[int, bool] = {}  # ssp: groups told to wait
        self.wall_before = 0.0  # wall seconds of earlier jobs of this run (resume)
        self.queue: list[GradientRecord] = []
        self.active = self.cfg.learners.active_range[0]
        self.algo_sets_groups = False  # algo.learner_groups_needed decides them (MARL policy learners)
        self.active_actors = self.cfg.actors.count  # actor ranks 0 .. active_actors-1 sample (algo.end_round)
        self.round_end = self.plan.round_steps  # consumed env steps at which the current round ends
        lcfg = self.cfg.learners
        self.elastic = elastic.ElasticRule(*lcfg.active_range, lcfg.elastic_headroom, lcfg.elastic_seconds)
        self.stop_reason: str | None = None
        self.signals = StopSignal()
        self.fault = control.FaultInjector(self.cfg.debug, job.rank)
        launch_cfg = self.cfg.launch
        self.watchdog = control.Watchdog([r.role for r in job.topo.roles], job.topo.nodes, self.cfg.learners.groups,
                                         launch_cfg.watchdog_warn_seconds, launch_cfg.watchdog_seconds)
        # RMA against this rank's windows progresses only while it is inside MPI (MPICH/UCX
        # active messages), so its idle naps stay short: a learner's push waits for them.
        self.backoff = Backoff(2e-5, 2e-4)
        self._round_stats = self._new_round_stats()
        self._staleness_recent: deque[int] = deque(maxlen=64)
        self.run_file = self._open_run_file()
        self.rows = RowBuffer(self.run_file)  # the frequent rows, appended a table at a time
        self.t0 = time.monotonic()
        self._round_t0 = self.run_file.now()
        self._last_ckpt_update = self.updates
        self._last_ckpt_time = time.monotonic()
        self._next_elastic = 0.0
        self.clock = PhaseClock(PARAMETER_PHASES)  # where this rank's time goes (parameter_load)
        self.lap = self.clock.lap
        self._load_counts = (self.gradients, self.admitted, self.updates)

    @property
    def optimizer(self):
        """Built on first use (the first applied step, a checkpoint, a resume), after the first publish:
        hpcrl's Adam costs nothing to build, but a torch.optim optimizer (``algo.optimizer: sgd``) imports
        torch._dynamo (about 1.5 s of CPU), which would delay every actor's first step."""
        if self._optimizer is None:
            self._optimizer = self.algo.make_optimizer(self.model)
        return self._optimizer

    # ---- set-up --------------------------------------------------------------------------
    def _open_run_file(self) -> RunFile:
        path = self.job.run_dir / RUN_FILE
        if self.job.resume:
            state = load_checkpoint(self.job.run_dir)
            if state is None:
                raise RuntimeError(f"--resume: no checkpoint in {self.job.run_dir}")
            self._restore(state)
            note = json.dumps({"discarded": self.job.rolled_back, "version": self.version})
            return RunFile.open_append(path, flush_seconds=self.cfg.io.flush_seconds, note=note,
                                       rank_map=self._rank_map(), traj_layout=self.job.traj_layout,
                                       num_actors=self.cfg.actors.count)
        return RunFile.create(path, self.cfg.to_yaml(), self._rank_map(), self.cfg.io.compression,
                              traj_layout=self.job.traj_layout, num_actors=self.cfg.actors.count,
                              flush_seconds=self.cfg.io.flush_seconds,
                              attrs={"runner": self.job.runner, "num_params": self.flat.num_params})

    def _rank_map(self) -> dict[str, list]:
        roles = self.job.topo.roles
        codes = {"parameter": 0, "learner": 1, "actor": 2}
        actor_ranks = self.job.topo.actor_ranks
        return {
            "rank": np.arange(len(roles)),
            "role": [codes[r.role] for r in roles],
            "group": [r.group for r in roles],
            "index": [actor_ranks.index(i) if r.role == "actor" else max(r.group_rank, 0)
                      for i, r in enumerate(roles)],
            "node": [n.encode()[:64] for n in self.job.topo.nodes],
        }

    def startup_info(self) -> dict[str, Any]:
        """What every rank learns at start (broadcast by runtime.main)."""
        return {"start_unix": self.run_file.start_unix, "version": self.version, "seq_next": list(self.seq_next),
                "fragment_next": list(self.fragment_next), "normalizers": list(self.normalizers)}

    def publish_initial(self) -> None:
        self._groups_from_algo(record=False)
        self.counters.set(control.ACTIVE, self.active)
        self.counters.set(control.ACTIVE_ACTORS, self.active_actors)
        if self.env_steps_start:
            self.counters.add(control.ENV_STEPS, self.env_steps_start)
        self._publish()

    # ---- checkpoint ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "params": self.flat.params.detach().cpu().clone(),
            "optimizer": self.optimizer.state_dict(),
            "admission_policy": self.policy,
            "algo_state": self.algo.parameter_state(),
            "version": self.version, "round": self.round, "consumed": self.consumed,
            "env_steps": self.env_steps(), "episodes": self.episodes, "updates": self.updates,
            "gradients": self.gradients, "admitted": self.admitted, "returns": list(self.stop_rule.returns),
            "seq_next": list(self.seq_next), "active": self.active,
            # received, counted in seq_next and consumed, not yet admitted: without them a resume
            # would leave a gap in their group's sequence numbers
            "queue": list(self.queue),
            "active_actors": self.active_actors, "round_end": self.round_end,
            "wall_seconds": self.wall_before + time.monotonic() - self.t0,
            "rng": rng_state(), "fragment_next": list(self.fragment_next), "normalizers": list(self.normalizers),
            # rows of every table and steps of every trajectory file now: --resume cuts back to these
            "record": record_counts(self.job.run_dir, run_file=self.run_file),
        }

    def _restore(self, s: dict[str, Any]) -> None:
        self.flat.load_(s["params"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.policy = s["admission_policy"]
        self.algo.load_parameter_state(s.get("algo_state", {}))
        self.version, self.round, self.consumed = s["version"], s["round"], s["consumed"]
        # env steps restart from what the trajectory files hold at the checkpoint (sampled, unwritten ones are redone)
        self.env_steps_start = sum(s["record"]["traj_steps"].values()) if "record" in s else s["env_steps"]
        kept = list(s.get("fragment_next", []))  # a resume may bring more actors: they start at 0
        self.fragment_next = kept + [0] * max(self.cfg.actors.count - len(kept), 0)
        saved = list(s.get("normalizers", []))[:self.cfg.actors.count]  # an actor added by the resume starts from
        self.normalizers = [saved[i] if i < len(saved) else saved[i % len(saved)] if saved else None  # another's
                            for i in range(self.cfg.actors.count)]
        self.episodes, self.updates = s["episodes"], s["updates"]
        self.gradients, self.admitted = s["gradients"], s["admitted"]
        self.stop_rule.add_returns(s["returns"])
        self.seq_next = list(s["seq_next"])
        self.queue = list(s.get("queue", []))
        self.active = min(max(s["active"], self.cfg.learners.active_range[0]), self.cfg.learners.active_range[1])
        A, before = self.cfg.actors.count, len(kept)  # all of the old actors active: all of the new ones too
        self.active_actors = A if s.get("active_actors", before) >= before else min(max(s["active_actors"], 1), A)
        self.round_end = s.get("round_end", (self.round + 1) * self.plan.round_steps)
        self.wall_before = s["wall_seconds"]
        restore_rng(s["rng"])

    def checkpoint(self) -> Path:
        self.rows.flush()
        self.run_file.flush()
        path = save_checkpoint(self.job.run_dir, self.state())
        self._last_ckpt_update = self.updates
        self._last_ckpt_time = time.monotonic()
        return path

    # ---- the loop ------------------------------------------------------------------------
    def env_steps(self) -> int:
        return self.counters.read(control.ENV_STEPS)

    def run(self) -> None:
        progress = self.job.progress
        lap = self.lap
        self.clock.restart()
        while self.stop_reason is None:
            self.fault.check()
            busy = self._receive_gradients()
            busy |= self._drain_messages()
            lap("record")
            now = time.monotonic()
            if now >= self._next_elastic:
                self._next_elastic = now + 0.5
                self._watch()
                self._elastic()
                self._check_stop()
                progress.update(self.stats())
                lap("other")
                self._load_row()
            if (self.updates - self._last_ckpt_update >= self.cfg.io.checkpoint_every
                    and now - self._last_ckpt_time >= self.cfg.io.checkpoint_min_seconds):
                self.checkpoint()
                lap("other")
            self.run_file.maybe_flush()
            lap("record")
            if busy:
                self.backoff.reset()
            else:
                self.backoff.sleep()
                lap("idle")
        self._shutdown()

    def _load_row(self) -> None:
        """One parameter_load row: the interval since the last one (gradients in, phases, absorption rate)."""
        elapsed, sec = self.clock.take()
        g0, a0, u0 = self._load_counts
        self._load_counts = (self.gradients, self.admitted, self.updates)
        n = self.gradients - g0
        work = sec["receive"] + sec["admit"] + sec["apply"] + sec["publish"]
        self.rows.flush()
        self.run_file.append("parameter_load", {
            "time": self.run_file.now(), "interval_seconds": elapsed, "gradients": n, "applied": self.admitted - a0,
            "updates": self.updates - u0, **{f"{p}_seconds": sec[p] for p in PARAMETER_PHASES},
            "absorption_rate": n / work if n and work > 0 else math.nan,
            "arrival_rate": n / elapsed if elapsed > 0 else math.nan,
        })

    def _receive_gradients(self) -> bool:
        got = self.mailbox.poll()
        self.lap("receive" if got else "idle")  # a poll that finds nothing is part of waiting
        for header, grad in got:
            rec = self._arrived(header, grad)
            stats = rec.stats
            new_steps = int(stats.get("new_env_steps", 0))
            self.elastic.gradient(time.monotonic(), new_steps, float(stats.get("busy_seconds", math.nan)))
            self._round_stats["env_steps"] += new_steps
            self._round_stats["learner_seconds"] += float(stats.get("compute_seconds", 0.0))
            if not np.isfinite(grad).all():
                self.consumed += new_steps
                self._gradient_row(rec, admitted=False, reason="nonfinite")
                continue
            self.queue.append(rec)
            self.lap("admit")
            self._admit()
            # counted after the step it came with: a batch's last gradient (the one that reports its steps)
            # is applied at the batch's own annealed lr, not the next batch's
            self.consumed += new_steps
            while self.consumed >= self.round_end and self.stop_reason is None:
                self._end_round()
                if self.cfg.stop.max_rounds is not None and self.round >= self.cfg.stop.max_rounds:
                    self._check_stop()  # exactly max_rounds rounds
                self.lap("other")
        if got and self.cfg.actors.on_policy:  # the groups' pushes so far are applied (or queued) and published
            G = self.cfg.learners.groups
            for g in {header["group"] for header, _ in got}:
                self.counters.set(control.taken_word(G, g), self.seq_next[g])
        return bool(got)

    def _arrived(self, header: dict, grad: np.ndarray) -> GradientRecord:
        """A gradient copied out of the mailbox, counted, as the admission policy's record."""
        rec = GradientRecord(group=header["group"], seq=header["seq"], base_version=header["base_version"],
                             samples=header["samples"], grad=grad, stats=dict(zip(control.GRAD_STATS, header["stats"])),
                             received_at=self.run_file.now())
        self.gradients += 1
        self.seq_next[rec.group] = max(self.seq_next[rec.group], rec.seq + 1)
        return rec

    def _admit(self) -> None:
        lap = self.lap
        pushing = self.active - self._postprocess_groups  # a post-processing group pushes no gradient
        while (adm := self.policy.admit(self.queue, self.version, pushing)) is not None:
            lap("admit")
            for step in adm.steps:
                if self._lr_schedule is not None:
                    self._set_lr()
                self.algo.apply(self.model, self.optimizer, self.algo.aggregate(step))
                self.version += 1
                t_agg = lap("apply")
                self._publish()
                t_pub = lap("publish")
                self._update_row(step, adm, t_agg, t_pub)
                lap("record")
            adm.remove_from(self.queue)
        lap("admit")
        if self.plan.pacing == "held":  # SSP: a group with a held gradient waits before computing more
            held = {rec.group for rec in self.queue}
            for g in range(self.cfg.learners.groups):
                if g in held or self._held.get(g):
                    self._held[g] = g in held
                    self.counters.set(control.held_word(self.cfg.learners.groups, g), int(g in held))

    def _set_lr(self) -> None:
        """The algorithm's schedule at the env steps consumed so far (so a resumed run goes on where it stopped)."""
        lr = self._lr_schedule.at(self.consumed)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _publish(self) -> None:
        probe = self.job.probe_outputs(self.model) if self.job.probe_size else None
        self.board.publish(self.version, self.flat.numpy(), probe)

    def _update_row(self, step, adm, t_agg: float, t_pub: float) -> None:
        now = self.run_file.now()
        stale = [adm.staleness[rec.key] for rec, _ in step]
        losses = [rec.stats.get("loss", math.nan) for rec, _ in step]
        self.updates += 1
        for rec, scale in step:
            self._gradient_row(rec, True, "admitted", adm.staleness[rec.key], scale, now)
        self._staleness_recent.extend(stale)
        self._round_stats["staleness"].extend(stale)
        self._round_stats["loss"].extend(losses)
        self._round_stats["kl"].extend(rec.stats.get("kl", math.nan) for rec, _ in step)
        self._round_stats["updates"] += 1
        # most steps hold one gradient: plain floats then (numpy's reductions cost 5 us each, per update)
        loss_mean, loss_min, loss_max = ((losses[0],) * 3 if len(losses) == 1
                                         else (float(np.mean(losses)), float(np.min(losses)), float(np.max(losses))))
        self.rows.add("updates", {
            "time": now, "version": self.version, "round": self.round, "num_gradients": len(step),
            "staleness_mean": sum(stale) / len(stale), "staleness_max": int(max(stale)),
            "threshold": math.nan if adm.threshold is None else adm.threshold, "lr": self.optimizer.param_groups[0]["lr"],
            "loss_mean": loss_mean, "loss_min": loss_min, "loss_max": loss_max,
            "active_groups": self.active, "aggregate_seconds": t_agg, "publish_seconds": t_pub,
        })

    def _gradient_row(self, rec: GradientRecord, admitted: bool, reason: str, staleness: int | None = None,
                      scale: float = math.nan, now: float | None = None) -> None:
        now = self.run_file.now() if now is None else now
        self.admitted += int(admitted)
        self.rows.add("gradients", {
            "time": rec.received_at, "group": rec.group, "seq": rec.seq, "base_version": rec.base_version,
            "staleness": self.version - rec.base_version if staleness is None else staleness,
            "round": self.round, "lr_scale": scale, "samples": rec.samples, "loss": rec.stats.get("loss", math.nan),
            "admitted": int(admitted), "reason": REASON[reason], "queue_seconds": now - rec.received_at,
            "compute_seconds": rec.stats.get("compute_seconds", math.nan),
            "mailbox_wait_seconds": rec.stats.get("mailbox_wait_seconds", math.nan),
        })

    def _new_round_stats(self) -> dict[str, Any]:
        return {"env_steps": 0, "episodes": 0, "updates": 0, "staleness": [], "loss": [], "kl": [], "returns": [],
                "learner_seconds": 0.0, "actor_seconds": 0.0, "actors": set(), "active_max": 0,
                "episode_rows": [], "reports": []}

    def _end_round(self) -> None:
        r = self._round_stats
        now = self.run_file.now()
        st = np.asarray(r["staleness"], dtype=np.float64)
        ret = np.asarray(r["returns"], dtype=np.float64)

        def agg(a, fn):
            return float(fn(a)) if a.size else math.nan

        threshold = self.policy.threshold
        self.run_file.append("rounds", {
            "round": self.round, "start": self._round_t0, "duration": now - self._round_t0,
            "env_steps": r["env_steps"], "env_steps_total": self.consumed, "episodes": r["episodes"],
            "updates": r["updates"], "threshold": math.nan if threshold is None else threshold,
            "staleness_mean": agg(st, np.mean), "staleness_max": agg(st, np.max), "staleness_min": agg(st, np.min),
            "staleness_std": agg(st, np.std), "learner_seconds": r["learner_seconds"],
            "actor_seconds": r["actor_seconds"], "active_actors": len(r["actors"]),
            "active_groups": max(r["active_max"], self.active), "loss": agg(np.asarray(r["loss"], float), np.nanmean),
            "reward_mean": agg(ret, np.mean), "reward_max": agg(ret, np.max), "reward_min": agg(ret, np.min),
            "reward_std": agg(ret, np.std),
        })
        self.policy.end_round(self.round)
        kl = np.asarray(r["kl"], float)
        # a changed setting (e.g. the KL coefficient) is in the flat buffer: it reaches the learners
        # with the next published version
        changed = self.algo.end_round(self.model, {
            "kl": agg(kl[np.isfinite(kl)], np.mean), "round": self.round, "episodes": r["episode_rows"],
            "reports": r["reports"], "actors": {"count": self.cfg.actors.count, "active": self.active_actors}})
        schedule = self.cfg.debug.active_actors
        if schedule:  # tests of the parking machinery
            changed = {**(changed or {}), "active_actors": schedule[min(self.round, len(schedule) - 1)]}
        if changed and "active_actors" in changed:  # actors 0 .. n-1 sample the next round, the others park
            self.active_actors = min(max(int(changed["active_actors"]), 1), self.cfg.actors.count)
            self.counters.set(control.ACTIVE_ACTORS, self.active_actors)
            for a in range(self.active_actors, self.cfg.actors.count):  # parked actors supply nothing
                self.elastic.actor_rate.pop(a, None)
        self._groups_from_algo(record=True)
        self.round_end += self.plan.round_steps_for(self.active_actors)
        for table, rows in self.algo.records().items():
            for row in rows:
                self.run_file.append(table, row)
        self.round += 1
        if self.cfg.eval.episodes and self.round % self.cfg.eval.every_rounds == 0:
            self.counters.set(control.EVAL, self.round)  # the last actor evaluates (runtime/evaluation.py)
        self._round_t0 = now
        self._round_stats = self._new_round_stats()

    def _drain_messages(self) -> bool:
        reports = self.job.reports
        busy = False
        for msg in reports.drain("episodes"):
            self._fragment_report(msg)
            busy = True
        for row in reports.drain("activity"):
            cycles, parked = row.pop("cycles", None), row.pop("parked", None)
            if (report := row.pop("algo_report", None)) is not None:  # algo.learner_report -> algo.end_round
                self._round_stats["reports"].append(report)
            if parked:
                self.run_file.append("elastic_events", self._times(parked, ("time",)))
            if "time_start" in row:
                self.run_file.append("learner_activity", self._times(row, ("time_start", "time_end")))
            if cycles and cycles["time"]:
                self.run_file.append("learner_cycles", self._times(cycles, ("time",)))
            busy = True
        for msg in reports.drain("eval"):
            head = {"time": msg["time"] - self.run_file.start_unix, "round": msg["round"],
                    "policy_version": msg["policy_version"]}
            for ep in msg["episodes"]:
                self.run_file.append("eval_episodes", {**head, **ep})
            busy = True
        return busy

    def _times(self, row: dict, keys) -> dict:
        """Rows from other ranks carry Unix times; the tables count from the run start."""
        t0 = self.run_file.start_unix
        return {k: (np.asarray(v, dtype=np.float64) - t0 if k in keys else v) for k, v in row.items()}

    def _fragment_report(self, msg: dict) -> None:
        if "park" in msg:  # an actor's park ended (runtime/actor.py)
            self.run_file.append("actor_parks", self._times(msg["park"], ("time",)))
            return
        r = self._round_stats
        r["actor_seconds"] += msg["fragment"]["sample_seconds"]
        a = msg["fragment"]["actor"]
        self.elastic.fragment(a, msg["fragment"]["steps"], msg["fragment"]["sample_seconds"])
        self.fragment_next[a] = max(self.fragment_next[a], msg["fragment"]["fragment"] + 1)
        if msg.get("normalizer") is not None:
            self.normalizers[a] = msg["normalizer"]
        r["actors"].add(msg["fragment"]["actor"])
        self.rows.add("actors", self._times(msg["fragment"], ("time",)))
        episodes = msg["episodes"]
        if not episodes:
            return
        steps = self.env_steps()
        for ep in episodes:
            ep = self._times(ep, ("time",))
            ep["env_steps"] = steps
            self.rows.add("episodes", ep)
            self.stop_rule.add_returns([ep["return"]])
            r["returns"].append(ep["return"])
            r["episode_rows"].append({k: ep[k] for k in ("actor", "env_index", "return")})
        self.episodes += len(episodes)
        r["episodes"] += len(episodes)

    def _watch(self) -> None:
        for line in self.watchdog.check(self.counters.read_all()):
            print(line, flush=True)

    def _groups_from_algo(self, record: bool) -> None:
        """Active learner groups as ``algo.learner_groups_needed`` says (MARL policy learners: one per policy),
        each group activated or parked by the change a row of elastic_events (with ``record``)."""
        G = self.cfg.learners.groups
        need = self.algo.learner_groups_needed(self.model, G)
        self.algo_sets_groups = need is not None
        if need is None or (need := min(max(int(need), 1), G)) == self.active:
            return
        more = need > self.active
        changed = range(self.active, need) if more else range(need, self.active)
        self.active = need
        if record:  # the new map first: a learner that sees the new count then pulls weights with the map behind it
            self.version += 1
            self._publish()
        self.counters.set(control.ACTIVE, need)
        self._round_stats["active_max"] = max(self._round_stats["active_max"], need)
        for g in changed if record else ():
            self.run_file.append("elastic_events", {
                "time": self.run_file.now(), "group": g, "action": elastic.ACTION["activate" if more else "park"],
                "reason": elastic.REASON["policies_split" if more else "policies_merged"], "active_groups": need,
                "supply_rate": math.nan, "group_rate": math.nan, "load": math.nan, "fragments_waiting": -1})

    def _elastic(self) -> None:
        """Activate or park one learner group when the elastic rule says so; record the decision."""
        lo, hi = self.cfg.learners.active_range
        if lo == hi or self.algo_sets_groups:
            return
        words = self.counters.read_all()
        waiting = int(sum(words[control.BACKLOG + g] for g in range(self.active)))
        d = self.elastic.decide(time.monotonic(), self.active, waiting)
        if d is None:
            return
        group = self.active if d.action == "activate" else self.active - 1
        self.active = d.active
        self.counters.set(control.ACTIVE, self.active)
        self._round_stats["active_max"] = max(self._round_stats["active_max"], self.active)
        self.run_file.append("elastic_events", {
            "time": self.run_file.now(), "group": group, "action": elastic.ACTION[d.action],
            "reason": elastic.REASON[d.reason],
            "active_groups": self.active, "supply_rate": d.supply, "group_rate": d.capacity, "load": d.load,
            "fragments_waiting": waiting})

    def _check_stop(self) -> None:
        if self.signals.received is not None:
            self.stop_reason = f"signal {signal.Signals(self.signals.received).name}"
        else:
            self.stop_reason = self.stop_rule.reason(self.env_steps(), self.wall_before + time.monotonic() - self.t0,
                                                     self.round)

    def mean_return(self) -> float:
        return self.stop_rule.mean_return()

    def stats(self) -> dict[str, Any]:
        return {
            "env_steps": self.env_steps(), "total_steps": self.cfg.stop.total_env_steps, "episodes": self.episodes,
            "mean_return": self.mean_return(), "version": self.version,
            "staleness": float(np.mean(self._staleness_recent)) if self._staleness_recent else math.nan,
            "active_groups": self.active, "groups": self.cfg.learners.groups, "round": self.round,
            "elapsed": self.wall_before + time.monotonic() - self.t0,
        }

    # ---- the end -------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Tell everyone to stop, keep draining until actors and learners are done, checkpoint."""
        self.counters.set(control.STOP, 1)
        G, A = self.cfg.learners.groups, self.cfg.actors.count
        backoff = Backoff(2e-5, 2e-4)
        while True:
            busy = self._drain_messages()
            for header, grad in self.mailbox.poll():  # pushes that were already under way
                self.queue.append(self._arrived(header, grad))
                busy = True
            if self.counters.read(control.ACTORS_DONE) >= A and self.counters.read(control.LEARNERS_DONE) >= G:
                if not self._drain_messages():
                    break
            if time.monotonic() >= self._next_elastic:  # a stuck rank must not hang the shutdown either
                self._next_elastic = time.monotonic() + 0.5
                self._watch()
            backoff.reset() if busy else backoff.sleep()
        for rec in self.queue:
            self._gradient_row(rec, admitted=False, reason="shutdown")
        self.queue.clear()
        ckpt = self.checkpoint()
        summary = {**self.stats(), "stop_reason": self.stop_reason, "run_dir": str(self.job.run_dir),
                   "return_window": self.cfg.stop.return_window, "gradients": self.gradients,
                   "admitted": self.admitted,
                   "files": {"record": str(self.run_file.path),
                             "trajectories": f"{self.job.run_dir / TRAJ_DIR}/actor-NNNNN.h5 ({self.cfg.actors.count} files)",
                             "checkpoint": str(ckpt), "config": str(self.job.run_dir / "config.yaml")}}
        self.run_file.close()
        self.job.progress.finish(summary)

    def close_on_error(self) -> None:
        """Flush what is buffered (called before MPI_Abort)."""
        for step in (self.rows.flush, self.run_file.close):
            try:
                step()
            except Exception:
                pass
