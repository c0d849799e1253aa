"""A learner group's loop: fragments in, one gradient per minibatch out to the mailbox.

The group root receives fragments from the actors. Once it holds ``group_batch_size``
environment steps (``group_batch_size_for`` the active actors when actor scaling parks some;
and the parameter rank counts the group as active) it hands them to
``algo.prepare`` (PPO: GAE with the newest weights' values) and pushes one gradient for each
minibatch of ``algo.minibatches`` (PPO: ``num_sgd_iter`` shuffled passes). For every minibatch: read the newest weights from the weight board (their
version is the gradient's base version), split the minibatch across the group's ranks,
each computes ``algo.compute_gradient`` on its share, the group averages them with an allreduce,
and the root pushes the average into the mailbox. The policy version can advance between
two pushes of one batch: that is the asynchrony Stellaris' admission governs. With
``learners.overlap_push`` a CUDA-graph learner pushes each gradient while the GPU computes the next
(whose base version then lacks it).

Update push (``learners.push: update``, ``_update``): the group takes every minibatch step of the batch itself
with its own optimizer (runtime/roles/group_update.py: kept across batches, checkpointed by rank 0 from the
activity reports) and pushes one update, the weights it started from minus those it ended with.

Post-processing learner (MARL ``algo.postprocess_learner``): group 0 prepares every batch and hands it to the
groups behind it (runtime/roles/prepared_batches.py). IS truncation window (Stellaris Eq. 2, when
``algo.uses_window``): each minibatch is also evaluated under the other active groups' base versions
(runtime/roles/is_window.py). Pacing (sync's lockstep, SSP's held word): runtime/roles/pacing.py.

Elasticity (the parameter rank decides, runtime/roles/elastic.py): a group told to park first trains
the full batches it already holds, then blocks until it is activated or the run stops
(runtime/roles/active_groups.py ``wait_while_parked``), keeping what it holds for later. Only the seconds
spent computing are charged (learner_activity); every gradient's cycle is profiled (learner_cycles,
runtime/record/cycle_profile.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from hpcrl.config import DebugConfig, LearnersConfig
from hpcrl.runtime.transport import control
from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.messages import GroupState, LearnerActivity
from hpcrl.runtime.roles.cuda_graph import GraphedGradient
from hpcrl.runtime.record.cycle_profile import CycleRecord
from hpcrl.runtime.roles.active_groups import wait_while_parked
from hpcrl.runtime.roles.group_update import GroupUpdate
from hpcrl.runtime.roles.is_window import ISWindow
from hpcrl.runtime.roles.pacing import SHORT_WAIT_CAP, Pacing
from hpcrl.runtime.roles.prepared_batches import PreparedBatches
from hpcrl.runtime.transport.push import PushAbandoned


@dataclass(frozen=True)
class LearnerSettings:
    """The config sections a learner group owns."""

    learners: LearnersConfig
    """CUDA graphs and overlapped pushes."""
    debug: DebugConfig


class LearnerGroup:
    def __init__(self, job, settings: LearnerSettings) -> None:
        self.job, self.settings, self.plan = job, settings, job.plan
        self.model, self.algo = job.model, job.algo
        # size: the group's ranks, joined ones included (learners.elastic=steps: only the root is in the launch)
        self.g, self.size, self.is_root = job.topo.group, job.group_reduce.size, job.topo.is_group_root
        self.weights = np.empty(self.model.flat.num_params, dtype=np.float32)
        self.window = (ISWindow(self.algo, job.env, self.model, job.board, job.counters, self.plan.groups, self.g)
                       if self.algo.uses_window and self.plan.groups > 1 else None)
        self.fault = control.FaultInjector(self.settings.debug, job.rank)
        self.heartbeat = control.Heartbeat(job.counters, self.plan.groups, job.rank)
        self.seq = 0  # continues the parameter rank's count on resume (set in run)
        self.generator = minibatch_generator(self.plan.seed, self.g)
        self.receiver = job.fragments.learner_link(self.g) if self.is_root else None
        self.frags: list[dict] = []
        # MARL post-processing learner (algo.postprocess_learner): group 0 prepares every batch, the others train
        self.pp = self.plan.postprocess_groups
        self.handoff = (PreparedBatches(job.fragments, job.counters, self.g, self.plan.groups, self.pp)
                        if self.is_root and self.pp else None)
        self.group_reduce = job.group_reduce  # the group's other ranks: shares of each minibatch, the gradient average
        self.loaded = -1  # version of the weights in self.model (-1: none yet)
        self.cycles = CycleRecord(self.g)  # where each gradient's cycle went (learner_cycles)
        self.pacing = Pacing(self.plan.pacing, job.counters, job.board, self.plan.groups, self.g,
                             self._beat_and_receive, self.cycles.lap)
        # learners.push=update: the group's own optimizer makes one update per batch (kept across batches)
        self.inner = (GroupUpdate(self.algo, self.model, self.generator)
                      if self.plan.push == "update" and self.is_root else None)
        self.graphed = (GraphedGradient(self.algo, self.model)  # single-rank groups (no allreduce), no IS window
                        if (self.model.device.type == "cuda" and self.settings.learners.cuda_graphs and self.size == 1
                            and not self.window and self.inner is None and hasattr(self.algo, "gradient_tensors"))
                        else None)
        # push each gradient while the GPU computes the next (not in lockstep: there the next needs this one applied)
        self.overlap = self.graphed is not None and self.settings.learners.overlap_push and not self.pacing.lockstep

    # ---- group root ----------------------------------------------------------------------
    def run(self) -> None:
        self.seq = self.job.startup["seq_next"][self.g]
        saved = self.job.startup.get("inner_states", {}).get(self.g)
        if self.inner is not None and saved is not None:  # --resume: as this group was after its last update
            self.inner.restore(saved)
        if not self.is_root:
            return self._run_member()
        counters = self.job.counters
        backoff = Backoff(5e-5, 2e-3)
        lap = self.cycles.lap
        self.cycles.clock.restart()
        while True:
            self.fault.check()
            self.heartbeat.beat()
            lap("control")
            self._receive()
            lap("receive")
            words = counters.read_all()
            lap("control")
            if words[control.STOP]:
                break
            need = self.plan.group_batch_size_for(int(words[control.ACTIVE_ACTORS]))  # actor scaling shrinks it
            if not self._holds_a_batch(need):
                if self.g >= words[control.ACTIVE]:  # parked, nothing left to train: block until activated
                    if not self._park():
                        break
                    continue
                backoff.sleep()
                lap("idle")
                continue
            backoff.reset()
            if self.handoff is not None and not self.handoff.sends:  # a batch the post-processing group prepared
                item = self.handoff.take()
                lap("control")
                self.algo.assign_learner(self.g - self.pp, int(words[control.ACTIVE]) - self.pp)
                trained = self._train(None, item["steps"], item["new_steps"], prepared=item["batch"])
                if not trained:
                    break
                continue
            taken, steps = take_batch(self.frags, need)
            if not self.plan.on_policy:  # free the places now: actors sample the next batch while this one trains
                counters.add(control.BACKLOG + self.g, -len(taken))
            lap("control")
            if self.handoff is not None and self.handoff.sends:  # the post-processing group: prepare, pass on
                if not self._postprocess(taken, steps):
                    break
                continue
            self.algo.assign_learner(self.g, int(words[control.ACTIVE]))
            # every group gets every fragment (MARL policy learners): group 0 alone counts their steps
            new_steps = 0 if self.plan.fragments_to_every_group and self.g else steps
            trained = self._train(taken, steps, new_steps)
            if self.plan.on_policy:  # actors.on_policy: the next batch is sampled with the weights this one made
                taken_word = control.taken_word(self.plan.groups, self.g)
                trained = trained and self.pacing.wait_while(lambda: counters.read(taken_word) < self.seq,
                                                             cap=SHORT_WAIT_CAP)
                counters.add(control.BACKLOG + self.g, -len(taken))
            if not trained:
                break
        self._finish()

    def _park(self) -> bool:
        """Block until this group is activated (True) or the run stops (False), then report the park."""
        self.group_reduce.park()  # the group's other ranks wait with long naps too
        woken = wait_while_parked(self.job.counters, self.g, self.job.reports, self._beat_and_receive)
        self.cycles.clock.restart()  # parked time belongs to no gradient's cycle
        return woken

    def _beat_and_receive(self) -> None:
        self.heartbeat.beat()
        self.cycles.lap("control")
        self._receive()
        self.cycles.lap("receive")

    def _train(self, fragments: list[dict] | None, steps: int, new_steps: int, prepared: dict | None = None) -> bool:
        """One gradient push per minibatch of one batch (the last one reports ``new_steps`` env steps
        consumed); False when the run is stopping. ``prepared``: a batch the post-processing group made
        from the fragments (it sent their report)."""
        if self.size > 1:  # a group whose ranks join as a job step starts them here (learners.elastic=steps)
            self.group_reduce.ready(self._beat_and_receive)
        if self.inner is not None:
            return self._update(fragments, steps, new_steps, prepared)
        start_unix, compute = time.time(), 0.0
        lap = self.cycles.lap
        if self._pull_weights() is None:
            return False
        lap("weights")
        batch, report = self._batch(fragments, prepared)
        compute += lap("prepare")
        completed, pending = False, None  # pending: the push of the previous minibatch's gradient (overlap)
        # the batch's env steps count as consumed with its last gradient, so the parameter rank's round, stop rule
        # and lr schedule move on when the batch is done (RLlib's iteration), not one gradient into it
        for mb, last in _with_last(self.algo.minibatches(batch, self.generator)):
            consumed = new_steps if last else 0
            lap("minibatch")
            self.fault.check()
            self.heartbeat.beat()
            words = self.job.counters.read_all()
            lap("control")
            if words[control.STOP]:
                break
            version = self._pull_weights()
            lap("weights")
            if version is None:
                break
            if self.overlap:
                got = self._overlapped_gradient(mb, pending)
                if got is None:
                    pending = None
                    break
                grad, stats, dt = got
                compute += dt
                pending = (grad, version, len(next(iter(mb.values()))), stats, dt, consumed)
                continue
            t = time.perf_counter()
            window = self.window.logps(mb, version, words) if self.window else None
            lap("window")
            mine = mb
            if self.size > 1:  # the group's other ranks are handed their shares; the gradient is the group's average
                mine, window = self.group_reduce.hand_out(self.weights, mb, window)
                lap("allreduce")
            grad, stats = self._local_gradient(mine, window, lap)
            self.fault.slow_down()  # debug.learner_delay_seconds
            lap("gradient")
            dt = time.perf_counter() - t
            compute += dt
            if not self._push(grad, version, len(next(iter(mb.values()))), stats, dt, consumed):
                break
        else:
            completed = True
        if pending is not None and not self._push(*pending):
            completed = False
        self._activity(start_unix, compute, steps, report)
        return completed

    def _batch(self, fragments: list[dict] | None, prepared: dict | None) -> tuple[dict, dict | None]:
        """The batch to train on (``algo.prepare`` with the weights in the model, or the one the post-processing
        group prepared) and its report for ``algo.end_round`` on the parameter rank."""
        if prepared is None:
            batch = self.algo.prepare(fragments, self.model)
            return batch, self.algo.learner_report(batch)
        return {k: torch.as_tensor(v, device=self.model.device) for k, v in prepared.items()}, None

    def _update(self, fragments: list[dict] | None, steps: int, new_steps: int, prepared: dict | None = None) -> bool:
        """learners.push=update: the batch's whole update by the group's own optimizer (GroupUpdate), from the
        newest version, at the lr the schedule gives the env steps consumed so far; pushed as one update.
        False when the run is stopping."""
        start_unix, lap = time.time(), self.cycles.lap
        version = self._pull_weights()
        if version is None:
            return False
        lap("weights")
        t = time.perf_counter()
        batch, report = self._batch(fragments, prepared)
        if self.plan.lr_schedule is not None:
            self.inner.set_lr(self.plan.lr_schedule.at(self.job.counters.read(control.CONSUMED)))
        words = self.job.counters.read_all()
        lap("prepare")

        def step(mb: dict) -> dict | None:
            self.fault.check()
            self.heartbeat.beat()
            if self.pacing.stopping():
                return None
            window = self.window.logps(mb, version, words) if self.window else None
            lap("window")
            if self.size == 1 and window is None:
                stats = self.inner.fused_step(mb)
            else:
                mine = mb
                if self.size > 1:  # the group's ranks compute shares at the group's current weights
                    mine, window = self.group_reduce.hand_out(self.model.flat.params.detach().cpu().numpy(), mb, window)
                    lap("allreduce")
                grad, stats = self._local_gradient(mine, window, lap)
                self.inner.apply(grad)
            lap("gradient")
            return stats

        got = self.inner.run(batch, step)
        if got is None:
            return False
        update, stats = got
        self.loaded = -1  # the model holds this group's own weights now, not a published version
        self.fault.slow_down()  # debug.learner_delay_seconds
        compute = time.perf_counter() - t
        lap("flatten")
        rows = len(next(iter(batch.values())))
        if not self._push(update, version, rows, stats, compute, new_steps):
            return False
        self._activity(start_unix, compute, steps, report, GroupState(self.g, self.seq - 1, self.inner.state()))
        return True

    def _overlapped_gradient(self, mb: dict, pending: tuple | None) -> tuple[np.ndarray, dict, float] | None:
        """The minibatch's gradient from its CUDA graph, with the previous gradient (``pending``: the arguments
        of its ``_push``) pushed while the GPU computes: (gradient, stats, compute seconds), or None when that
        push was abandoned (the run is stopping). A shape without a graph is computed eagerly after the push."""
        lap = self.cycles.lap
        t = time.perf_counter()
        launched = self.graphed.launch(mb)
        launch_seconds = time.perf_counter() - t
        lap("gradient")
        if pending is not None and not self._push(*pending):
            return None
        t = time.perf_counter()
        grad, stats = launched.result() if launched is not None else self._local_gradient(mb, None)
        self.fault.slow_down()  # debug.learner_delay_seconds
        lap("gradient")
        return grad, stats, launch_seconds + time.perf_counter() - t

    def _postprocess(self, fragments: list[dict], steps: int) -> bool:
        """The post-processing group: prepare the batch with the newest weights and hand it to the policy/critic
        groups (runtime/roles/prepared_batches.py); False when the run is stopping."""
        start_unix = time.time()
        lap = self.cycles.lap
        if self._pull_weights() is None:
            return False
        lap("weights")
        batch = self.algo.prepare(fragments, self.model)
        host = {k: v.detach().cpu().numpy() for k, v in batch.items()}
        report = self.algo.learner_report(batch)
        compute = lap("prepare")

        def idle() -> None:
            self.heartbeat.beat()
            self._receive()
            lap("push_wait")

        if not self.handoff.send(host, steps, idle):
            return False
        lap("push")
        self._activity(start_unix, compute, steps, report)
        return True

    def _holds_a_batch(self, need: int) -> bool:
        """A prepared batch waits (behind a post-processing group), or ``need`` env steps of fragments do."""
        if self.handoff is not None and not self.handoff.sends:
            return bool(self.handoff.waiting)
        return sum(f["rewards"].size for f in self.frags) >= need

    def _receive(self) -> None:
        """Take what has arrived: fragments from actors, prepared batches from the post-processing group."""
        self.frags += self.receiver.poll()
        if self.handoff is not None:
            self.handoff.receive()

    def _pull_weights(self) -> int | None:
        """Newest weights into the model once the pacing allows (copied only when a newer version was published);
        their version (None: the run is stopping)."""
        if not self.pacing.before_pull():
            return None
        version = self.job.board.read_latest(self.weights, have=self.loaded)
        if version != self.loaded:  # copied only when newer
            self.model.flat.load_(self.weights)
            if self.window:  # the others' IS window needs our base version
                self.window.publish_base(version)
            self.loaded = version
        return self.loaded

    def _local_gradient(self, mb: dict, window, lap=None) -> tuple[np.ndarray, dict]:
        lap = lap or _no_lap
        if self.graphed is not None:
            got = self.graphed(mb)  # one graph replay and one host copy (None: a shape it has no graph for)
            if got is not None:
                lap("gradient")
                return got
        wl = None if window is None else torch.as_tensor(np.stack(window), device=self.model.device)
        grad, stats = self.algo.compute_gradient(mb, self.model, wl)
        lap("gradient")
        stats = {k: float(v) for k, v in stats.items()}
        if self.size == 1:
            out, phase = grad.detach().cpu().numpy(), "flatten"
        else:
            lap("flatten")
            out, phase = self.group_reduce.average(grad), "allreduce"  # the mean over the group's shares
        lap(phase)
        return out, stats

    def _push(self, grad: np.ndarray, version: int, samples: int, stats: dict, compute: float, new_steps: int) -> bool:
        """Put the gradient in a free mailbox slot of this group; wait (sleeping, still receiving
        fragments) while none is free. False when the run stops meanwhile."""
        def vector(waited: float) -> list[float]:
            extra = {"compute_seconds": compute, "mailbox_wait_seconds": waited, "new_env_steps": new_steps,
                     "busy_seconds": self.cycles.busy_so_far(), "inner_steps": stats.get("inner_steps", 0)}
            return [extra[k] if k in extra else stats.get(k, np.nan) for k in control.GRAD_STATS]

        def abandon() -> bool:
            self.heartbeat.beat()
            self._receive()
            return self.pacing.stopping()

        try:
            waited = self.job.mailbox.push(self.g, self.seq, version, samples, grad, vector, abandon=abandon,
                                           backoff=Backoff(5e-5, 1e-3))
        except PushAbandoned:
            return False
        self.cycles.close(self.seq, version, waited)
        self.seq += 1
        self.pacing.pushed(version)
        return True

    def _activity(self, start_unix: float, compute: float, samples: int, report=None,
                  state: GroupState | None = None) -> None:
        """The batch's learner_activity report (``state``: the optimizer state after an update, which the
        parameter rank checkpoints)."""
        self.job.reports.send(LearnerActivity(
            time_start=start_unix, time_end=time.time(), group=self.g, compute_seconds=compute, samples=samples,
            cycles=self.cycles.take_rows(), algo_report=report, group_state=state))

    def _finish(self) -> None:
        """Release the group's other ranks, keep receiving until every actor is done, then say so."""
        self.group_reduce.release()
        backoff = Backoff(5e-5, 5e-3)
        while True:  # every actor's last send (and the post-processing group's) must be matched before it can finish
            self.heartbeat.beat()
            self.receiver.poll()
            if self.receiver.finished() and (self.handoff is None or self.handoff.finished()):
                break
            backoff.sleep()
        self.receiver.close()
        if self.handoff is not None:
            self.handoff.close(self.heartbeat.beat)
        self.job.reports.close()
        self.group_reduce.close()
        self.job.counters.add(control.LEARNERS_DONE, 1)

    # ---- other ranks of the group --------------------------------------------------------
    def _run_member(self) -> None:
        self.group_reduce.serve(member_share(self.algo, self.model, self.group_reduce), self.fault.check,
                                self.heartbeat.beat)

    def close_on_error(self) -> None:
        pass


