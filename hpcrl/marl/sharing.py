"""Dynamic learner sharing (MARLess section 4.3) as one decision per round, no MPI.

:class:`LearnerSharing` strings the steps together: the tolerant-window toggle (4.3.1,
:mod:`detection`); when it switches sharing on for the j-th time, N' = policy_count(j, A)
(4.3.3), KL between the agents' (observation, action) samples (4.3.2), K-means into N' groups,
and per group the member policy with the highest convexity ratio becomes the shared one (4.3.4,
Eq. 1): every member is mapped to its slot. When it switches sharing off, every agent gets its
own slot back, initialised with the weights of the policy it was sharing (``copies``), so the
agents diverge from where they were.

The answer is a :class:`MappingChange` (round, old and new map, weight copies, reason) for the
parameter side to apply to the model (``set_mapping``, ``copy_slot``) and to record.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from hpcrl.marl.detection import SharingToggle
from hpcrl.marl.grouping import group_agents
from hpcrl.marl.scheduler import policy_count
from hpcrl.marl.similarity import kl_matrix


@dataclass
class MappingChange:
    round: int
    old: list[int]
    new: list[int]
    reason: str
    copies: list[tuple[int, int]] = field(default_factory=list)
    """(source slot, destination slot) weight copies to make before the new map is used."""


class LearnerSharing:
    """The sharing state of one run: the toggle, how often sharing was enabled (j), the K-means seed."""

    def __init__(self, agents: int, window: int = 10, gamma: float = 0.1, components: int = 3, seed: int = 0) -> None:
        self.agents = agents
        self.toggle = SharingToggle(window, gamma)
        self.enabled_times = 0
        self.components = components
        self.seed = seed

    def end_round(self, round_index: int, agent_rewards: Sequence[float], current: Sequence[int],
                  samples: Callable[[], list[np.ndarray]], convexity: Callable[[int], float]) -> MappingChange | None:
        """One round's decision. ``samples()`` -> the agents' latest [n, d] (observation, action) rows;
        ``convexity(slot)`` -> C of that policy; both only called when sharing is switched on."""
        if not self.toggle.observe(agent_rewards):
            return None
        old = [int(s) for s in current]
        why = f"k={self.toggle.last_slope:.3f}<gamma={self.toggle.gamma:g}"
        if not self.toggle.sharing:  # switched off: own slot each, from the policy it shared
            new = list(range(self.agents))
            copies = [(old[i], i) for i in range(self.agents) if old[i] != i]
            return MappingChange(round_index, old, new, f"{why}: sharing off, {self.agents} policies",
                                 copies)
        self.enabled_times += 1
        groups = policy_count(self.enabled_times, self.agents)
        labels = group_agents(kl_matrix(samples(), self.components), groups, seed=self.seed)
        new = list(old)
        for g in range(groups):
            members = np.flatnonzero(labels == g)
            slots = sorted({old[m] for m in members})
            base = max(slots, key=convexity)
            for m in members:
                new[m] = base
        return MappingChange(round_index, old, new, f"{why}: sharing on (j={self.enabled_times}), "
                             f"{len(set(new))} policies")
