"""Checkpoints under trouble (issue 41 item 7): a full disk during a save is one line that says "No space left"
(torch's own writer says only "unexpected pos"); the fallback from a bad latest.pt to previous.pt is said once, and
the resumed job does not keep the bad file as its previous.pt.

The full disk is a small tmpfs mounted for the test (needs root; skipped with the reason otherwise).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from hpcrl.cli import main as cli_main
from hpcrl.io.errors import RecordWriteError
from hpcrl.runtime.record.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint

REPO = Path(__file__).resolve().parents[1]


def mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs ({(proc.stderr or proc.stdout).strip() or 'mount failed'}); "
                    "needs root")


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "disk"
    mount_tmpfs(where, "2m")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_last_checkpoint(small_disk):
    save_checkpoint(small_disk, {"version": 1, "params": torch.zeros(1000)})
    with pytest.raises(RecordWriteError) as info:
        save_checkpoint(small_disk, {"version": 2, "params": torch.zeros(1_000_000)})  # 4 MB on a 2 MB disk
    text = str(info.value)
    assert "\n" not in text and "No space left on device" in text and str(checkpoint_path(small_disk)) in text, text
    assert "is kept" in text and info.value.errno == 28
    folder = checkpoint_path(small_disk).parent
    assert sorted(os.listdir(folder)) == ["latest.pt"]  # the partial temporary file is gone: its space is free again
    assert load_checkpoint(small_disk)["version"] == 1
    save_checkpoint(small_disk, {"version": 3, "params": torch.zeros(1000)})  # and the next save that fits works
    assert load_checkpoint(small_disk)["version"] == 3


def run_config(run_dir: Path, steps: int, hidden: list[int]) -> dict:
    return {"name": "rel", "env": {"id": "CartPole-v1", "num_envs": 2}, "actors": {"count": 2, "fragment_length": 16},
            "learners": {"groups": 1}, "model": {"hidden_sizes": hidden},
            "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 64, "num_sgd_iter": 1},
            "stop": {"total_env_steps": steps}, "io": {"run_dir": str(run_dir), "checkpoint_every": 5},
            "launch": {"runner": "serial", "timeout_seconds": 120}}


def hpcrl_run(capfd, *args: str) -> subprocess.CompletedProcess:
    """``hpcrl run ARGS`` of a serial run in this process (the serial runner needs none of its own), with what it
    printed."""
    capfd.readouterr()
    code = cli_main(["run", *args])
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["hpcrl", "run", *args], code, out, err)


@pytest.mark.parametrize("runner", ["serial", pytest.param("mpi", marks=pytest.mark.mpi)])
def test_a_run_whose_disk_fills_at_its_checkpoint_says_no_space_left_in_its_last_line(small_disk, tmp_path, runner,
                                                                                       capfd):
    # a 512-wide model's checkpoint (params and Adam state, about 6.5 MB) cannot fit on the 2 MB disk; the record
    # written up to the first checkpoint (a few hundred KB) can
    path = tmp_path / "c.yaml"
    data = run_config(small_disk / "run", 100_000, [512, 512])
    data["launch"]["runner"] = runner
    path.write_text(yaml.safe_dump(data))
    if runner == "serial":
        res = hpcrl_run(capfd, str(path))
    else:
        res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(path)], capture_output=True, text=True,
                             timeout=180, cwd=REPO)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("hpcrl run: ") and "no space left on device" in last.lower(), res.stderr[-3000:]
    assert "rank 0 (parameter" in last and "cannot write checkpoint" in last, last
    assert "unexpected pos" not in res.stderr and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert not list((small_disk / "run" / "checkpoints").glob(".*.tmp"))


def test_the_fallback_to_previous_is_said_once_per_resume(tmp_path, capfd):
    path, run_dir = tmp_path / "c.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump(run_config(run_dir, 640, [32, 32])))  # 5 batches: a periodic checkpoint, a final
    first = hpcrl_run(capfd, str(path))
    assert first.returncode == 0, first.stderr[-3000:]
    save_checkpoint(run_dir, load_checkpoint(run_dir))  # latest and previous, the same state
    latest = checkpoint_path(run_dir)
    latest.write_bytes(latest.read_bytes()[:1000])  # cut short
    res = hpcrl_run(capfd, "--resume", str(run_dir), "-o", "stop.total_env_steps=1")  # stops at once: one (final) save
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [line for line in res.stderr.splitlines() if "is unusable; resuming from" in line]
    assert len(lines) == 1, res.stderr[-3000:]
    assert str(latest) in lines[0] and "previous.pt" in lines[0]
    # the resumed job's save did not make the unusable latest.pt its previous.pt: both load
    assert load_checkpoint(run_dir)["env_steps"] >= 640
    assert torch.load(latest.parent / "previous.pt", weights_only=False)["format"] == 1
