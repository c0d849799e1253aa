"""Dynamic learner sharing (MARLess 4.3) as a per-round decision, and applying it to a model."""
from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from hpcrl.config import ModelConfig
from hpcrl.marl.model import MultiPolicyActorCritic, copy_slot
from hpcrl.marl.sharing import LearnerSharing


def _samples():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(100, 4)) + (0.0 if i % 2 == 0 else 8.0) for i in range(6)]  # {0,2,4} vs {1,3,5}


def test_sharing_merges_similar_agents_onto_the_most_convex_policy_then_splits_them_again():
    sharing = LearnerSharing(agents=6, window=10, gamma=0.1)
    convexity = {0: 1.0, 1: 2.0, 2: 9.0, 3: 4.0, 4: 3.0, 5: 8.0}.__getitem__
    current, changes = list(range(6)), []
    falling = [[-r] * 6 for r in range(10)]       # reward falls: k < 0.1 once the window is full
    flat = [[5.0] * 6 for _ in range(10)]        # after the switch: flat, a second switch at its 10th round
    for t, rewards in enumerate(falling + flat):
        change = sharing.end_round(t, rewards, current, _samples, convexity)
        if change is not None:
            changes.append(change)
            current = change.new
    on, off = changes
    assert on.round == 9 and off.round == 19
    assert on.new == [2, 5, 2, 5, 2, 5]            # j = 1: N' = 2 groups; bases: slot 2 (C=9), slot 5 (C=8)
    assert "sharing on (j=1), 2 policies" in on.reason
    assert off.new == [0, 1, 2, 3, 4, 5]
    assert sorted(off.copies) == [(2, 0), (2, 4), (5, 1), (5, 3)]  # each split agent starts from the policy it shared


def test_copy_slot_then_map_gives_the_split_agents_their_shared_policy():
    torch.manual_seed(0)
    obs = spaces.Box(-1, 1, (3,), np.float32)
    model = MultiPolicyActorCritic(obs, spaces.Discrete(4), ModelConfig(hidden_sizes=[8]), 3, [0, 1, 2], False)
    x = torch.randn(4, 3)
    shared = model.dist(x, torch.full((4,), 2)).logits
    copy_slot(model, 2, 0)
    assert torch.allclose(model.dist(x, torch.zeros(4, dtype=torch.long)).logits, shared)
    assert not torch.allclose(model.dist(x, torch.ones(4, dtype=torch.long)).logits, shared)
