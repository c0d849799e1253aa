"""What a learner group pushes for a batch (``plan.push``, ``learners.push``), one object per mode; its twin on the
parameter rank is ``runtime/roles/push_apply.py``.

- :class:`PushGradients` (``gradient``): one gradient push per minibatch of ``algo.minibatches``, each on the newest
  weights (the base version can advance between two pushes of a batch: Stellaris' asynchrony); a single-rank CUDA
  learner replays each gradient from a CUDA graph and, with ``learners.overlap_push``, pushes it while the GPU
  computes the next (whose base version then lacks it);
- :class:`PushUpdates` (``update``): the group takes every minibatch step of the batch itself with its own
  optimizer (``runtime/roles/group_update.py``: kept across batches, checkpointed by rank 0 from the activity
  reports) and pushes one update, the weights it started from minus those it ended with; a single-rank CUDA group
  replays each whole minibatch step (gradient, clipping, Adam) from a CUDA graph (``cuda_graph_step.py``).

Both train one batch through ``train(fragments, steps, new_steps, prepared) -> bool`` (False: the run is stopping)
with the group's parts (its weights pull, its pacing, its push, its report: :class:`~hpcrl.runtime.roles.learner.
LearnerGroup`); ``restore(saved)`` gives a resumed group the state rank 0 kept.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hpcrl.runtime.messages import GroupState
from hpcrl.runtime.roles.cuda_graph import GraphedGradient
from hpcrl.runtime.roles.group_update import GroupUpdate
from hpcrl.runtime.clock import Work
from hpcrl.runtime.transport import control

if TYPE_CHECKING:
    from hpcrl.runtime.roles.learner import LearnerGroup


class PushGradients:
    """learners.push=gradient: a gradient push per minibatch."""

    def __init__(self, learner: LearnerGroup, cuda_graphs: bool, overlap_push: bool) -> None:
        self.learner = learner
        algo, model = learner.algo, learner.model
        self.graphed = (GraphedGradient(algo, model)  # single-rank groups (no allreduce), no IS window
                        if (model.device.type == "cuda" and cuda_graphs and learner.size == 1 and not learner.window
                            and hasattr(algo, "gradient_tensors")) else None)
        # push each gradient while the GPU computes the next (not in lockstep: there the next needs this one applied)
        self.overlap = self.graphed is not None and overlap_push and not learner.pacing.lockstep

    def restore(self, saved: dict) -> None:
        pass  # nothing of a gradient-pushing group outlives its batch

    def train(self, fragments: list[dict] | None, steps: int, new_steps: int, prepared: dict | None = None) -> bool:
        """One gradient push per minibatch of one batch (the last one reports ``new_steps`` env steps consumed);
        False when the run is stopping. ``prepared``: a batch the post-processing group made from the fragments."""
        L = self.learner
        clock = L.clock
        start_unix, compute = clock.unix(), 0.0
        lap = L.cycles.lap
        if L.pull_weights() is None:
            return False
        lap("weights")
        batch, report = L.batch(fragments, prepared)
        compute += lap("prepare")
        completed, pending = False, None  # pending: the push of the previous minibatch's gradient (overlap)
        # the batch's env steps count as consumed with its last gradient, so the parameter rank's round, stop rule
        # and lr schedule move on when the batch is done (RLlib's iteration), not one gradient into it
        for mb, last in _with_last(L.algo.minibatches(batch, L.generator)):
            consumed, held = (new_steps, L.batch_places) if last else (0, 0)
            lap("minibatch")
            L.fault.check()
            L.heartbeat.beat()
            words = L.job.counters.read_all()
            lap("control")
            if words[control.STOP]:
                break
            version = L.pull_weights()
            lap("weights")
            if version is None:
                break
            rows = len(next(iter(mb.values())))
            if self.overlap:
                got = self._overlapped_gradient(mb, pending)
                if got is None:
                    pending = None
                    break
                grad, stats, dt = got
                compute += dt
                pending = (grad, version, rows, stats, dt, consumed, held)
                continue
            t = clock.now()
            window = L.window.logps(mb, version, words) if L.window else None
            lap("window")
            mine = mb
            if L.size > 1:  # the group's other ranks are handed their shares; the gradient is the group's average
                mine, window = L.group_reduce.hand_out(L.weights, mb, window)
                lap("allreduce")
            grad, stats = self._gradient(mine, window)
            L.cycles.slept(L.fault.slow_down())  # debug.learner_delay_seconds
            lap("gradient")
            dt = clock.now() - t
            compute += dt
            if not L.push(grad, version, rows, stats, dt, consumed, held):
                break
        else:
            completed = True
        if pending is not None and not L.push(*pending):
            completed = False
        L.report_activity(start_unix, compute, steps, report)
        return completed

    def _gradient(self, mb: dict, window) -> tuple[np.ndarray, dict]:
        """The minibatch's gradient: one CUDA graph replay and one host copy where there is a graph for its shape,
        else the algorithm's (averaged over the group's shares)."""
        if self.graphed is not None:
            got = self.graphed(mb)
            if got is not None:
                self.learner.clock.did(Work.GRADIENT)
                self.learner.cycles.lap("gradient")
                return got
        return self.learner.local_gradient(mb, window, self.learner.cycles.lap)

    def _overlapped_gradient(self, mb: dict, pending: tuple | None) -> tuple[np.ndarray, dict, float] | None:
        """The minibatch's gradient from its CUDA graph, with the previous gradient (``pending``: the arguments
        of its push) pushed while the GPU computes: (gradient, stats, compute seconds), or None when that
        push was abandoned (the run is stopping). A shape without a graph is computed eagerly after the push."""
        L = self.learner
        lap = L.cycles.lap
        t = L.clock.now()
        launched = self.graphed.launch(mb)
        launch_seconds = L.clock.now() - t
        lap("gradient")
        if pending is not None and not L.push(*pending):
            return None
        t = L.clock.now()
        if launched is not None:
            grad, stats = launched.result()
            L.clock.did(Work.GRADIENT)
        else:
            grad, stats = L.local_gradient(mb, None)
        L.cycles.slept(L.fault.slow_down())  # debug.learner_delay_seconds
        lap("gradient")
        return grad, stats, launch_seconds + L.clock.now() - t


STOP_CHECK_SECONDS = 0.01
"""How often a group's whole update looks for the run's STOP word between its minibatch steps. Read at every step it
was 320 RMA reads of rank 0's window per Hopper batch: in a 40,960-step MPI run on the 2-core VM the group's time
between steps fell from 0.43-0.46 s to 0.26 s with this (its gradients took 3.8-4.1 s)."""


class BeforeEachStep:
    """What a group's whole update does before each of its minibatch steps: the fault plan's check, a heartbeat,
    and whether the run is stopping, read every STOP_CHECK_SECONDS rather than at every step (under MPI an RMA read
    of rank 0's window). Once seen, stopping stays seen."""

    def __init__(self, learner: LearnerGroup) -> None:
        self.learner = learner
        self.next_read = learner.clock.now() + STOP_CHECK_SECONDS
        self.stopping = False

    def __call__(self) -> bool:
        """True once the run is stopping."""
        L = self.learner
        L.fault.check()
        L.heartbeat.beat()
        if not self.stopping and L.clock.now() >= self.next_read:
            self.stopping = L.pacing.stopping()
            self.next_read = L.clock.now() + STOP_CHECK_SECONDS
        return self.stopping


class PushUpdates:
    """learners.push=update: the batch's whole update by the group's own optimizer, pushed as one update."""

    def __init__(self, learner: LearnerGroup, cuda_graphs: bool) -> None:
        self.learner = learner
        # kept across batches; a single-rank CUDA group replays each minibatch step from a CUDA graph
        self.inner = GroupUpdate(learner.algo, learner.model, learner.generator, cuda_graphs and learner.size == 1)

    def restore(self, saved: dict) -> None:
        """--resume: the group's optimizer and minibatch order as they were after its last update."""
        self.inner.restore(saved)

    def train(self, fragments: list[dict] | None, steps: int, new_steps: int, prepared: dict | None = None) -> bool:
        """Every minibatch step of the batch from the newest version, at the lr the schedule gives the env steps
        consumed so far; one push of the update (reporting ``new_steps``). False when the run is stopping."""
        L = self.learner
        clock = L.clock
        start_unix, lap = clock.unix(), L.cycles.lap
        version = L.pull_weights()
        if version is None:
            return False
        lap("weights")
        t = clock.now()
        batch, report = L.batch(fragments, prepared)
        if L.plan.lr_schedule is not None:
            self.inner.set_lr(L.plan.lr_schedule.at(L.job.counters.read(control.CONSUMED)))
        words = L.job.counters.read_all()
        lap("prepare")
        stopping = BeforeEachStep(L)

        def step(mb: dict) -> dict | None:
            if stopping():
                return None
            window = L.window.logps(mb, version, words) if L.window else None
            lap("window")
            if L.size == 1 and window is None:
                stats = self.inner.fused_step(mb)
                clock.did(Work.GRADIENT)
            else:
                grad, stats = L.gradient_at_own_weights(mb, window, lap)
                self.inner.apply(grad)
            clock.did(Work.INNER_STEP)
            lap("gradient")
            return stats

        got = self.inner.run(batch, step)
        if got is None:
            return False
        update, stats = got
        L.forget_weights()  # the model holds this group's own weights now, not a published version
        L.cycles.slept(L.fault.slow_down())  # debug.learner_delay_seconds
        compute = clock.now() - t
        lap("flatten")
        rows = len(next(iter(batch.values())))
        if not L.push(update, version, rows, stats, compute, new_steps, L.batch_places):
            return False
        L.report_activity(start_unix, compute, steps, report, GroupState(L.g, L.seq - 1, self.inner.state()))
        return True


def _with_last(items):
    """(item, whether it is the last) for each item of an iterator, looking one item ahead."""
    it = iter(items)
    item = next(it, _END)
    while item is not _END:
        following = next(it, _END)
        yield item, following is _END
        item = following


_END = object()


def train_mode(push: str, learner: LearnerGroup, cuda_graphs: bool, overlap_push: bool):
    """A group root's side of the push mode ``push`` (the plan's)."""
    if push == "update":
        return PushUpdates(learner, cuda_graphs)
    if push == "allreduce":
        from hpcrl.runtime.roles.push_allreduce import PushAllreduced  # it imports this module

        return PushAllreduced(learner)
    return PushGradients(learner, cuda_graphs, overlap_push)
