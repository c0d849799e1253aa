"""Sharded parameter ranks (``aggregation.shards``): who owns which floats, and the decisions rank 0 sends the others.

S ranks own the weights: shard s owns the contiguous floats ``bounds(P, S)[s] : bounds(P, S)[s + 1]`` of the flat
buffer and the optimizer state of those floats. Rank 0 (shard 0, the parameter rank) alone decides: it admits
pushes on the headers its own mailbox receives and sends every other shard, in order, what to do (one MPI message
each, ``runtime/transport/shard_link.py``):

- :class:`ShardStep`: apply the step of these (group, seq, lr scale) parts at this lr and publish ``version``;
- :class:`ShardPublish`: publish the slice as it is as ``version`` (a new version without a step: a group activated);
- :class:`ShardSet`: the slice's values are now these (the algorithm's ``end_round`` changed the full weights);
- :class:`ShardDrop`: forget a push rank 0 refused (a non-finite gradient);
- :class:`ShardEnd`: the run is over.

The follower's side is ``runtime/roles/shard.py``, rank 0's ``runtime/roles/shard_lead.py``; a reader takes a
version only once every shard has published it (``runtime/transport/sharded.py``). docs/architecture.md, "Sharded
parameter ranks", says why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


ALIGN = 512
"""A shard's slice starts at a parameter tensor's start or a multiple of this many floats into one. The optimizer
steps each shard's piece of a tensor as its own tensor; torch's CPU kernels (fused Adam) run vectors from a tensor's
start and its last few floats on their own, with other roundings: pieces cut on this alignment keep every float in
the same place, so S shards step each float exactly as one parameter rank does (a cut elsewhere moved a tensor's last
float into a vector: 1e-10 apart after five Adam steps)."""


def cut_points(sizes: list[int]) -> list[int]:
    """Where a slice may start: each parameter tensor's start and every ``ALIGN`` floats into it; then the end."""
    points, start = [], 0
    for n in sizes:
        points += range(start, start + n, ALIGN)
        start += n
    return points + [start]


def bounds(sizes: list[int], shards: int) -> list[int]:
    """The S + 1 float offsets of the shards' slices of a flat buffer of parameter tensors of ``sizes`` floats: the
    cut points nearest an even split. ValueError (one line) when the buffer has fewer than S slices to give."""
    points = cut_points(sizes)
    total = points[-1]
    if not 1 <= shards <= len(points) - 1:
        raise ValueError(f"{total} floats in {len(sizes)} tensors split at most {len(points) - 1} ways (whole "
                         f"tensors, or {ALIGN}-float blocks of one); allowed: 1 .. {len(points) - 1}")
    out = [0]
    for s in range(1, shards):
        left = shards - s  # slices still to cut after this one, each needing a point of its own
        free = [c for c in points if c > out[-1]][:-left]
        out.append(min(free, key=lambda c: (abs(c - s * total / shards), c)))
    return out + [total]


def param_sizes(model) -> list[int]:
    """The floats of each parameter tensor of ``model``, in its flat buffer's order."""
    return [p.numel() for p in model.parameters()]


class StepPart(NamedTuple):
    """One push of a step, as ``staleness.aggregate`` needs it."""

    group: int
    seq: int
    scale: float
    """alpha_c / alpha_0."""
    node: int
    scaled_for: int
    """The record's (a node's combined push: its step size; 0 otherwise)."""
    carried: bool
    """Its gradient is in its node's combined push (learners.combine=node): no slice of its own comes."""

    @classmethod
    def of(cls, rec, scale: float) -> "StepPart":
        return cls(rec.group, rec.seq, float(scale), rec.node, rec.scaled_for, rec.grad is None)


@dataclass(frozen=True)
class ShardStep:
    version: int
    parts: tuple[StepPart, ...]
    """Every push in the step."""
    lr: float


@dataclass(frozen=True)
class ShardPublish:
    version: int


@dataclass(frozen=True)
class ShardSet:
    values: np.ndarray
    """float32, the receiving shard's slice."""


@dataclass(frozen=True)
class ShardDrop:
    group: int
    seq: int


@dataclass(frozen=True)
class ShardEnd:
    pass


ShardEvent = ShardStep | ShardPublish | ShardSet | ShardDrop | ShardEnd
