"""The fused loop (HA2C/HDDPG on a batched env) checkpoints and resumes like the roles (issue 27 item 5).

A run stopped by its step budget and resumed with a larger one ends with the weights, optimizer state and
record of one run that went straight to the larger budget: the checkpoint holds the env, the rollout buffer
and the RNG states, and run.h5's tables go on without a duplicated or lost row. A run stopped by Ctrl-C
writes a checkpoint and its summary, and `hpcrl run --resume` goes on from it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcrl.cli import main as cli_main
from hpcrl.config import build_config
from hpcrl.io import read_table
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.record.checkpoint import load_checkpoint
from hpcrl.runtime.runners import fused

N, T, K = 32, 8, 5  # instances, fragment length, iterations per window (stats_every)
STEPS = N * T  # env steps per iteration


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config(algo: str, iterations: int, **io):
    env = "hpcrl/CartPole-v1" if algo == "ha2c" else "hpcrl/Pendulum-v1"
    kwargs = {"desync_episodes": True, "max_episode_steps": 50}  # Pendulum's 200 would end none in 23 iterations
    return build_config({"name": "t", "env": {"id": env, "num_envs": N, "kwargs": kwargs},
                         "algo": {"name": algo, "stats_every": K}, "actors": {"count": 1, "fragment_length": T},
                         "launch": {"runner": "serial"}, "io": {"tensorboard": False, **io},
                         "stop": {"total_env_steps": iterations * STEPS, "target_return": None}})


def tables(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    return {t: read_table(run_dir / "run.h5", t) for t in ("updates", "episodes", "rounds")}


@pytest.mark.parametrize("algo", ["ha2c", "hddpg"])
def test_a_resumed_run_goes_on_as_one_uninterrupted_run(tmp_path, algo):
    straight, split = tmp_path / "straight", tmp_path / "split"
    fused.run(make_plan(config(algo, 23)), straight)
    # 12 iterations: windows of 5, 5, 2, a periodic checkpoint after the second, the final one after the third
    first = fused.run(make_plan(config(algo, 12, checkpoint_every=5, checkpoint_min_seconds=0)), split).summary
    assert first["env_steps"] == 12 * STEPS and first["files"]["checkpoint"] == str(split / "checkpoints/latest.pt")
    saved = load_checkpoint(split)
    assert (saved["version"], saved["env_steps"], saved["round"]) == (12, 12 * STEPS, 3)
    assert set(saved["fused"]) == {"obs", "filled", "generator", "env", "buffer"}
    assert saved["optimizer"]["state"], "the optimizer's moments are in the checkpoint"

    second = fused.run(make_plan(config(algo, 23)), split, resume=True).summary
    assert second["env_steps"] == 23 * STEPS and second["version"] == 23
    assert second["stop_reason"] == f"stop.total_env_steps={23 * STEPS} reached"
    a, b = load_checkpoint(straight), load_checkpoint(split)
    assert torch.equal(a["params"], b["params"]), "the resumed run trained as the straight one did"
    for i, s in a["optimizer"]["state"].items():
        assert torch.equal(s["exp_avg_sq"], b["optimizer"]["state"][i]["exp_avg_sq"])

    ta, tb = tables(straight), tables(split)
    assert list(tb["updates"]["version"]) == list(range(1, 24)), "no update row lost or repeated"
    for col in ("return", "length", "env_index", "env_steps", "policy_version"):
        assert np.array_equal(ta["episodes"][col], tb["episodes"][col]), col
    assert len(tb["episodes"]["return"]) == second["episodes"] > 0
    # rounds: 5, 5, 2 | 5, 5, 1 iterations; their env steps add up and the totals only grow
    assert list(tb["rounds"]["round"]) == list(range(6))
    assert list(tb["rounds"]["env_steps"]) == [s * STEPS for s in (5, 5, 2, 5, 5, 1)]
    assert list(tb["rounds"]["env_steps_total"]) == list(np.cumsum(tb["rounds"]["env_steps"]))


def test_rows_written_after_the_checkpoint_are_cut_on_resume(tmp_path):
    """A job that died after its last checkpoint left rows the resumed job redoes: they are cut first."""
    run_dir = tmp_path / "run"
    fused.run(make_plan(config("ha2c", 10)), run_dir)
    ckpt = load_checkpoint(run_dir)
    # the job went on past its checkpoint and was killed: rows of iterations 11 .. 15 are in run.h5
    fused.run(make_plan(config("ha2c", 15, checkpoint_every=10 ** 6)), run_dir, resume=True)
    os.replace(run_dir / "checkpoints" / "previous.pt", run_dir / "checkpoints" / "latest.pt")
    assert load_checkpoint(run_dir)["version"] == ckpt["version"] == 10
    summary = fused.run(make_plan(config("ha2c", 20)), run_dir, resume=True).summary
    assert summary["version"] == 20
    updates = read_table(run_dir / "run.h5", "updates")
    assert list(updates["version"]) == list(range(1, 21))
    assert len(read_table(run_dir / "run.h5", "episodes")["return"]) == summary["episodes"]


CARTPOLE_HA2C = Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / "cartpole_ha2c.yaml"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_stops_with_a_checkpoint_and_hpcrl_run_resume_goes_on(tmp_path, capfd):
    run_dir = tmp_path / "runs" / "cartpole-ha2c"
    tiny = ["-o", "env.num_envs=64", "-o", "learners.device=cpu", "-o", "stop.target_return=null",
            "-o", "io.log_seconds=0.2", "-o", f"io.run_dir={run_dir}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", str(CARTPOLE_HA2C), *tiny], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:  # the loop runs once a progress line with steps shows
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("[") and " steps 0 " not in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    out = "".join(lines) + out
    assert proc.returncode == 3, out + err
    assert f"stopped by SIGINT with a checkpoint; go on with `hpcrl run --resume {run_dir}`" in err
    assert "stopped because                signal SIGINT" in out
    saved = load_checkpoint(run_dir)
    assert saved["version"] > 0 and saved["env_steps"] == saved["version"] * 64 * 8
    before = read_table(run_dir / "run.h5", "updates")
    assert list(before["version"]) == list(range(1, saved["version"] + 1))

    budget = (saved["version"] + 5) * 64 * 8
    capfd.readouterr()  # the resume in this process (one torch thread, as OMP_NUM_THREADS=1 gave the first)
    assert cli_main(["run", "--resume", str(run_dir), "-o", f"stop.total_env_steps={budget}"]) == 0
    assert f"stop.total_env_steps={budget} reached" in capfd.readouterr().out
    after = read_table(run_dir / "run.h5", "updates")
    assert list(after["version"]) == list(range(1, saved["version"] + 6))
    episodes = read_table(run_dir / "run.h5", "episodes")
    assert np.all(np.diff(episodes["env_steps"]) >= 0) and episodes["env_steps"].max() <= budget
