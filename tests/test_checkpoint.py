"""Checkpoints: atomic replacement, everything needed to resume comes back."""
import os
import random

import numpy as np
import torch

from hpcrl.runtime.checkpoint import checkpoint_path, load_checkpoint, restore_rng, rng_state, save_checkpoint
from hpcrl.staleness import Stellaris


def test_round_trip_keeps_params_optimizer_policy_and_rng(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    policy = Stellaris(d=0.9, v=3)
    policy.delta_max, policy.round = 5, 7
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = {"params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]), "optimizer": opt.state_dict(),
             "admission_policy": policy, "version": 1234, "rng": rng_state()}
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    save_checkpoint(tmp_path, state)
    back = load_checkpoint(tmp_path)
    assert back["version"] == 1234
    assert torch.equal(back["params"], state["params"])
    assert back["admission_policy"].delta_max == 5 and back["admission_policy"].threshold == 5 * 0.9 ** 7
    opt2 = torch.optim.Adam(torch.nn.Linear(3, 2).parameters(), lr=1e-3)
    opt2.load_state_dict(back["optimizer"])
    assert opt2.state_dict()["state"][0]["step"] == 1
    restore_rng(back["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_replacement_is_atomic_and_keeps_the_previous(tmp_path):
    assert load_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, {"version": 1})
    save_checkpoint(tmp_path, {"version": 2})
    assert load_checkpoint(tmp_path)["version"] == 2
    folder = checkpoint_path(tmp_path).parent
    assert sorted(os.listdir(folder)) == ["latest.pt", "previous.pt"]  # no temporary left behind
    assert torch.load(folder / "previous.pt", weights_only=False)["version"] == 1
