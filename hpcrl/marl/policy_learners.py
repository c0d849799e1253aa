"""MARLess' policy learners (section 4.2): one learner group per policy, on the parameter rank and the learners.

With ``algo.policy_learners`` every active learner group gets every fragment and trains only the
policies assigned to it: the distinct policies of the current agent -> policy map, in slot order,
the k-th to group k mod active (:func:`assigned_policies`). One group per policy is active (at most
``learners.groups``), so when learner sharing merges policies the groups left without one park,
and when it splits them they are activated again (the parameter rank records both in
``elastic_events``).

A group's gradient then carries only its policies' blocks (each slot's policy and critic, and its
row of a shared log-std). The parameter rank averages each slot's block over the gradients of a
step that carry it (:func:`aggregate_by_slot`: Stellaris' mean would halve a block that one of two
groups carries) and steps only the slots a gradient carries (:func:`apply_to_carried_slots`: Adam
on a zero block would still move it by its momentum), as separate per-policy optimizers would.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from hpcrl.staleness import Step, aggregate


def assigned_policies(mapping: Sequence[int], group: int, active: int) -> list[int]:
    """The policies learner group ``group`` trains while ``active`` groups are: the k-th distinct policy
    of the map (in slot order) belongs to group k mod active; none for a group at or beyond ``active``."""
    return [p for k, p in enumerate(sorted(set(int(x) for x in mapping))) if k % max(active, 1) == group]


def groups_needed(mapping: Sequence[int], groups: int) -> int:
    """One active group per policy of the map, at most ``groups``."""
    return min(groups, len(set(int(x) for x in mapping)))


def slot_blocks(model) -> list[np.ndarray]:
    """Flat-buffer indices of each policy slot's trained parameters: its policy and critic networks,
    and its row of a shared log-std (Box actions)."""
    flat, blocks = model.flat, []
    for s in range(model.slots):
        parts = [np.arange(flat.slice_of(p).start, flat.slice_of(p).stop) for p in model.policy_parameters(s)]
        if getattr(model, "log_std", None) is not None:
            start = flat.slice_of(model.log_std).start + s * model.out
            parts.append(np.arange(start, start + model.out))
        blocks.append(np.concatenate(parts))
    return blocks


def aggregate_by_slot(step: Step, blocks: list[np.ndarray]) -> np.ndarray:
    """The step's gradient: each slot's block is (1/H_s) sum_c scale_c g_c over the H_s gradients that
    carry it (a non-zero block); everything else Stellaris' mean (:func:`hpcrl.staleness.aggregate`)."""
    out = aggregate(step)
    for idx in blocks:
        carriers = [(rec.grad[idx], scale) for rec, scale in step if np.any(rec.grad[idx])]
        if carriers:
            out[idx] = sum(np.float32(scale / len(carriers)) * g for g, scale in carriers)
    return out


def apply_to_carried_slots(model, optimizer, gradient: np.ndarray, blocks: list[np.ndarray]) -> list[int]:
    """One optimizer step for the slots ``gradient`` carries (non-zero blocks); returns the idle slots.

    Idle slots' own parameters get no gradient (the optimizer skips them); their row of a shared
    log-std and its Adam moments are put back after the step."""
    flat = model.flat
    flat.grads.copy_(torch.as_tensor(gradient, device=flat.grads.device))
    idle = [s for s, idx in enumerate(blocks) if not np.any(gradient[idx])]
    for s in idle:
        for p in model.policy_parameters(s):
            p.grad = None
    log_std = getattr(model, "log_std", None)
    kept = []
    if idle and log_std is not None:
        rows = torch.as_tensor(idle, device=log_std.device)
        state = getattr(optimizer, "state", {}).get(log_std, {})
        kept = [(t, t[rows].clone()) for t in [log_std.data, *(v for k, v in state.items() if k != "step")]]
    optimizer.step()
    with torch.no_grad():
        for t, saved in kept:
            t[rows] = saved
    flat.zero_grad()  # every grad back on its view of the buffer
    return idle
