"""hpcrl sweep --site local-cluster: a sweep as a Slurm job array on the local cluster; a task warned of its
walltime (USR1 to its batch shell, as ``--signal=B:USR1@W`` sends it) checkpoints, requeues itself and resumes;
every run ends done once. And an array larger than the site allows is one line, exit 2, nothing submitted.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_fixture import slurm, wait_for  # noqa: F401 - slurm: the session fixture
from test_sweep import FAST, write_spec

from hpcrl.cli import main as cli_main
from hpcrl.io import read_table

STEPS = 2000  # each run's budget; the warning reaches sync-s0 at its first checkpoint, a few hundred steps in


def _state(out: Path) -> dict:
    try:
        return json.loads((out / "sweep.json").read_text())["runs"]
    except (OSError, ValueError):
        return {}


def _show(job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=20).stdout


def _diagnosis(out: Path, job: str) -> str:
    """What a failure needs to be read: the sweep's state, task 0's Slurm record and the array's logs."""
    logs = "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted((out / "logs").glob("*")))
    return f"sweep.json runs: {_state(out)}\n--- scontrol show job {job}_0\n{_show(f'{job}_0')}{logs}"


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweep_as_a_job_array_requeues_a_warned_task_and_finishes_every_run_once(slurm, tmp_path):  # noqa: F811
    spec = write_spec(tmp_path / "spec.yaml", parallel=2, arms={"sync": ["aggregation.policy=sync"]},
                      overrides=FAST + [f"stop.total_env_steps={STEPS}", "io.checkpoint_every=1",
                                        "io.checkpoint_min_seconds=0"], seeds=2)
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "hpcrl", "sweep", str(spec), "--out", str(out), "--site",
                           "local-cluster", "--time", "00:10:00"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().splitlines()[-1]
    try:
        wait_for(lambda: (out / "runs" / "sync-s0" / "checkpoints" / "latest.pt").exists(), 240,
                 "run sync-s0's first checkpoint", poll=0.1)
        # the walltime warning, to task 0's batch shell: the run checkpoints and stops, the task requeues itself
        subprocess.run(["scancel", "--batch", "--signal=USR1", f"{job}_0"], check=True, timeout=20)
        wait_for(lambda: _state(out).get("sync-s0", {}).get("status") == "stopped", 120, "sync-s0 to stop")
        # Slurm holds a requeued job for about 2 minutes (BeginTime): make it eligible now (asked again until it
        # runs: an update while the requeue is still under way does not hold). Not within the second of the
        # requeue: slurmd refuses a launch credential made in the same second as the one it revoked for the
        # killed instance ("Job credential revoked"), and the task would end with exit 1 instead of resuming.
        wait_for(lambda: "JobState=PENDING" in _show(f"{job}_0"), 60, "task 0 to be requeued")
        time.sleep(2.0)
        wait_for(lambda: subprocess.run(["scontrol", "update", f"JobId={job}_0", "StartTime=now"], timeout=20) and
                 "JobState=PENDING" not in _show(f"{job}_0"), 60, "task 0 to start again", poll=1.0)
        wait_for(lambda: all(e["status"] == "done" for e in _state(out).values()) and len(_state(out)) == 2, 300,
                 "both runs done")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_diagnosis(out, job)}") from None
    finally:
        subprocess.run(["scancel", job], timeout=20)
    state = _state(out)
    assert state["sync-s0"]["attempts"] == 2 and state["sync-s1"]["attempts"] == 1, state
    assert "--resume" in (out / "logs" / "sync-s0.log").read_text()
    for name in state:
        frags = read_table(out / "runs" / name / "run.h5", "actors", ["fragment", "steps"])
        assert list(frags["fragment"]) == list(range(len(frags["fragment"])))  # nothing sampled twice or lost
        assert frags["steps"].sum() >= STEPS


def test_an_array_larger_than_the_site_allows_is_one_line_and_nothing_is_submitted(tmp_path, capsys, monkeypatch):
    from hpcrl.sweep import array

    monkeypatch.setattr(array, "max_array_size", lambda site: (3, "scontrol show config"))
    spec = write_spec(tmp_path / "spec.yaml", seeds=2)  # 2 arms x 2 seeds
    out = tmp_path / "sweep"
    assert cli_main(["sweep", str(spec), "--out", str(out), "--site", "local-cluster"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "4 runs, more than the 3 tasks of local-cluster's largest job array" in err
    assert not out.exists()
