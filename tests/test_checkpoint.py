"""Checkpoints: a kill at any step of a save, damaged files, stale temporaries; everything needed to resume comes back."""
import os
import random

import numpy as np
import pytest
import torch

from hpcrl.runtime.record.checkpoint import (SAVE_STEPS, CheckpointError, checkpoint_path, clean_temp_files, has_checkpoint,
                                      load_checkpoint, restore_rng, rng_state, save_checkpoint)
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


def _save_killed_at(run_dir, version, step):
    """save_checkpoint(version) in a forked child that dies (os._exit, no cleanup) right after ``step``."""
    import hpcrl.runtime.record.checkpoint as ckpt

    pid = os.fork()
    if pid == 0:  # child: nothing below may return into pytest
        try:
            ckpt._after_step = lambda name: os._exit(17) if name == step else None
            save_checkpoint(run_dir, {"version": version})
            os._exit(0)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 17, f"the save never reached step {step!r}"


@pytest.mark.parametrize("step", SAVE_STEPS)
def test_a_kill_at_any_step_leaves_a_latest_and_the_next_save_cleans_up(tmp_path, step, capfd):
    save_checkpoint(tmp_path, {"version": 1})
    save_checkpoint(tmp_path, {"version": 2})
    _save_killed_at(tmp_path, 3, step)
    folder = checkpoint_path(tmp_path).parent
    assert checkpoint_path(tmp_path).is_file(), f"no latest.pt after a kill at {step}"
    expected = 3 if step == "latest_replaced" else 2
    assert load_checkpoint(tmp_path)["version"] == expected
    assert capfd.readouterr().err == ""  # latest.pt was intact: no fallback message
    assert torch.load(folder / "previous.pt", weights_only=False)["version"] in (1, 2)
    save_checkpoint(tmp_path, {"version": 4})
    assert sorted(os.listdir(folder)) == ["latest.pt", "previous.pt"]
    assert load_checkpoint(tmp_path)["version"] == 4
    assert torch.load(folder / "previous.pt", weights_only=False)["version"] == expected


@pytest.mark.parametrize("damage", ["empty", "truncated", "missing"])
def test_a_bad_latest_falls_back_to_previous_with_one_line(tmp_path, damage, capfd):
    save_checkpoint(tmp_path, {"version": 1, "params": torch.arange(1000.0)})
    save_checkpoint(tmp_path, {"version": 2, "params": torch.arange(1000.0)})
    latest = checkpoint_path(tmp_path)
    data = latest.read_bytes()
    if damage == "missing":
        latest.unlink()
    else:
        latest.write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    assert load_checkpoint(tmp_path)["version"] == 1
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and str(latest) in err and str(latest.parent / "previous.pt") in err, err
    assert has_checkpoint(tmp_path)
    if damage != "missing":
        assert ("empty file" if damage == "empty" else "truncated") in err
    previous = latest.parent / "previous.pt"  # both bad: one line naming both, no traceback material
    previous.write_bytes(b"")
    with pytest.raises(CheckpointError, match="no intact checkpoint") as info:
        load_checkpoint(tmp_path)
    assert "\n" not in str(info.value) and str(previous) in str(info.value)


def test_stale_temp_files_are_removed_and_never_loaded(tmp_path):
    save_checkpoint(tmp_path, {"version": 1})
    folder = checkpoint_path(tmp_path).parent
    (folder / ".latest.pt.999999.tmp").write_bytes(b"half a checkpoint")
    torch.save({"format": 1, "version": 99}, folder / ".latest.pt.999998.tmp")  # complete, never renamed
    assert load_checkpoint(tmp_path)["version"] == 1  # loading reads, never deletes (a live save may own them)
    assert [p.name for p in clean_temp_files(tmp_path)] == [".latest.pt.999998.tmp", ".latest.pt.999999.tmp"]
    assert sorted(os.listdir(folder)) == ["latest.pt"]
    (folder / ".previous.pt.5.tmp").write_bytes(b"x")
    save_checkpoint(tmp_path, {"version": 2})
    assert sorted(os.listdir(folder)) == ["latest.pt", "previous.pt"]
