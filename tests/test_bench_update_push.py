"""`hpcrl bench update-push` on a tiny budget: both modes run, and the update mode's rows are updates."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_update_push_bench_runs_both_modes_and_counts_rank0s_work(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hpcrl", "bench", "update-push", "--steps", "1024", "--runner", "serial",
                          "--target", "20", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = {m.group(1): m.groups() for m in re.finditer(
        r"^(gradient|update)\s+0\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", res.stdout, re.M)}
    assert set(rows) == {"gradient", "update"}, res.stdout
    pushes_per_s, inner = 2, 3  # columns after mode and env steps/s
    assert float(rows["gradient"][inner]) == 0.0 and float(rows["update"][inner]) == 20.0  # the default job: 20 a batch
    assert float(rows["update"][pushes_per_s]) < float(rows["gradient"][pushes_per_s])  # one push per batch, not 20
    assert "update / gradient: env steps/s" in res.stdout
