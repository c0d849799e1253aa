"""The Stellaris Parsl workflows on --site local with a tiny budget: the grid (policies x algorithms x
repeats, Figs. 6/7/11) and the sensitivity sweep (d, v, rho, Fig. 13), each with its dependent summary."""
import csv
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest


ROOT = Path(__file__).resolve().parent.parent
TINY = ["actors.count=1", "learners.groups=1", "learners.min_active=1", "actors.fragment_length=64",
        "algo.train_batch_size=64", "algo.minibatch_size=64", "algo.num_sgd_iter=1", "stop.total_env_steps=256",
        "eval.episodes=0"]  # the shipped configs evaluate every round (test_stellaris_configs); not needed here


def run_workflow(name, out, *args):
    cmd = [sys.executable, str(ROOT / "workflows" / name), "--site", "local", "--out", str(out), "--repeats", "1",
           "--parallel-runs", "2", *args, *[a for o in TINY for a in ("-o", o)]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=out.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


@pytest.mark.mpi
@pytest.mark.slow
def test_grid_runs_every_setting_then_summarises_curves_and_cost(tmp_path):
    out = tmp_path / "grid"
    run_workflow("stellaris_grid.py", out, "--workload", "hopper", "--algos", "ppo", "--policies", "stellaris", "ssp")
    summary = rows(out / "summary.csv")
    assert [(r["algo"], r["policy"]) for r in summary] == [("ppo", "stellaris"), ("ppo", "ssp")]
    for r, run in zip(summary, (out / "ppo-stellaris-seed0", out / "ppo-ssp-seed0")):
        assert f"policy: {r['policy']}" in (run / "config.yaml").read_text()  # each app ran its own setting
        with h5py.File(run / "run.h5", "r", locking=False) as f:
            returns = f["episodes/return"][:]
        assert float(r["final_return_mean"]) == pytest.approx(np.mean(returns[-20:]), rel=1e-5)
        assert float(r["cost_mean"]) > 0
        info = rows(out / "logs" / "seed0" / f"{r['policy']}~Hopper-v5~ppo~info.csv")
        assert float(info[-1]["cost"]) == pytest.approx(float(r["cost_mean"]), rel=1e-4)
    assert {c["policy"] for c in rows(out / "curves.csv")} == {"stellaris", "ssp"}
    assert (out / "curves-ppo.png").stat().st_size > 0 and (out / "cost.png").stat().st_size > 0


@pytest.mark.mpi
@pytest.mark.slow
def test_sensitivity_sweeps_one_parameter_at_a_time(tmp_path):
    out = tmp_path / "sens"
    run_workflow("stellaris_sensitivity.py", out, "--d", "0.9", "--v", "2", "--rho")
    summary = rows(out / "sensitivity.csv")
    assert [(r["parameter"], float(r["value"])) for r in summary] == [("d", 0.9), ("v", 2.0)]
    assert "d: 0.9" in (out / "d0.9-seed0" / "config.yaml").read_text()
    assert "v: 2.0" in (out / "v2.0-seed0" / "config.yaml").read_text()
    assert all(float(r["cost_mean"]) > 0 for r in summary)
    assert (out / "sensitivity.png").stat().st_size > 0


def test_stellaris_workflows_refuse_bad_arguments(tmp_path):
    for name, args in (("stellaris_grid.py", ["--policies", "fastest"]), ("stellaris_sensitivity.py", ["--site", "x"])):
        proc = subprocess.run([sys.executable, str(ROOT / "workflows" / name), "--site", "local", *args],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert proc.returncode == 2 and "invalid choice" in proc.stderr
