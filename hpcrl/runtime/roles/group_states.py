"""Update push's state that outlives one batch: each learner group's own optimizer and minibatch generator.

A group sends its state with the activity report right after each update it pushes (numpy arrays: a pickled
array costs a tenth of a pickled tensor); the parameter rank keeps the newest few per group
(:class:`GroupStates`), checkpoints the one of each group's newest update it has taken (seq_next - 1), and hands
it back to the group on ``--resume`` (:func:`as_tensors` makes it loadable again).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.messages import GroupState

WAIT_SECONDS = 30.0
"""How long a checkpoint waits for a state still on its way (sent after the push it belongs to)."""


class GroupStates:
    """Parameter rank: the groups' states by group and sequence number."""

    def __init__(self, groups: int, keep: int) -> None:
        self.by_group: dict[int, dict[int, dict]] = {g: {} for g in range(groups)}
        self.keep = keep  # pushed, not yet taken: at most a group's mailbox slots, plus the one taken

    def add(self, report: GroupState | None) -> None:
        """A group's state after one of its updates (the ``group_state`` of its activity report), if any."""
        if report is None:
            return
        kept = self.by_group[report.group]
        kept[report.seq] = report.state
        while len(kept) > self.keep:
            kept.pop(min(kept))

    def restore(self, saved: dict[int, dict], seq_next: list[int]) -> None:
        """A checkpoint's states, each the one after its group's update seq_next - 1."""
        for g, state in saved.items():
            self.by_group[g] = {seq_next[g] - 1: state}

    def newest(self, seq_next: list[int], drain: Callable[[], object] | None = None, clock: Clock = WALL
               ) -> dict[int, dict]:
        """Each group's state after its newest update taken (seq_next - 1); with ``drain``, wait (draining reports)
        up to WAIT_SECONDS for one still on its way, and say in one line which groups resume with fresh state."""
        deadline = clock.now() + WAIT_SECONDS
        while True:
            missing = [g for g, n in enumerate(seq_next) if n and n - 1 not in self.by_group[g]]
            if not missing or drain is None or clock.now() > deadline:
                break
            drain()
            clock.sleep(1e-3)
        if missing and drain is not None:
            print(f"hpcrl: warning: no optimizer state from learner group(s) {missing} for their newest update; "
                  "the checkpoint resumes them with fresh optimizer state", flush=True)
        return {g: self.by_group[g][n - 1] for g, n in enumerate(seq_next) if n and g not in missing}


def on_host(state):
    """An optimizer state dict with numpy arrays for its tensors (it travels to the parameter rank, which may
    have no GPU)."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu().numpy()
    if isinstance(state, dict):
        return {k: on_host(v) for k, v in state.items()}
    if isinstance(state, list):
        return [on_host(v) for v in state]
    return state


def as_tensors(state):
    """:func:`on_host`'s state dict with tensors again (what ``load_state_dict`` takes)."""
    if isinstance(state, np.ndarray):
        return torch.from_numpy(state.copy())
    if isinstance(state, dict):
        return {k: as_tensors(v) for k, v in state.items()}
    if isinstance(state, list):
        return [as_tensors(v) for v in state]
    return state
