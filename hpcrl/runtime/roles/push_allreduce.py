"""``learners.topology: allreduce``: a group root's side of DD-PPO's decentralised update (Wijmans et al. 2020).

Every group trains its own batch, and every minibatch's gradient is averaged over the G group roots with one
allreduce (``transport/groups_allreduce.py``); each group steps its own copy of the algorithm's optimizer
(``GroupUpdate``, as update push's) with that mean, so all G groups hold the same weights after each step. After
the batch the groups sum their env steps, rows and statistics, and group 0 alone pushes the weights to rank 0
(one push per batch of all groups), which takes them, ends its round as ever (PPO's KL coefficient travels in the
weights) and publishes. With ``actors.on_policy`` each group then waits for that version: it is where the next batch
starts and what the actors sample it with. Otherwise a group starts its next batch at once from its own weights,
which are that version's trained values, with rank 0's untrained values of the newest version published by then.

With sync admission and one parameter rank, each of the groups' minibatch gradients would be averaged by rank 0
and stepped by its optimizer: the same step, here made on every group's root instead of through rank 0.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from hpcrl.runtime.clock import Work
from hpcrl.runtime.messages import GroupState
from hpcrl.runtime.roles.group_update import GroupUpdate
from hpcrl.runtime.roles.pacing import SHORT_WAIT_CAP
from hpcrl.runtime.roles.push_train import BeforeEachStep
from hpcrl.runtime.transport import control

if TYPE_CHECKING:
    from hpcrl.runtime.roles.learner import LearnerGroup


class PushAllreduced:
    """plan.push == "allreduce": each minibatch averaged with the other groups' roots, group 0 pushes the weights."""

    def __init__(self, learner: LearnerGroup) -> None:
        self.learner = learner
        self.inner = GroupUpdate(learner.algo, learner.model, learner.generator)  # kept across batches
        self.allreduce = learner.job.groups_allreduce
        # batches trained: group 0's pushes so far (a resumed job's too), every group's count; a group's state goes
        # to rank 0 under it, and a group that does not push closes its cycle rows with it as their seq
        self.batches: int | None = None  # set at the first batch, from what rank 0 told every rank at start
        self.untrained = learner.model.flat.untrained_slices()
        self.untrained_span = (min((p.start for p in self.untrained), default=0),  # one read covers them all
                               max((p.stop for p in self.untrained), default=0))
        self.seen = -1  # the newest published version whose untrained values the model holds
        self.next_version: int | None = None  # the version rank 0 makes of the last batch's push

    def restore(self, saved: dict) -> None:
        """--resume: the group's optimizer and its minibatch order as they were after the checkpoint's batch."""
        self.inner.restore(saved)

    def train(self, fragments: list[dict] | None, steps: int, new_steps: int, prepared: dict | None = None) -> bool:
        """The batch's minibatch steps on the groups' mean gradients, group 0's push of the weights, and (on-policy
        actors) the wait for the version it makes; False when the run is stopping."""
        L = self.learner
        clock, lap = L.clock, L.cycles.lap
        start_unix = clock.unix()
        if self.batches is None:
            self.batches = L.job.startup.seq_next[0]
        version = self._start()
        if version is None:
            return False
        lap("weights")
        t = clock.now()
        batch, report = L.batch(fragments, prepared)
        if L.plan.lr_schedule is not None:  # rank 0 sets CONSUMED before it takes a push (ApplyWeights.admitting)
            self.inner.set_lr(L.plan.lr_schedule.at(L.job.counters.read(control.CONSUMED)))
        lap("prepare")
        stopping = BeforeEachStep(L)

        def waiting() -> bool:
            """While the other groups' roots are not there yet: alive, and True once the run has stopped."""
            L.heartbeat.beat()
            lap("idle")
            return L.pacing.stopping()

        def step(mb: dict) -> dict | None:
            stop = stopping()  # a stopping group takes part in this step's allreduce, which tells every group
            grad, stats = L.gradient_at_own_weights(mb, None, lap)
            got = self.allreduce.mean(grad, stop, waiting)
            lap("allreduce")
            if got is None or got[1]:  # abandoned, or some group is stopping: every group leaves at this step
                return None
            self.inner.apply(got[0])
            clock.did(Work.INNER_STEP)
            lap("gradient")
            return stats

        got = self.inner.run(batch, step)
        if got is None:
            return False
        _, stats = got
        rows = len(next(iter(batch.values())))
        total = self.allreduce.sum(np.array([new_steps, rows, *stats.values()], dtype=np.float64), waiting)
        if total is None:
            return False
        G = self.allreduce.size
        means = {k: float(v) / G for k, v in zip(stats, total[2:])}
        L.forget_weights()  # the model holds the groups' new weights, not a published version yet
        compute = clock.now() - t
        lap("flatten")
        if L.g == 0:
            weights = L.model.flat.params.detach().cpu().numpy()
            if not L.push(weights, version, int(total[1]), means, compute, int(total[0]), L.batch_places):
                return False
        else:
            L.cycles.close(self.batches, version, 0.0)
            L.pacing.pushed(version)  # lockstep: its next batch starts from the version group 0's push makes
        # the optimizer is the same in every group: group 0 sends it, each group its own minibatch order (a few KB)
        state = self.inner.state() if L.g == 0 else {"minibatch_rng": L.generator.get_state()}
        L.report_activity(start_unix, compute, steps, report, GroupState(L.g, self.batches, state))
        self.batches += 1
        self.next_version = version + 1
        if not L.plan.on_policy:
            return True
        # on-policy actors sample the next batch with the version this batch made: it is where that batch starts
        return L.pacing.wait_while(lambda: L.job.board.latest_version() <= version, cap=SHORT_WAIT_CAP)

    def _start(self) -> int | None:
        """The version the batch's weights are (None: the run is stopping). The first batch starts from the published
        version, waiting for it. A later one starts from the group's own weights: they are the trained values of
        the version rank 0 makes of the last batch's push (with on-policy actors, the version this group waited
        for), so only rank 0's untrained values (PPO's KL coefficient) are read, of the newest version published by
        then: a few floats, not the whole weights from rank 0 for every group and batch."""
        L = self.learner
        if self.next_version is None:
            version = L.pull_weights()
            self.seen = -1 if version is None else version
            return version
        if L.plan.on_policy and not L.pacing.before_pull():
            return None
        newest = self._untrained_of_newest()
        return newest if L.plan.on_policy else self.next_version

    def _untrained_of_newest(self) -> int:
        """The newest published version's untrained values into the model (read only when newer than the last
        read); that version."""
        L = self.learner
        if not self.untrained:
            return L.job.board.latest_version()
        start, stop = self.untrained_span
        newest = L.job.board.read_latest_part(L.weights[start:stop], start, have=self.seen)
        if newest != self.seen:
            with torch.no_grad():
                for part in self.untrained:
                    L.model.flat.params[part] = torch.from_numpy(L.weights[part])
            self.seen = newest
        return newest
