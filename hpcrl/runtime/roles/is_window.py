"""Stellaris' IS truncation window (Eq. 2) as one learner group sees it.

Each active group publishes the base version it computes with (a counter word per group); a group
evaluates its minibatch under the other groups' base versions, read from the weight board's
history into a second network, so ``R' = min(|min_i pi_i / mu|, rho)`` (``algo.logps``, then the
algorithm's loss) covers the learner policies of the current aggregation window. Only algorithms
with ``uses_window`` and runs with more than one group have one.
"""
from __future__ import annotations

import numpy as np

from hpcrl.runtime.transport import control


class ISWindow:
    def __init__(self, algo, env, model, board, counters, groups: int, group: int) -> None:
        self.algo, self.board, self.counters = algo, board, counters
        self.groups, self.group = groups, group
        # a second network for the other learners' snapshots (deepcopy would detach the flat views)
        self.snapshot = algo.make_model(env.observation_space, env.action_space, model.device)
        self._buf = np.empty(model.flat.num_params, dtype=np.float32)

    def publish_base(self, version: int) -> None:
        """This group computes with ``version`` from now on (the others' windows read it)."""
        self.counters.set(control.base_word(self.groups, self.group), version)

    def logps(self, minibatch: dict, version: int, words: np.ndarray) -> list[np.ndarray] | None:
        """Log-probs of the minibatch's actions under each other active group's base version (None: no other
        version, or none still on the board)."""
        active = int(words[control.ACTIVE])
        others = {int(words[control.base_word(self.groups, h)]) for h in range(min(active, self.groups))
                  if h != self.group}
        others.discard(version)
        out = []
        for v in sorted(x for x in others if x >= 0):
            if self.board.read_version(v, self._buf):
                self.snapshot.flat.load_(self._buf)
                out.append(self.algo.logps(self.snapshot, minibatch).detach().cpu().numpy())
        return out or None