def member_share(algo, model, group_reduce):
    """A member rank's work on one share (``protocols.Share``): the share's gradient at the root's weights, joined
    to the group's average (runtime/runners/join.py uses it too)."""
    def share(weights: np.ndarray, batch: dict, window) -> None:
        model.flat.load_(weights)
        rows = {k: torch.as_tensor(v, device=model.device) for k, v in batch.items()}
        wl = None if window is None else torch.as_tensor(np.stack(window), device=model.device)
        grad, _ = algo.compute_gradient(rows, model, wl)
        group_reduce.average(grad)

    return share


def take_batch(frags: list[dict], need: int) -> tuple[list[dict], int]:
    """The oldest fragments (taken out of ``frags``) that hold at least ``need`` env steps, and their step count, in
    actor order, not arrival order: the same fragments make the same batch whatever the timing (on-policy runs repeat
    themselves, and a batch can be rebuilt from the trajectory files)."""
    taken, steps = [], 0
    while steps < need:
        f = frags.pop(0)
        taken.append(f)
        steps += f["rewards"].size
    taken.sort(key=lambda f: (f.get("actor", 0), f.get("fragment", 0)))
    return taken, steps


def minibatch_generator(seed: int, group: int) -> torch.Generator:
    """The generator a learner group draws its minibatch order from (its own stream per group)."""
    return torch.Generator().manual_seed(seed + 7919 * (group + 1))


def _with_last(items):
    """(item, whether it is the last) for each item of an iterator, looking one item ahead."""
    it = iter(items)
    item = next(it, _END)
    while item is not _END:
        following = next(it, _END)
        yield item, following is _END
        item = following


_END = object()


def _no_lap(_phase: str) -> float:
    return 0.0
