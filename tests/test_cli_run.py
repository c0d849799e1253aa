"""`hpcrl run` argument handling: every mistake is one line, exit code 2, and nothing is written."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from hpcrl.cli import main as cli_main
from hpcrl.commands.run import create_run_dir
from hpcrl.config import load_config
from hpcrl.runtime.plan import make_plan


def run_cli(args, capsys):
    rc = cli_main(["run", *args])
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize("overrides, field", [
    (["env.id=CartPol-v1"], "env.id"),
    (["env.idd=CartPole-v1"], "env.idd"),
    (["algo.lr=0"], "algo.lr"),
    (["algo.lr=-1"], "algo.lr"),
    (["aggregation.d=1.5"], "aggregation.d"),
    (["aggregation.policy=fastest"], "aggregation.policy"),
    (["learners.min_active=2"], "min_active"),
    (["algo.minibatch_size=100000"], "algo.minibatch_size"),
    (["debug.raise_on_rank=9"], "debug.raise_on_rank"),
    (["launch.mpiexec=/nonexistent/mpiexec"], "pip install mpich"),
    (["actors.count=0"], "actors.count"),
    (["env.id=hpcrl/CartPole-v1", "env.kwargs={device: cpu}"], "env.kwargs.device"),  # batched: env.num_envs on the CPU
    (["env.rescale_actions=true"], "env.rescale_actions"),  # CartPole's actions are Discrete
    (["actors.count=true"], "actors.count"),
    (["algo.lr=.inf"], "algo.lr: Input should be a finite number"),
    (["stop.max_wall_seconds=.nan"], "stop.max_wall_seconds"),
    (["io.run_dir=runs/{"], "only the placeholders {name} and {time}"),
    (["actors.count=1000"], "launch.ranks_per_core"),
    (["actors.keep_sampler_seconds=5"], "does nothing with actors.elastic=park"),
    (["launch.watchdog_seconds=60"], "launch.watchdog_warn_seconds=300 is not below launch.watchdog_seconds=60"),
    # a typo in -o blames the -o (not the config file) and lists the section's keys
    (["actors.cont=3"], "-o actors.cont=3: unknown key 'actors.cont'; allowed keys in actors: count, fragment_length"),
] + ([] if torch.cuda.is_available() else [(["learners.device=cuda"], "torch sees no CUDA device")]))
def test_config_mistakes_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, overrides, field):
    monkeypatch.chdir(tmp_path)
    run_dir = [] if any(o.startswith("io.run_dir") for o in overrides) else [f"io.run_dir={tmp_path / 'runs' / 'x'}"]
    args = [a for o in overrides + run_dir for a in ("-o", o)]
    rc, err = run_cli(args, capsys)
    assert rc == 2
    assert len(err.splitlines()) == 1 and field in err, err
    assert list(tmp_path.iterdir()) == []


def test_too_few_ranks_and_bad_resume(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, err = run_cli(["--ranks", "2"], capsys)
    assert rc == 2 and "--ranks 2" in err and "at least 1 actor = 3" in err
    rc, err = run_cli(["--resume", str(tmp_path / "nope")], capsys)
    assert rc == 2 and "not a run directory" in err
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text(load_config().to_yaml())
    rc, err = run_cli(["--resume", str(tmp_path / "r")], capsys)
    assert rc == 2 and "no checkpoint" in err
    rc, err = run_cli([str(tmp_path / "missing.yaml")], capsys)
    assert rc == 2 and "not found" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_ranks_sets_the_actor_count_and_run_dirs_never_collide(tmp_path):
    from hpcrl.commands.run import add_arguments, resolve_plan
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    plan, _ = resolve_plan(p.parse_args(["--ranks", "6"]))
    assert plan.sections.actors.count == plan.actors == 4 and plan.num_ranks == 6
    plan = make_plan(load_config(overrides=[f"io.run_dir={tmp_path}/{{name}}"]))
    a, b = create_run_dir(plan), create_run_dir(plan)
    assert a != b and a.name == "cartpole" and b.name == "cartpole-2"
    assert yaml.safe_load((a / "config.yaml").read_text())["env"]["id"] == "CartPole-v1"


def test_real_process_exit_code(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", "-o", "aggregation.d=2"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "aggregation.d" in res.stderr
    assert list(Path(tmp_path).iterdir()) == []


@pytest.mark.mpi
@pytest.mark.slow
def test_inside_mpi_runs_the_roles_under_an_outside_launcher(tmp_path):
    """What srun / PBS mpiexec do: start `hpcrl run` on every rank; rank 0 makes the run directory."""
    # actors.count=7 is fitted to the job: 4 ranks = 1 parameter + 1 learner + 2 actors
    cfg = {"env": {"num_envs": 2}, "actors": {"count": 7, "fragment_length": 16, "weight_sync": "aaps"},
           "algo": {"train_batch_size": 64, "minibatch_size": 32, "num_sgd_iter": 1},
           "stop": {"total_env_steps": 600, "target_return": None}, "io": {"run_dir": str(tmp_path / "runs" / "{name}-{time}")}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    mpiexec = Path(sys.executable).parent / "mpiexec"
    proc = subprocess.Popen([str(mpiexec), "-n", "4", sys.executable, "-m", "hpcrl", "run", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            start_new_session=True, env=dict(os.environ, UCX_LOG_LEVEL="error"))
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, out[-3000:]
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, runs  # one directory for the whole job, not one per rank
    assert (runs[0] / "run.h5").is_file() and (runs[0] / "traj" / "actor-00001.h5").is_file()
    assert "hpcrl run summary" in out
    assert sorted(p.name for p in (runs[0] / "traj").iterdir()) == ["actor-00000.h5", "actor-00001.h5"]


def test_inside_mpi_in_a_job_too_small_is_a_one_line_error(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", "--inside-mpi"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, UCX_LOG_LEVEL="error"))
    assert res.returncode == 2 and "MPI job size 1: too few" in res.stderr, res.stderr
    assert list(Path(tmp_path).iterdir()) == []


CARTPOLE_HA2C = Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / "cartpole_ha2c.yaml"


@pytest.mark.slow
def test_single_process_algo_runs_in_this_process_and_records_its_episodes(tmp_path, capsys):
    """algo.name=ha2c on a batched env, one actor, serial runner: the fused loop, no mpiexec; the summary
    printed agrees with run.h5; --ranks is refused (--resume: tests/test_fused_resume.py)."""
    from hpcrl.io import read_table

    tiny = ["-o", "env.num_envs=16", "-o", "stop.total_env_steps=4000", "-o", "stop.target_return=null",
            "-o", "stop.return_window=50", "-o", f"io.run_dir={tmp_path / 'runs' / '{name}'}"]
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(CARTPOLE_HA2C), *tiny], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = tmp_path / "runs" / "cartpole-ha2c"
    assert f"in this process (launch.runner=serial, fused loop), run directory {run_dir}" in res.stdout
    summary = dict(line.strip().split("  ", 1) for line in res.stdout.split("hpcrl run summary\n")[1].splitlines())
    summary = {k.strip(): v.strip() for k, v in summary.items()}
    assert summary["stopped because"] == "stop.total_env_steps=4000 reached"
    assert int(summary["environment steps"]) == 16 * 8 * 32  # whole iterations of 16 x 8 steps
    assert summary["record"] == str(run_dir / "run.h5")
    episodes = read_table(run_dir / "run.h5", "episodes")
    assert len(episodes["return"]) == int(summary["episodes"]) > 16
    assert float(summary["mean return (last 50)"]) == pytest.approx(episodes["return"][-50:].mean(), abs=0.006)
    assert np.all(episodes["return"] == episodes["length"])  # CartPole: reward 1 per step
    assert episodes["env_steps"].max() <= int(summary["environment steps"])
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["algo"]["name"] == "ha2c" and cfg["env"]["num_envs"] == 16

    rc, err = run_cli([str(CARTPOLE_HA2C), "--ranks", "4"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "--ranks: not supported by the fused loop" in err
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["cartpole-ha2c"]


@pytest.mark.parametrize("change, field", [
    ({"algo": {"name": "hddpg"}}, "hddpg needs a 1-D continuous"),
    ({"env": {"id": "hpcrl/CartPole-v9"}}, "unknown environment 'hpcrl/CartPole-v9'"),
    ({"env": {"kwargs": {"gravity": 9.8}}}, "env.kwargs"),
])
def test_single_process_config_mistakes_exit_2_and_write_nothing(tmp_path, capsys, monkeypatch, change, field):
    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load(CARTPOLE_HA2C.read_text())
    for section, values in change.items():
        cfg[section] = values if section == "algo" else {**cfg[section], **values}
    cfg["io"] = {"run_dir": str(tmp_path / "runs" / "x")}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    rc, err = run_cli([str(tmp_path / "c.yaml")], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and field in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


def checkpointed_run_dir(tmp_path, text: str, versions=(3,)):
    """A run directory holding config.yaml ``text`` and a (stand-in) checkpoint per version."""
    from hpcrl.runtime.record.checkpoint import save_checkpoint

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(text)
    for version in versions:
        save_checkpoint(run_dir, {"version": version})
    return run_dir


def test_resume_refuses_a_change_the_checkpoint_depends_on_and_writes_nothing(tmp_path, capsys):
    text = "name: r\nenv: {id: CartPole-v1, num_envs: 2}\nactors: {count: 1}\n"
    run_dir = checkpointed_run_dir(tmp_path, text)
    rc, err = run_cli(["--resume", str(run_dir), "-o", "aggregation.d=0.5"], capsys)
    assert rc == 2 and "\n" not in err
    assert "aggregation.d would change from 0.96 to 0.5" in err and "stop.*" in err
    rc, err = run_cli(["--resume", str(run_dir), "-o", "learners.groups=2"], capsys)
    assert rc == 2 and "learners.groups would change from 1 to 2" in err
    assert (run_dir / "config.yaml").read_text() == text


def test_a_resume_with_no_intact_checkpoint_is_one_line_and_keeps_config_yaml(tmp_path, capsys):
    from hpcrl.runtime.record.checkpoint import checkpoint_path

    text = "name: r\nenv: {id: CartPole-v1, num_envs: 2}\nactors: {count: 1}\nlaunch: {runner: serial}\n"
    run_dir = checkpointed_run_dir(tmp_path, text, versions=(3, 4))
    for path in checkpoint_path(run_dir).parent.glob("*.pt"):  # latest.pt and previous.pt both damaged
        path.write_bytes(path.read_bytes()[:20])
    rc, err = run_cli(["--resume", str(run_dir), "-o", "stop.total_env_steps=5000"], capsys)
    assert rc == 2 and "\n" not in err and "no intact checkpoint" in err, err
    assert (run_dir / "config.yaml").read_text() == text  # the failed resume's override is not kept


def test_unreadable_inputs_and_unwritable_run_dirs_are_one_line(tmp_path, capsys):
    dup = tmp_path / "dup.yaml"
    dup.write_text("env: {id: CartPole-v1}\nactors: {count: 2}\nenv: {num_envs: 3}\n")
    rc, err = run_cli([str(dup)], capsys)
    assert rc == 2 and "line 3" in err and "key 'env' appears twice" in err and "\n" not in err
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    rc, err = run_cli([str(latin)], capsys)
    assert rc == 2 and "not UTF-8" in err and "\n" not in err
    if os.geteuid() != 0:  # root writes anywhere (it would run the job); /proc below is the same error for root
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            rc, err = run_cli(["-o", f"io.run_dir={locked / 'run'}"], capsys)
        finally:
            locked.chmod(0o700)
        assert rc == 2 and "cannot create" in err and "\n" not in err
    rc, err = run_cli(["-o", "io.run_dir=/proc/hpcrl-run"], capsys)
    assert rc == 2 and "io.run_dir: cannot create /proc/hpcrl-run" in err and "\n" not in err


def test_an_empty_config_file_is_refused(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    rc, err = run_cli([str(empty)], capsys)
    assert rc == 2 and "the file is empty" in err and "\n" not in err


def test_soak_refuses_a_time_that_is_not_positive(capsys):
    from hpcrl.bench import soak

    with pytest.raises(SystemExit) as exit_:
        soak.main(["--minutes", "-1"])
    assert exit_.value.code == 2 and "--minutes -1" in capsys.readouterr().err
