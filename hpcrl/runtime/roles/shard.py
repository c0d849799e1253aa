"""A parameter shard (``aggregation.shards`` > 1, ranks 1 .. S-1): its slice of the weights, its optimizer state,
rank 0's decisions.

It decides nothing. Each pass it takes its slices of the pushes out of its own mailbox (never blocking: a learner
pushes shard 0 first, so every push rank 0 has admitted reaches here without waiting on anything), then carries out
rank 0's decisions in the order they were sent (``runtime/shards.py``): a step once it holds every push the step
names, exactly as rank 0 steps its own slice (the algorithm's aggregate of the same (push, scale) list, the same
optimizer at the same lr: element-wise the same floats one parameter rank would make), then publishes the version;
a publish without a step; new values after a round's end; a refused push forgotten; the end.

:class:`SliceModel` is what the push mode (``runtime/roles/push_apply.py``) steps on every shard, rank 0 included:
a model whose only parameter is the shard's slice of the flat buffer, sharing its memory.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hpcrl.config import AggregationConfig, DebugConfig
from hpcrl.runtime.backoff import window_owner_nap
from hpcrl.runtime.roles.push_apply import apply_mode
from hpcrl.runtime.shards import ShardDrop, ShardEnd, ShardPublish, ShardSet, ShardStep
from hpcrl.runtime.transport import control
from hpcrl.staleness import GradientRecord


class _SliceFlat:
    def __init__(self, flat, where: slice) -> None:
        self.params, self.grads = flat.params[where], flat.grads[where]
        self.num_params = self.params.numel()


class SliceModel:
    """``model``'s floats ``where`` as a model (same memory): ``parameters()``, the piece of each of the model's
    parameter tensors that lies in ``where`` (so the optimizer steps the same tensors, cut where ``runtime/shards.py``
    allows, as on one parameter rank), and ``flat`` (params, grads): what the algorithm's ``make_optimizer`` /
    ``apply`` and the outer step use."""

    def __init__(self, model, where: slice) -> None:
        self.flat = _SliceFlat(model.flat, where)
        self.device = self.flat.params.device
        self._params = []
        for p in model.parameters():
            whole = model.flat.slice_of(p)
            lo, hi = max(whole.start, where.start), min(whole.stop, where.stop)
            if lo < hi:
                # the flat buffer's memory, as the whole tensor's is
                piece = nn.Parameter(model.flat.params[lo:hi], requires_grad=p.requires_grad)
                piece.grad = model.flat.grads[lo:hi]
                self._params.append(piece)

    def parameters(self):
        return iter(self._params)


@dataclass(frozen=True)
class ShardSettings:
    """The config section a parameter shard owns."""

    aggregation: AggregationConfig
    """The outer step of update pushes."""
    debug: DebugConfig
    """debug.raise_on_rank."""


class ShardRank:
    def __init__(self, job, settings: ShardSettings) -> None:
        self.job, self.plan = job, job.plan
        self.model, self.algo = job.model, job.algo
        self.slice = SliceModel(self.model, job.board.own_slice())
        self.push_mode = apply_mode(self.plan.push, self.algo, self.slice, None, settings.aggregation,
                                    self.plan.groups)
        self.optimizer = self.push_mode.make_optimizer()
        self.held: dict[tuple[int, int], np.ndarray] = {}  # (group, seq) -> this shard's slice of the push
        self.dropped: set[tuple[int, int]] = set()  # pushes rank 0 refused before their slice got here
        self.todo: deque = deque()  # decisions received, not yet carried out
        self.heartbeat = control.Heartbeat(job.counters, self.plan.groups, job.rank, job.clock)
        self.fault = control.FaultInjector(settings.debug, job.rank, clock=job.clock)
        self.summary: dict = {}
        self.handlers = {ShardStep: self._step, ShardPublish: self._publish_as, ShardSet: self._set,
                         ShardDrop: self._drop}

    def publish_initial(self) -> None:
        """Version 0, the same initial weights on every rank, before any rank starts (a sharded run starts at 0:
        it is not resumable yet)."""
        self.version = 0
        self._publish()

    def run(self) -> None:
        backoff = window_owner_nap(self.job.clock)
        while True:
            self.fault.check()
            self.heartbeat.beat()
            got = self.job.mailbox.poll()
            for header, piece in got:
                key = (header.group, header.seq)
                if key in self.dropped:
                    self.dropped.discard(key)
                else:
                    self.held[key] = piece
            self.todo += self.job.shard_link.poll()
            busy = bool(got)
            while self.todo:
                event = self.todo[0]
                if isinstance(event, ShardEnd):
                    return
                if not self._carry_out(event):
                    break
                self.todo.popleft()
                busy = True
            backoff.reset() if busy else backoff.sleep()

    def _carry_out(self, event) -> bool:
        """One decision (its handler); False when a step waits for a push still on its way."""
        return self.handlers[type(event)](event)

    def _step(self, event: ShardStep) -> bool:
        if any((p.group, p.seq) not in self.held for p in event.parts if not p.carried):
            return False
        step = [(GradientRecord(group=p.group, seq=p.seq, base_version=0, samples=0, node=p.node,
                                scaled_for=p.scaled_for, grad=None if p.carried else self.held.pop((p.group, p.seq))),
                 p.scale) for p in event.parts]
        for group in self.optimizer.param_groups:
            group["lr"] = event.lr
        self.push_mode.apply(self.optimizer, self.algo.aggregate(step))
        return self._publish_as(event)

    def _publish_as(self, event: ShardStep | ShardPublish) -> bool:
        self.version = event.version
        self._publish()
        return True

    def _set(self, event: ShardSet) -> bool:
        self.slice.flat.params.copy_(torch.from_numpy(event.values))
        return True

    def _drop(self, event: ShardDrop) -> bool:
        key = (event.group, event.seq)
        if self.held.pop(key, None) is None:
            self.dropped.add(key)
        return True

    def _publish(self) -> None:
        self.job.board.publish(self.version, self.model.flat.numpy())

    def close_on_error(self) -> None:
        pass
