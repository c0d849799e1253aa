"""What head and workers say to each other on the merged communicator (head = rank 0, worker i = rank i+1).

Head -> worker (the tag is the command):

- ``TAG_STEP``: the worker's slice of the actions, packed as the action space's dtype;
- ``TAG_ACT``: worker-side inference: float64 ``[kl_estimate, newest_version]`` (AAPS decides on the worker);
- ``TAG_RESET``: pickled ``(seed, options)`` (rare, so pickle is fine);
- ``TAG_CLOSE``: empty; the worker closes its envs and leaves.

Worker -> head: ``TAG_RESULT`` is one packed buffer (:func:`result_layout`): an int64 header, the
observations, rewards, terminated, truncated, (worker-side inference: the actions taken, their
log-probabilities and the policy's outputs), then the packed infos when they fit (else they follow
as ``TAG_INFO``). A new info schema goes first as ``TAG_SCHEMA``; an exception in the worker's
envs goes as ``TAG_ERROR`` (its text) instead of the result.
"""
from __future__ import annotations

import numpy as np

from hpcrl.runtime.transport.layout import PackedLayout

TAG_STEP, TAG_ACT, TAG_RESET, TAG_CLOSE = 11, 12, 13, 14
TAG_RESULT, TAG_SCHEMA, TAG_INFO, TAG_ERROR = 21, 22, 23, 24

HEADER = ("schema", "info_bytes", "info_inline", "version", "syncs", "steps")
"""int64 words at the start of a result: info schema id (-1: pickled), info size in bytes, 1 when the
infos follow in this buffer, the worker's cached policy version, its sync count, its env steps."""

INFO_ROOM = 1 << 16
"""Bytes kept after the fields of a result for infos (more go in their own TAG_INFO message)."""


def result_layout(k: int, obs_shape: tuple, obs_dtype, action_shape: tuple, action_dtype,
                  policy_width: int = 0) -> PackedLayout:
    """Byte layout of one worker's result for ``k`` envs; ``policy_width`` > 0 adds the inference fields."""
    fields = {
        "header": ((len(HEADER),), np.int64),
        "obs": ((k, *obs_shape), obs_dtype),
        "rewards": ((k,), np.float64),
        "terminated": ((k,), np.bool_),
        "truncated": ((k,), np.bool_),
    }
    if policy_width:
        fields["actions"] = ((k, *action_shape), action_dtype)
        fields["logprob"] = ((k,), np.float32)
        fields["outputs"] = ((k, policy_width), np.float32)
    return PackedLayout(fields)


def info_room(layout: PackedLayout, k: int, obs_nbytes: int) -> int:
    """Inline info bytes: enough for every env's final observation plus a few numbers each."""
    return max(INFO_ROOM, 2 * k * obs_nbytes + 64 * k)


def split(num_envs: int, workers: int) -> list[int]:
    """Envs per worker, as even as possible, the first ones one more (sum = num_envs)."""
    base, extra = divmod(num_envs, workers)
    return [base + (i < extra) for i in range(workers)]
