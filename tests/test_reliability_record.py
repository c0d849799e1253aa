"""--resume over a record file cut short or damaged, and hpcrl analyze of one (issue 41 item 7).

A resume says in one line which file is wrong and how (cut short: N of M bytes; damaged: the table and HDF5's
reason) with the way on; an actor's file moved aside as the line says lets the next resume go on from the
checkpoint with every key once. hpcrl analyze does not call a run complete whose trajectory file was cut.
The record is a real serial run's; the damage is made the way a copy cut short or a changed byte makes it.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcrl.bench.soak import check_record
from hpcrl.cli import main as cli_main

sys.path.insert(0, str(Path(__file__).parent))
from test_damaged_record import damage_header  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def config(run_dir: Path, runner: str) -> dict:
    return {"name": "rel", "env": {"id": "CartPole-v1", "num_envs": 2}, "actors": {"count": 2, "fragment_length": 16},
            "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 64, "num_sgd_iter": 1},
            "stop": {"total_env_steps": 2000}, "io": {"run_dir": str(run_dir), "checkpoint_every": 5},
            "launch": {"runner": runner, "timeout_seconds": 120}}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("record")
    path = root / "c.yaml"
    path.write_text(yaml.safe_dump(config(root / "run", "serial")))
    assert cli_main(["run", str(path)]) == 0
    return root / "run"


@pytest.fixture
def run_dir(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def resume(run_dir: Path, capsys, *more: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli_main(["run", "--resume", str(run_dir), *more])
    return rc, capsys.readouterr().err.strip()


def cut(path: Path) -> int:
    """Cut ``path`` to half its bytes, as a copy stopped half way does; returns the size it had."""
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)
    return size


def test_a_cut_trajectory_file_is_one_line_with_the_way_on_and_the_way_on_works(run_dir, capsys):
    traj = run_dir / "traj" / "actor-00000.h5"
    size = cut(traj)
    rc, err = resume(run_dir, capsys, "-o", "stop.total_env_steps=3000")
    last = err.splitlines()[-1]
    assert rc == 2 and last.startswith("hpcrl run: error: --resume: "), err
    assert f"{traj} is cut short ({size // 2:,} of {size:,} bytes)" in last, last
    assert f"mv {traj} {traj}.damaged && hpcrl run --resume {run_dir}" in last, last
    assert "Traceback" not in err
    shutil.move(traj, f"{traj}.damaged")  # the way on, as the line says
    rc, err = resume(run_dir, capsys, "-o", "stop.total_env_steps=3000")
    assert rc == 0, err
    assert f"{traj} is missing" in err and "steps of actor 0 are lost" in err  # said, not hidden
    assert check_record(run_dir) == []  # every key once, counters that match the files


def test_analyze_does_not_call_a_run_with_a_cut_trajectory_file_complete(run_dir, capsys):
    from hpcrl.commands.analyze import load_analysis

    ha = load_analysis()
    whole = ha.h5read.load_run(run_dir)
    assert whole.notes == [], whole.notes
    size = cut(run_dir / "traj" / "actor-00001.h5")
    notes = ha.h5read.load_run(run_dir).notes
    assert notes == [f"trajectory file traj/actor-00001.h5 is cut short ({size // 2:,} of {size:,} bytes): "
                     "its steps are not all there"], notes
    capsys.readouterr()
    assert cli_main(["analyze", str(run_dir)]) == 0
    summary = (run_dir / "analysis" / "summary.md").read_text()
    status = next(line for line in summary.splitlines() if line.startswith("| status"))
    assert "complete tables" not in status and "traj/actor-00001.h5 is cut short" in status, status


@pytest.mark.parametrize("damage", ["cut", "checksum"])
def test_a_damaged_run_h5_is_one_line_naming_what_is_wrong(run_dir, capsys, damage):
    h5 = run_dir / "run.h5"
    if damage == "cut":
        size = cut(h5)
    else:
        damage_header(h5, "updates/version")
    rc, err = resume(run_dir, capsys)
    last = err.splitlines()[-1]
    assert rc == 2 and last.startswith("hpcrl run: error: --resume: ") and "Traceback" not in err, err
    if damage == "cut":
        assert f"{h5} is cut short ({size // 2:,} of {size:,} bytes)" in last and "copy it again" in last, last
    else:
        assert f"{h5} is damaged (table 'updates': " in last and "checksum" in last, last
    assert f"hpcrl eval {run_dir}" in last, last


@pytest.mark.mpi
def test_under_mpi_a_damaged_trajectory_file_ends_the_resume_with_its_one_line(run_dir, tmp_path):
    path = tmp_path / "mpi.yaml"
    data = config(run_dir, "mpi")
    data["name"] = "rel"
    path.write_text(yaml.safe_dump(data))
    (run_dir / "config.yaml").write_text(yaml.safe_dump(data))  # the same run, resumed by the mpi runner
    traj = run_dir / "traj" / "actor-00001.h5"
    damage_header(traj, "obs")  # not cut: found only when rank 0 opens it to cut it back
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", "--resume", str(run_dir)], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert last.startswith("hpcrl run: the MPI job failed") and f"{traj} is damaged" in last, last
    assert f"mv {traj} {traj}.damaged && hpcrl run --resume {run_dir}" in last and "goes on from" not in last, last


def test_a_run_h5_behind_its_checkpoint_is_refused_with_the_earlier_checkpoint_as_the_way_on(run_dir, capsys):
    h5, older = run_dir / "run.h5", run_dir.parent / "run.h5.older"
    shutil.copyfile(h5, older)  # the record as the first job left it (its final checkpoint counted these rows)
    rc, err = resume(run_dir, capsys, "-o", "stop.total_env_steps=2300")  # one more checkpoint, further on
    assert rc == 0, err
    shutil.copyfile(older, h5)  # the newer rows lost: an older copy put back
    rc, err = resume(run_dir, capsys, "-o", "stop.total_env_steps=2600")
    last = err.splitlines()[-1]
    assert rc == 2 and last.startswith("hpcrl run: error: --resume: "), err
    assert f"{h5} table '" in last and "fewer than the" in last and "would leave a gap" in last, last
    latest = run_dir / "checkpoints" / "latest.pt"
    assert f"mv {latest} {latest}.ahead && hpcrl run --resume {run_dir}" in last, last
    shutil.move(latest, f"{latest}.ahead")  # the way on: previous.pt, the first job's last checkpoint
    rc, err = resume(run_dir, capsys, "-o", "stop.total_env_steps=2600")
    assert rc == 0, err
    assert check_record(run_dir) == []  # no gap: every key once
