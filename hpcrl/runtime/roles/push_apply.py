"""How the parameter rank applies what the learner groups push (``plan.push``, ``learners.push``), one object per
mode; its twin on the groups is ``runtime/roles/push_train.py``.

- :class:`ApplyGradients` (``gradient``): the admitted aggregate is a gradient; the algorithm's optimizer takes one
  step with it (``algo.apply``), at the lr the algorithm's schedule gives the env steps consumed so far (rank 0 sets
  it before each step);
- :class:`ApplyWeights` (``allreduce``, learners.topology=allreduce): group 0 pushes the weights every group holds
  after the groups' own allreduced steps; rank 0 takes them (``TakeWeights``) and publishes;
- :class:`ApplyUpdates` (``update``): the admitted aggregate is the mean of the groups' whole updates; the outer
  step (``hpcrl.algos.outer_step``) applies it. The lr schedule is then the groups' own: rank 0 sets the CONSUMED
  counter word before it admits a push, so the version it makes carries it to the group's next batch; and each
  group's optimizer state, sent with its activity report after each update, is kept for the checkpoint
  (``runtime/roles/group_states.py``) and handed back to the group on ``--resume``.
"""
from __future__ import annotations

import numpy as np
import torch

from hpcrl.algos.outer_step import OuterStep
from hpcrl.algos.schedules import LinearAnneal
from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.messages import GroupState
from hpcrl.runtime.roles.group_states import GroupStates
from hpcrl.runtime.transport import control


class ApplyGradients:
    """learners.push=gradient: one optimizer step of the algorithm per admitted aggregate."""

    def __init__(self, algo, model, lr_schedule: LinearAnneal | None) -> None:
        self.algo, self.model = algo, model
        self.lr_schedule = lr_schedule
        """The rate rank 0 sets before each step (None: the optimizer's own)."""

    def make_optimizer(self):
        return self.algo.make_optimizer(self.model)

    def apply(self, optimizer, aggregate: np.ndarray) -> None:
        self.algo.apply(self.model, optimizer, aggregate)

    def admitting(self, counters, consumed: int) -> None:
        """Before a push that brings the consumed env steps to ``consumed`` is admitted: nothing to tell."""

    def pushing(self, active: int, postprocess: int) -> int:
        """How many groups push, of ``active`` (a post-processing group pushes nothing): what sync admission waits for."""
        return active - postprocess

    def batches_in(self, group: int) -> tuple[int, ...]:
        """The groups whose batches a push of ``group`` holds (actors.on_policy frees their places): its own."""
        return (group,)

    def group_state(self, state: GroupState | None) -> None:
        """A group's state after an update: a gradient-pushing group has none."""

    def states(self, seq_next: list[int], drain=None, clock: Clock = WALL) -> dict[int, dict]:
        """What a resumed group gets back: nothing."""
        return {}

    def restore(self, saved: dict[int, dict], seq_next: list[int]) -> None:
        pass


class ApplyUpdates:
    """learners.push=update: the outer step on the admitted mean of the groups' updates."""

    lr_schedule = None
    """The groups follow the schedule with their own optimizers; the outer step's rate is fixed."""

    def __init__(self, flat_params: torch.Tensor, aggregation, groups: int) -> None:
        self.flat_params, self.aggregation = flat_params, aggregation
        # each group's state after its newest updates: at most its mailbox slots pushed and not taken, and one taken
        self.group_states = GroupStates(groups, aggregation.mailbox_slots + 1)

    def make_optimizer(self):
        agg = self.aggregation
        return OuterStep(self.flat_params, agg.outer_lr, agg.outer_momentum, agg.outer_nesterov)

    def apply(self, optimizer, aggregate: np.ndarray) -> None:
        optimizer.step(torch.from_numpy(np.ascontiguousarray(aggregate, dtype=np.float32)))

    def admitting(self, counters, consumed: int) -> None:
        """Before the version this push may make is published: the group's next lr reads the consumed steps."""
        counters.set(control.CONSUMED, consumed)

    pushing = ApplyGradients.pushing
    batches_in = ApplyGradients.batches_in

    def group_state(self, state: GroupState | None) -> None:
        self.group_states.add(state)

    def states(self, seq_next: list[int], drain=None, clock: Clock = WALL) -> dict[int, dict]:
        """Each group's optimizer state after its newest update taken (``drain``: wait for one still on its way)."""
        return self.group_states.newest(seq_next, drain, clock)

    def restore(self, saved: dict[int, dict], seq_next: list[int]) -> None:
        self.group_states.restore(saved, seq_next)


class TakeWeights:
    """ApplyWeights' optimizer: each step takes the trained weights pushed (an optimizer's interface, without
    state). The untrained values of the flat buffer (PPO's KL coefficient) stay rank 0's: its ``end_round`` sets them
    after a version is published, so the pushed copy holds the ones before."""

    def __init__(self, model) -> None:
        self.flat_params = model.flat.params
        self.untrained = model.flat.untrained_slices()
        self.param_groups = [{"lr": 1.0}]

    def step(self, weights: torch.Tensor) -> None:
        with torch.no_grad():
            kept = [self.flat_params[part].clone() for part in self.untrained]  # a few values (PPO: one)
            self.flat_params.copy_(weights)
            for part, values in zip(self.untrained, kept):
                self.flat_params[part] = values

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class ApplyWeights(ApplyUpdates):
    """learners.topology=allreduce: the groups averaged every minibatch among themselves and stepped their own
    optimizers; group 0 alone pushes, and what it pushes is the weights every group holds. Rank 0 takes them
    (update push's apply, with ``TakeWeights`` for the outer step; the CONSUMED word as update push sets it).

    Each group's state comes with its activity report, keyed by the batch (the count of group 0's pushes, which is
    the groups' count of batches): group 0's optimizer, the same in every group, and each group's own minibatch
    order; a checkpoint gives each group both."""

    def __init__(self, model, aggregation, groups: int) -> None:
        super().__init__(model.flat.params, aggregation, groups)
        self.model, self.groups = model, groups

    def make_optimizer(self):
        return TakeWeights(self.model)

    def pushing(self, active: int, postprocess: int) -> int:
        return 1  # group 0 pushes for all

    def batches_in(self, group: int) -> range:
        return range(self.groups)  # group 0's push holds every group's batch

    def states(self, seq_next: list[int], drain=None, clock: Clock = WALL) -> dict[int, dict]:
        """Each group's state after the newest batch rank 0 took (group 0's pushes count the batches): group 0's
        optimizer, which every group holds (only group 0 sends it), with the group's own minibatch order."""
        newest = self.group_states.newest([seq_next[0]] * self.groups, drain, clock)
        if 0 not in newest:
            return {}
        return {g: {**newest[0], "minibatch_rng": state["minibatch_rng"]} for g, state in newest.items()}

    def restore(self, saved: dict[int, dict], seq_next: list[int]) -> None:
        self.group_states.restore(saved, [seq_next[0]] * self.groups)


def apply_mode(push: str, algo, model, lr_schedule: LinearAnneal | None, aggregation, groups: int):
    """The parameter rank's side of the push mode ``push`` (the plan's)."""
    if push == "update":
        return ApplyUpdates(model.flat.params, aggregation, groups)
    if push == "allreduce":
        return ApplyWeights(model, aggregation, groups)
    return ApplyGradients(algo, model, lr_schedule)
