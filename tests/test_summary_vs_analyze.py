"""After a resume the run summary and `hpcrl analyze` give one wall time and one env step count (issue 27 item 5).

Both count the jobs' running time, not the time between a job's end and the resume (analyze: each job from
its start, run.h5's start_unix or a resumed_unix, to the last row it wrote; the summary: the wall seconds
carried from checkpoint to checkpoint), and both count every env step the actors sampled (analyze: the
``actors`` rows, or the fused loop's rounds; before, the last episode's env_steps, which misses the steps
sampled after it).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from hpcrl.config import build_config
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import fused, serial

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from hpcrl_analysis import metrics  # noqa: E402
from hpcrl_analysis.h5read import load_run  # noqa: E402

GAP = 4.0  # seconds between a job's end and its resume: they are not the run's wall time

SERIAL = {"name": "tiny", "env": {"id": "CartPole-v1", "num_envs": 2},
          "actors": {"count": 2, "fragment_length": 16}, "learners": {"groups": 1, "ranks_per_group": 1},
          "algo": {"name": "ppo", "train_batch_size": 64, "minibatch_size": 32, "num_sgd_iter": 1},
          "io": {"flush_seconds": 0.5, "checkpoint_every": 10, "tensorboard": False},
          "launch": {"runner": "serial"}}
FUSED = {"name": "t", "env": {"id": "hpcrl/CartPole-v1", "num_envs": 32}, "algo": {"name": "ha2c", "stats_every": 5},
         "actors": {"count": 1, "fragment_length": 8}, "launch": {"runner": "serial"}, "io": {"tensorboard": False}}


def config(base: dict, steps: int):
    return build_config({**base, "stop": {"total_env_steps": steps, "target_return": None}})


def analyzed(run_dir: Path) -> dict:
    run = load_run(run_dir)
    return {"wall": metrics.wall_seconds(run), "env_steps": metrics.env_steps(run),
            "summary": metrics.summary(run, metrics.load_prices(None))}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("runner, base, steps", [(serial, SERIAL, (600, 1400)), (fused, FUSED, (32 * 8 * 12, 32 * 8 * 30))])
def test_summary_and_analyze_agree_after_a_resume(tmp_path, runner, base, steps):
    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    first = runner.run(make_plan(config(base, steps[0])), run_dir).summary
    time.sleep(GAP)
    # the second budget counts from where the first job stopped: a loaded machine overshoots the first (1,856 for 600)
    target = first["env_steps"] + steps[1] - steps[0]
    second = runner.run(make_plan(config(base, target)), run_dir, resume=True).summary
    assert second["env_steps"] >= target > first["env_steps"]
    seen = analyzed(run_dir)
    assert seen["env_steps"] == second["env_steps"]
    assert seen["summary"]["env steps"] == second["env_steps"]
    # the jobs' own time: the summary's clock starts just after run.h5 is opened, analyze's at the opening;
    # the GAP between the jobs is in neither
    # (under load the opening itself took 1.2 s once; 2 s still tells the jobs' time from one with the 4 s GAP)
    assert seen["wall"] == pytest.approx(second["elapsed"], abs=2.0), (seen["wall"], second["elapsed"], first["elapsed"])
    assert seen["summary"]["wall-clock (s)"] == seen["wall"]
