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

Update push (``learners.push: update``): the group takes every minibatch step of the batch itself
with its own optimizer (runtime/roles/group_update.py: kept across batches, checkpointed by rank 0 from the
activity reports) and pushes one update, the weights it started from minus those it ended with. The two push
modes are objects with one interface (runtime/roles/push_train.py), as pacing is (runtime/roles/pacing.py).

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

from dataclasses import dataclass

import numpy as np
import torch

from hpcrl.config import DebugConfig, LearnersConfig
from hpcrl.runtime.transport import control
from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.clock import WALL, Clock, Work
from hpcrl.runtime.messages import GroupState, LearnerActivity
from hpcrl.runtime.record.cycle_profile import CycleRecord
from hpcrl.runtime.roles.active_groups import wait_while_parked
from hpcrl.runtime.roles.is_window import ISWindow
from hpcrl.runtime.roles.pacing import Pacing
from hpcrl.runtime.roles.preemption import batch_places
from hpcrl.runtime.roles.prepared_batches import PreparedBatches
from hpcrl.runtime.roles.push_train import train_mode
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
                       if self.algo.uses_window and self.plan.groups > 1 and self.plan.push != "allreduce" else None)
        self.clock = job.clock
        self.fault = control.FaultInjector(self.settings.debug, job.rank, clock=job.clock)
        self.heartbeat = control.Heartbeat(job.counters, self.plan.groups, job.rank, job.clock)
        self.seq = 0  # continues the parameter rank's count on resume (set in run)
        self.generator = minibatch_generator(self.plan.seed, self.g)
        self.receiver = job.fragments.learner_link(self.g) if self.is_root else None
        self.frags: list[dict] = []
        # a batch's places in the group's backlog, and which fragments are late (actors.sync_frac: preemption.py)
        self.places = batch_places(self.plan.sync_frac, job.counters, self.g, job.max_backlog)
        self.batch_places = 0  # the places the batch in training holds (its push tells rank 0)
        # MARL post-processing learner (algo.postprocess_learner): group 0 prepares every batch, the others train
        self.pp = self.plan.postprocess_groups
        self.handoff = (PreparedBatches(job.fragments, job.counters, self.g, self.plan.groups, self.pp, job.clock)
                        if self.is_root and self.pp else None)
        self.group_reduce = job.group_reduce  # the group's other ranks: shares of each minibatch, the gradient average
        self.loaded = -1  # version of the weights in self.model (-1: none yet)
        self.cycles = CycleRecord(self.g, job.clock, job.learner_cpu_time)  # where each gradient's cycle went
        self.pacing = Pacing(self.plan.pacing, job.counters, job.board, self.plan.groups, self.g,
                             self._beat_and_receive, self.cycles.lap, job.clock)
        # what the group pushes per batch (learners.push): a gradient per minibatch, or its own optimizer's update
        learners = settings.learners
        self.push_mode = (train_mode(self.plan.push, self, learners.cuda_graphs, learners.overlap_push)
                          if self.is_root else None)

    # ---- group root ----------------------------------------------------------------------
    def run(self) -> None:
        self.seq = self.job.startup.seq_next[self.g]
        if not self.is_root:
            return self._run_member()
        saved = self.job.startup.group_states.get(self.g)
        if saved is not None:  # --resume: update push's group as it was after its last update
            self.push_mode.restore(saved)
        counters = self.job.counters
        backoff = self.job.learner_nap  # a back-off under MPI, the group's doorbell in one process
        lap = self.cycles.lap
        self.cycles.restart()
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
                self.batch_places = 0  # the post-processing group's fragments held the places
                lap("control")
                self.algo.assign_learner(self.g - self.pp, int(words[control.ACTIVE]) - self.pp)
                trained = self._train(None, item["steps"], item["new_steps"], prepared=item["batch"])
                if not trained:
                    break
                continue
            taken, steps = take_batch(self.frags, need)
            self.batch_places = self.places.close(taken, self.frags)
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
            # actors.on_policy: rank 0 frees the places once the version that holds this batch's push is out
            trained = self._train(taken, steps, new_steps)
            if not trained:
                break
        self._finish()

    def _park(self) -> bool:
        """Block until this group is activated (True) or the run stops (False), then report the park."""
        self.group_reduce.park()  # the group's other ranks wait with long naps too
        woken = wait_while_parked(self.job.counters, self.g, self.job.reports, self._beat_and_receive, self.clock)
        self.cycles.restart()  # parked time belongs to no gradient's cycle
        return woken

    def _beat_and_receive(self) -> None:
        self.heartbeat.beat()
        self.cycles.lap("control")
        self._receive()
        self.cycles.lap("receive")

    def _train(self, fragments: list[dict] | None, steps: int, new_steps: int, prepared: dict | None = None) -> bool:
        """Train one batch as the push mode does (runtime/roles/push_train.py); False when the run is stopping."""
        if self.size > 1:  # a group whose ranks join as a job step starts them here (learners.elastic=steps)
            self.group_reduce.ready(self._beat_and_receive)
        return self.push_mode.train(fragments, steps, new_steps, prepared)

    def batch(self, fragments: list[dict] | None, prepared: dict | None) -> tuple[dict, dict | None]:
        """The batch to train on (``algo.prepare`` with the weights in the model, or the one the post-processing
        group prepared) and its report for ``algo.end_round`` on the parameter rank."""
        if prepared is None:
            batch = self.algo.prepare(fragments, self.model)
            self.clock.did(Work.PREPARE, sum(f["rewards"].size for f in fragments))
            return batch, self.algo.learner_report(batch)
        return {k: torch.as_tensor(v, device=self.model.device) for k, v in prepared.items()}, None

    def _postprocess(self, fragments: list[dict], steps: int) -> bool:
        """The post-processing group: prepare the batch with the newest weights and hand it to the policy/critic
        groups (runtime/roles/prepared_batches.py); False when the run is stopping."""
        start_unix = self.clock.unix()
        lap = self.cycles.lap
        if self.pull_weights() is None:
            return False
        lap("weights")
        batch = self.algo.prepare(fragments, self.model)
        self.clock.did(Work.PREPARE, steps)
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
        self.report_activity(start_unix, compute, steps, report)
        return True

    def _holds_a_batch(self, need: int) -> bool:
        """A prepared batch waits (behind a post-processing group), or ``need`` env steps of fragments do."""
        if self.handoff is not None and not self.handoff.sends:
            return bool(self.handoff.waiting)
        return sum(f["rewards"].size for f in self.frags) >= need

    def _receive(self) -> None:
        """Take what has arrived: fragments from actors, prepared batches from the post-processing group."""
        self.frags += self.places.arrived(self.receiver.poll())
        if self.handoff is not None:
            self.handoff.receive()

    def pull_weights(self) -> int | None:
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

    def forget_weights(self) -> None:
        """The model no longer holds a published version (update push: the group's own steps changed it)."""
        self.loaded = -1

    def local_gradient(self, mb: dict, window, lap=None) -> tuple[np.ndarray, dict]:
        """This rank's gradient of ``mb`` (under the IS ``window``), averaged over the group's shares when the group
        has several ranks; ``lap``: the cycle clock's phases."""
        lap = lap or _no_lap
        wl = None if window is None else torch.as_tensor(np.stack(window), device=self.model.device)
        grad, stats = self.algo.compute_gradient(mb, self.model, wl)
        self.clock.did(Work.GRADIENT, 1 / self.size)  # this rank's share of the minibatch
        lap("gradient")
        stats = {k: float(v) for k, v in stats.items()}
        if self.size == 1:
            out, phase = grad.detach().cpu().numpy(), "flatten"
        else:
            lap("flatten")
            out, phase = self.group_reduce.average(grad), "allreduce"  # the mean over the group's shares
        lap(phase)
        return out, stats

    def gradient_at_own_weights(self, mb: dict, window, lap) -> tuple[np.ndarray, dict]:
        """``local_gradient`` at the weights the model holds now (the group's own steps', not a published version):
        a group of several ranks hands its members their shares with these weights first."""
        mine = mb
        if self.size > 1:
            mine, window = self.group_reduce.hand_out(self.model.flat.params.detach().cpu().numpy(), mb, window)
            lap("allreduce")
        return self.local_gradient(mine, window, lap)

    def push(self, grad: np.ndarray, version: int, samples: int, stats: dict, compute: float, new_steps: int,
             fragments: int) -> bool:
        """Put the gradient in a free mailbox slot of this group (learners.combine=node: hand it to the node's
        combined push); wait (sleeping, still receiving fragments) while none is free. False when the run stops
        meanwhile. ``new_steps`` and ``fragments``: the env steps and fragments of the batch this push ends (0 for
        its earlier gradients); on-policy, rank 0 frees the fragments' places once the push is applied."""
        def vector(waited: float) -> list[float]:
            extra = {"compute_seconds": compute, "mailbox_wait_seconds": waited, "new_env_steps": new_steps,
                     "busy_seconds": self.cycles.busy_so_far(), "inner_steps": stats.get("inner_steps", 0),
                     "fragments": fragments}
            return [extra[k] if k in extra else stats.get(k, np.nan) for k in control.GRAD_STATS]

        def abandon() -> bool:
            self.heartbeat.beat()
            self._receive()
            return self.pacing.stopping()

        try:
            waited = self.job.outbox.push(self.g, self.seq, version, samples, grad, vector, abandon=abandon,
                                           backoff=Backoff(5e-5, 1e-3, self.clock))
        except PushAbandoned:
            return False
        self.cycles.close(self.seq, version, waited)
        self.seq += 1
        self.pacing.pushed(version)
        return True

    def report_activity(self, start_unix: float, compute: float, samples: int, report=None,
                        state: GroupState | None = None) -> None:
        """The batch's learner_activity report (``state``: the optimizer state after an update, which the
        parameter rank checkpoints)."""
        self.job.reports.send(LearnerActivity(
            time_start=start_unix, time_end=self.clock.unix(), group=self.g, compute_seconds=compute, samples=samples,
            cycles=self.cycles.take_rows(), algo_report=report, group_state=state))

    def _finish(self) -> None:
        """Release the group's other ranks, keep receiving until every actor is done, then say so."""
        self.group_reduce.release()
        backoff = Backoff(5e-5, 5e-3, self.clock)
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
        self.group_reduce.serve(member_share(self.algo, self.model, self.group_reduce, self.clock), self.fault.check,
                                self.heartbeat.beat)

    def close_on_error(self) -> None:
        pass


def member_share(algo, model, group_reduce, clock: Clock = WALL):
    """A member rank's work on one share (``protocols.Share``): the share's gradient at the root's weights, joined
    to the group's average (runtime/runners/join.py uses it too)."""
    def share(weights: np.ndarray, batch: dict, window) -> None:
        model.flat.load_(weights)
        rows = {k: torch.as_tensor(v, device=model.device) for k, v in batch.items()}
        wl = None if window is None else torch.as_tensor(np.stack(window), device=model.device)
        grad, _ = algo.compute_gradient(rows, model, wl)
        clock.did(Work.GRADIENT, 1 / group_reduce.size)
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


def _no_lap(_phase: str) -> float:
    return 0.0
