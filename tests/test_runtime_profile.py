"""The learner cycle profile (learner_cycles) and the parameter rank's load (parameter_load).

A serial run must record one cycle row per gradient the parameter rank received, with phases
that add up to the cycle, and load rows whose absorption rate follows from their own columns;
the MPI run (marked mpi) must write the same rows from its ranks.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml

from hpcrl.config import build_config
from hpcrl.io import read_attrs, read_table
from hpcrl.runtime.cycle_profile import LEARNER_PHASES, PARAMETER_PHASES, PhaseClock
from hpcrl.runtime.serial import run_serial

TINY = {
    "name": "tiny",
    "env": {"id": "CartPole-v1", "num_envs": 2},
    "actors": {"count": 2, "fragment_length": 16},
    "learners": {"groups": 1, "ranks_per_group": 1},
    "algo": {"name": "ppo", "train_batch_size": 64, "minibatch_size": 32, "num_sgd_iter": 2},
    "stop": {"total_env_steps": 1200},
    "io": {"flush_seconds": 0.5, "checkpoint_every": 1000},
    "launch": {"runner": "serial", "timeout_seconds": 120},
}


def config(run_dir, **sections) -> dict:
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in TINY.items()}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    data["io"]["run_dir"] = str(run_dir)
    return data


def test_phase_clock_charges_every_second_to_one_phase():
    clock = PhaseClock(("a", "b"))
    clock.lap("a")
    sum(range(100_000))
    clock.lap("b")
    clock.move(1e9, "b", "a")  # never more than b holds
    elapsed, sec = clock.take()
    assert sec["b"] == 0.0 and sec["a"] == pytest.approx(elapsed)
    assert clock.take()[0] == 0.0


def check_profile(h5) -> None:
    grads, cycles = read_table(h5, "gradients"), read_table(h5, "learner_cycles")
    got = {(int(g), int(s)) for g, s in zip(cycles["group"], cycles["seq"])}
    sent = {(int(g), int(s)) for g, s in zip(grads["group"], grads["seq"])}
    assert len(got) == len(cycles["seq"]) and sent <= got  # every gradient received has its cycle, once
    phases = sum(cycles[f"{p}_seconds"] for p in LEARNER_PHASES)
    assert np.allclose(phases, cycles["cycle_seconds"], rtol=1e-3, atol=1e-5)
    assert np.all(cycles["gradient_seconds"] > 0) and np.all(cycles["cycle_seconds"] >= cycles["gradient_seconds"])
    assert np.all(np.diff(cycles["time"][cycles["group"] == 0]) >= 0)
    load = read_table(h5, "parameter_load")
    assert len(load["time"]) >= 1 and load["gradients"].sum() <= len(grads["seq"])
    busy = sum(load[f"{p}_seconds"] for p in PARAMETER_PHASES)
    assert np.all(busy <= load["interval_seconds"] * 1.001 + 1e-4)
    work = load["receive_seconds"] + load["admit_seconds"] + load["apply_seconds"] + load["publish_seconds"]
    some = load["gradients"] > 0
    assert some.any()
    assert np.allclose(load["absorption_rate"][some], load["gradients"][some] / work[some], rtol=1e-3)
    assert read_attrs(h5)["num_params"] > 0


def test_serial_run_records_each_gradients_cycle_and_the_parameter_load(tmp_path):
    run_dir = tmp_path / "run"
    assert run_serial(build_config(config(run_dir)), run_dir, progress="plain").startswith("stop.total_env_steps")
    check_profile(run_dir / "run.h5")


@pytest.mark.mpi
def test_mpi_run_records_the_same_profile(tmp_path):
    run_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config(run_dir, launch={"runner": "mpi"})))
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(path)], capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_profile(run_dir / "run.h5")
