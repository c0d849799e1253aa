"""The Parsl workflows on --site local (no cluster): a two-value sweep with its dependent HDF5 summary."""
import csv
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.mpi
@pytest.mark.slow
def test_sweep_runs_each_value_as_an_app_then_summarises_from_hdf5(tmp_path):
    out = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, str(ROOT / "workflows" / "sweep.py"), "--site", "local", "--out", str(out),
                           "--d", "0.96", "1.0", "--parallel-runs", "2",
                           "-o", "stop.total_env_steps=512", "-o", "actors.count=1"],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [r["d"] for r in rows] == ["0.96", "1.0"]
    for row in rows:
        run = Path(row["run_dir"])
        assert run == out / f"d{row['d']}"
        assert f"d: {row['d']}" in (run / "config.yaml").read_text()  # each app ran its own value
        with h5py.File(run / "run.h5", "r", locking=False) as f:
            returns = f["episodes/return"][:]
        assert int(row["episodes"]) == len(returns) > 0
        assert float(row["final_return"]) == pytest.approx(np.mean(returns[-20:]), rel=1e-5)
        assert int(row["env_steps"]) >= 512


@pytest.mark.slow
def test_workflows_refuse_unknown_sites():
    for name in ("train.py", "sweep.py"):
        proc = subprocess.run([sys.executable, str(ROOT / "workflows" / name), "--site", "summit"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "invalid choice: 'summit'" in proc.stderr
