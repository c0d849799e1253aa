"""MARLess' policy and critic learners (section 4.2, Fig. 5) as learner groups, on the parameter rank and the learners.

With ``algo.policy_learners`` every active learner group gets every fragment and trains only the
units assigned to it. A unit is one policy of the current agent -> policy map with its critic
(``both``; IQL: its Q-network), or with ``algo.critic_learners`` the policy network (``policy``)
and the critic (``critic``) as two units. Units are dealt out in turn (:func:`assigned_units`): the k-th
policy unit to group k mod P and the k-th critic unit to group P + k mod C, where P policy
groups and C critic groups share the active groups (without critic learners every active group
is a policy group and trains its policies' critics too). One group per unit is active, at most ``learners.groups``
(:func:`groups_needed`), so when learner sharing merges policies the groups left without a unit
park, and when it splits them they are activated again (the parameter rank records both in
``elastic_events``).

A group's gradient then carries only its units' blocks (:func:`unit_blocks`: a policy network and
its row of a shared log-std, a critic network). The parameter rank averages each block over the
gradients of a step that carry it (:func:`aggregate_by_block`: Stellaris' mean would halve a block
that one of two groups carries) and steps only the blocks a gradient carries
(:func:`apply_to_carried_blocks`: Adam on a zero block would still move it by its momentum), as
separate per-unit optimizers would.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from hpcrl.staleness import Step, aggregate

POLICY, CRITIC, BOTH = "policy", "critic", "both"


@dataclass(frozen=True)
class Block:
    """One unit's trained parameters: flat-buffer indices, its own parameters, its row of a shared log-std."""

    slot: int
    part: str
    indices: np.ndarray
    params: tuple
    log_std_row: int | None


def split_groups(active: int, critic_learners: bool) -> tuple[int, int]:
    """(policy groups, critic groups) among ``active`` groups: half each (the odd one to policies) with
    critic learners, else every group a policy group."""
    if not critic_learners:
        return active, 0
    return -(-active // 2), active // 2


def assigned_units(mapping: Sequence[int], group: int, active: int, critic_learners: bool = False
                   ) -> list[tuple[int, str]]:
    """The (policy slot, part) units learner group ``group`` trains while ``active`` groups are: the map's
    distinct policies in slot order dealt out in turn to the policy groups (and their critics to the
    critic groups); none for a group at or beyond ``active``."""
    used = sorted(set(int(x) for x in mapping))
    n_pol, n_cri = split_groups(max(active, 1), critic_learners)
    if group < n_pol:
        return [(p, POLICY if critic_learners else BOTH) for k, p in enumerate(used) if k % n_pol == group]
    if group < n_pol + n_cri:
        return [(p, CRITIC) for k, p in enumerate(used) if k % n_cri == group - n_pol]
    return []


def groups_needed(mapping: Sequence[int], groups: int, critic_learners: bool = False) -> int:
    """One active group per unit of the map (a policy, or a policy and a critic), at most ``groups``;
    at least two with critic learners (one of each kind)."""
    units = len(set(int(x) for x in mapping)) * (2 if critic_learners else 1)
    return min(groups, units)


def unit_blocks(model, critic_learners: bool = False) -> list[Block]:
    """Every slot's units as blocks of the flat buffer: its policy network with its row of a shared
    log-std (Box actions) and its critic, as one block or (critic learners) two."""
    flat, log_std = model.flat, getattr(model, "log_std", None)

    def block(slot, part, params, row):
        idx = [np.arange(flat.slice_of(p).start, flat.slice_of(p).stop) for p in params]
        if row is not None:
            start = flat.slice_of(log_std).start + row * model.out
            idx.append(np.arange(start, start + model.out))
        return Block(slot, part, np.concatenate(idx), tuple(params), row)

    out = []
    for s in range(model.slots):
        row = s if log_std is not None else None
        if critic_learners:
            out += [block(s, POLICY, list(model.pis[s].parameters()), row),
                    block(s, CRITIC, list(model.vfs[s].parameters()), None)]
        else:  # the slot's trained networks: policy and critic, or a Q-network
            out.append(block(s, BOTH, model.policy_parameters(s), row))
    return out


def aggregate_by_block(step: Step, blocks: list[Block]) -> np.ndarray:
    """The step's gradient: each block is (1/H_b) sum_c scale_c g_c over the H_b gradients that carry it
    (a non-zero block); everything else Stellaris' mean (:func:`hpcrl.staleness.aggregate`)."""
    out = aggregate(step, np.empty(step[0][0].grad.shape, dtype=np.float32))  # written below: never a record's own
    for b in blocks:
        carriers = [(rec.grad[b.indices], scale) for rec, scale in step if np.any(rec.grad[b.indices])]
        if carriers:
            out[b.indices] = sum(np.float32(scale / len(carriers)) * g for g, scale in carriers)
    return out


def apply_to_carried_blocks(model, optimizer, gradient: np.ndarray, blocks: list[Block]) -> list[Block]:
    """One optimizer step for the blocks ``gradient`` carries (non-zero); returns the idle blocks.

    Idle blocks' own parameters get no gradient (the optimizer skips them); their rows of a shared
    log-std and its Adam moments are put back after the step."""
    flat = model.flat
    flat.grads.copy_(torch.as_tensor(gradient, device=flat.grads.device))
    idle = [b for b in blocks if not np.any(gradient[b.indices])]
    for b in idle:
        for p in b.params:
            p.grad = None
    rows = [b.log_std_row for b in idle if b.log_std_row is not None]
    kept = []
    if rows:
        log_std = model.log_std
        rows_t = torch.as_tensor(rows, device=log_std.device)
        state = getattr(optimizer, "state", {}).get(log_std, {})
        kept = [(t, t[rows_t].clone()) for t in [log_std.data, *(v for k, v in state.items() if k != "step")]]
    optimizer.step()
    with torch.no_grad():
        for t, saved in kept:
            t[rows_t] = saved
    flat.zero_grad()  # every grad back on its view of the buffer
    return idle


class PolicyLearnerHooks:
    """The contract hooks of a MARL algorithm whose ``cfg.policy_learners`` may be on (mixed in before
    :class:`~hpcrl.algos.base.Algorithm`); each passes to the default when it is off. ``make_model``
    must set :attr:`blocks` (:func:`unit_blocks`)."""

    learner_group: tuple[int, int] = (0, 1)
    """(this learner group, active groups), as ``assign_learner`` last said."""
    blocks: list[Block] = []

    def assign_learner(self, group: int, active_groups: int) -> None:
        """(group, active groups) among the policy and critic groups (the runtime counts a post-processing
        group out of both)."""
        self.learner_group = (group, active_groups)

    def learner_groups_needed(self, model, groups: int) -> int | None:
        """One group per unit, after the post-processing group when there is one (group 0, always active)."""
        if not self.cfg.policy_learners:
            return None
        pp = int(getattr(self.cfg, "postprocess_learner", False))
        return pp + groups_needed(model.mapping().tolist(), groups - pp, getattr(self.cfg, "critic_learners", False))

    def aggregate(self, step: Step) -> np.ndarray:
        if not self.cfg.policy_learners:
            return super().aggregate(step)
        return aggregate_by_block(step, self.blocks)

    def apply(self, model, optimizer, gradient: np.ndarray) -> None:
        if not self.cfg.policy_learners:
            return super().apply(model, optimizer, gradient)
        apply_to_carried_blocks(model, optimizer, gradient, self.blocks)
