"""What the allocation is billed (issue 26 item 3): each start inside a batch job is an ``allocations`` row,
which a resume keeps, and `hpcrl analyze` prices the jobs' node-seconds from the scheduler's accounting.

sacct itself is read in tests/test_local_cluster.py (a real job on two nodes); here the accounting comes
from ``accounting.json``, the file analyze keeps of the jobs sacct reported, so a run copied away from the
cluster is priced the same.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from hpcrl.config import build_config
from hpcrl.io import read_table
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.record.allocation import batch_job
from hpcrl.runtime.runners import serial

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from hpcrl_analysis import billing, cli, metrics  # noqa: E402
from hpcrl_analysis.h5read import load_run  # noqa: E402

TINY = {"name": "tiny", "env": {"id": "CartPole-v1", "num_envs": 2},
        "actors": {"count": 2, "fragment_length": 16}, "learners": {"groups": 1, "ranks_per_group": 1},
        "algo": {"name": "ppo", "train_batch_size": 64, "minibatch_size": 32, "num_sgd_iter": 1},
        "io": {"flush_seconds": 0.5, "checkpoint_every": 2, "tensorboard": False}, "launch": {"runner": "serial"}}
SCHEDULER_VARS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_CLUSTER_NAME", "SLURM_JOB_NUM_NODES", "SLURM_NNODES",
                  "PBS_JOBID", "PBS_NODEFILE", "HPCRL_SITE", "HPCRL_CHARGE_UNIT", "HPCRL_CHARGE_PER_NODE_HOUR")


def test_the_batch_job_comes_from_the_schedulers_variables(tmp_path):
    assert batch_job({"PATH": "/bin"}) is None
    slurm = batch_job({"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "0", "SLURM_CLUSTER_NAME": "perlmutter",
                       "SLURM_JOB_NUM_NODES": "4", "HPCRL_SITE": "perlmutter-gpu", "HPCRL_CHARGE_UNIT": "GPU node-hours",
                       "HPCRL_CHARGE_PER_NODE_HOUR": "1.0"})
    assert slurm == {"scheduler": 0, "job_id": b"812", "step_id": b"0", "cluster": b"perlmutter", "nodes": 4,
                     "site": b"perlmutter-gpu", "charge_unit": b"GPU node-hours", "charge_per_node_hour": 1.0}
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x3001\nx3001\nx3002\n")  # one line per rank slot
    pbs = batch_job({"PBS_JOBID": "4711.polaris-pbs-01", "PBS_NODEFILE": str(nodefile)})
    assert pbs["scheduler"] == 1 and pbs["job_id"] == b"4711.polaris-pbs-01" and pbs["nodes"] == 2
    assert pbs["charge_per_node_hour"] != pbs["charge_per_node_hour"]  # NaN: not from hpcrl submit


def run_in_job(monkeypatch, run_dir: Path, job_id: str, steps: int, resume: bool = False) -> dict:
    for name in SCHEDULER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c1")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv("HPCRL_SITE", "perlmutter-gpu")
    monkeypatch.setenv("HPCRL_CHARGE_UNIT", "GPU node-hours")
    monkeypatch.setenv("HPCRL_CHARGE_PER_NODE_HOUR", "0.5")
    cfg = build_config({**TINY, "stop": {"total_env_steps": steps, "target_return": None}})
    return serial.run(make_plan(cfg), run_dir, resume=resume).summary


def sacct_rows(job: str, runs: list[tuple[int, int, str]], steps: list[tuple[str, int, int]]) -> list[dict]:
    """What billing keeps of sacct's answer: the allocation's runs (nodes, seconds, state) and its steps."""
    return ([{"JobID": job, "JobIDRaw": job, "NNodes": str(n), "ElapsedRaw": str(s), "State": state} for n, s, state in runs]
            + [{"JobID": f"{job}.{step}", "JobIDRaw": f"{job}.{step}", "NNodes": str(n), "ElapsedRaw": str(s),
                "State": "COMPLETED"} for step, n, s in steps])


@pytest.mark.timeout(120)
def test_each_start_in_a_job_is_kept_by_resume_and_billed_by_node_seconds(monkeypatch, tmp_path):
    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    first = run_in_job(monkeypatch, run_dir, "101", 400)
    run_in_job(monkeypatch, run_dir, "102", first["env_steps"] + 400, resume=True)
    rows = read_table(run_dir / "run.h5", "allocations")
    # the first job's row survives the resume's cut back to its checkpoint: that job was billed all the same
    assert [j.decode() for j in rows["job_id"]] == ["101", "102"]
    assert list(rows["nodes"]) == [2, 2] and list(rows["charge_per_node_hour"]) == [0.5, 0.5]
    assert rows["time"][1] > rows["time"][0] >= 0

    run = load_run(run_dir)
    assert [j["job_id"] for j in billing.recorded_jobs(run)] == ["101", "102"]
    assert billing.billed(run, sacct=None)["note"].count("sacct is not on PATH") == 2

    # job 101 was requeued once (two runs of the allocation, each billed) and ran one step per run
    (run_dir / billing.CACHE).write_text(json.dumps({
        "c1/101": sacct_rows("101", [(2, 30, "REQUEUED"), (2, 45, "COMPLETED")], [("0", 2, 29), ("0", 2, 44)]),
        "c1/102": sacct_rows("102", [(3, 20, "COMPLETED")], [("batch", 1, 20), ("0", 3, 19)])}))
    run = load_run(run_dir)
    bill = billing.billed(run, sacct=None)
    assert bill["note"] == "" and bill["node_seconds"] == 2 * 30 + 2 * 45 + 3 * 20
    assert bill["charge"] == pytest.approx(210 / 3600 * 0.5) and bill["unit"] == "GPU node-hours"
    assert [j["runs"] for j in bill["jobs"]] == [2, 1] and [len(j["steps"]) for j in bill["jobs"]] == [2, 2]

    summary = metrics.summary(run, metrics.load_prices(None))
    assert summary["billed node-seconds (sacct)"] == 210.0
    assert summary["billed charge"] == f"{210 / 3600 * 0.5:.4g} GPU node-hours"
    out = cli.analyze([run_dir], tmp_path / "analysis", figures=False)
    text = out.markdown.read_text()
    assert "## Billed by the scheduler" in text
    assert "| 101 | COMPLETED | 2 | 2 | 75 | 150 | 101.0 (2 x 29 s), 101.0 (2 x 44 s) |" in text, text


@pytest.mark.timeout(120)
def test_a_run_outside_a_batch_job_has_no_bill(monkeypatch, tmp_path):
    for name in SCHEDULER_VARS:
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(1)
    cfg = build_config({**TINY, "stop": {"total_env_steps": 200, "target_return": None}})
    serial.run(make_plan(cfg), tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert billing.billed(run)["note"] == "not run in a batch job"
    summary = metrics.summary(run, metrics.load_prices(None))
    assert summary["billed node-seconds (sacct)"] == "-" and summary["billed charge"] == "not run in a batch job"
    assert "Billed by the scheduler" not in cli.analyze([tmp_path / "run"], tmp_path / "a", figures=False).markdown.read_text()
