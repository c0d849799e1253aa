"""hpcrl sweep: a spec's configs x arms x seeds as runs on this machine, N at a time, resumable.

A bad spec (unknown key, empty grid, a run whose config is wrong) is one line, exit 2, nothing run or written;
a local sweep runs every run once and keeps its state in one small file; a sweep stopped (SIGTERM) or killed
outright (SIGKILL: its runs get SIGTERM from the parent-death signal and checkpoint) mid-way and started again
resumes the unfinished runs from their checkpoints and ends with every run done once.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpcrl.cli import main as cli_main
from hpcrl.io import read_table

FAST = ["launch.runner=serial", "stop.target_return=null", "io.tensorboard=false", "io.log_seconds=60",
        "actors.count=1", "env.num_envs=2"]


def write_spec(path: Path, **fields) -> Path:
    data = {"name": "t", "config": "cartpole.yaml", "overrides": FAST + ["stop.total_env_steps=600"],
            "arms": {"sync": ["aggregation.policy=sync"], "async": ["aggregation.policy=pure_async"]},
            "seeds": 2, **fields}
    data = {k: v for k, v in data.items() if v is not None}
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


@pytest.mark.parametrize("fields, says", [
    ({"seed": 3}, "unknown key 'seed'; allowed: name, config, configs, overrides, arms, grid, seeds, parallel"),
    ({"arms": {}}, "an empty grid"),
    ({"grid": {"aggregation.d": []}}, "grid.aggregation.d: expected a non-empty list"),
    ({"seeds": 0}, "runs no seed (an empty grid)"),
    ({"arms": {"bad": ["aggregation.polcy=sync"]}}, "run bad-s0: "),
    ({"config": "nope.yaml"}, "config 'nope.yaml' not found"),
])
def test_a_bad_spec_is_one_line_and_runs_nothing(tmp_path, capsys, fields, says):
    spec = write_spec(tmp_path / "spec.yaml", **fields)
    out = tmp_path / "out"
    assert cli_main(["sweep", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not out.exists()


def test_a_config_entry_carries_its_own_overrides(tmp_path):
    from hpcrl.sweep.spec import load_spec

    spec = load_spec(write_spec(tmp_path / "spec.yaml", config=None, seeds=1, arms={"x": ["algo.lr=0.01"]},
                                configs={"a": {"config": "cartpole.yaml", "overrides": ["algo.num_sgd_iter=3"]},
                                         "b": "cartpole.yaml"}))
    a, b = spec.runs
    assert a.overrides[-3:] == ("algo.num_sgd_iter=3", "algo.lr=0.01", "env.seed=0") and b.overrides[-2:] == (
        "algo.lr=0.01", "env.seed=0")


def test_arms_times_grid_times_seeds_names_and_orders_the_runs(tmp_path):
    from hpcrl.sweep.spec import load_spec

    spec = load_spec(write_spec(tmp_path / "spec.yaml", grid={"algo.lr": [0.001, 0.5]}, seeds=[3]))
    assert [r.name for r in spec.runs] == ["sync-lr=0.001-s3", "sync-lr=0.5-s3", "async-lr=0.001-s3", "async-lr=0.5-s3"]
    assert spec.runs[1].overrides[-3:] == ("aggregation.policy=sync", "algo.lr=0.5", "env.seed=3")


@pytest.mark.slow
def test_a_local_sweep_runs_each_run_once_and_a_second_call_runs_nothing(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", parallel=2, config=None, configs={"a": "cartpole.yaml", "b": "cartpole.yaml"},
                      overrides=FAST + ["stop.total_env_steps=600", "eval.episodes=2", "eval.every_rounds=1"])
    out = tmp_path / "out"
    assert cli_main(["sweep", str(spec), "--out", str(out)]) == 0
    state = json.loads((out / "sweep.json").read_text())
    assert sorted(state["runs"]) == [f"{c}-{a}-s{s}" for c in "ab" for a in ("async", "sync") for s in (0, 1)]
    assert all(e["status"] == "done" and e["attempts"] == 1 for e in state["runs"].values())
    for name in state["runs"]:
        steps = read_table(out / "runs" / name / "run.h5", "actors", ["steps"])["steps"].sum()
        assert steps >= 600
    capsys.readouterr()
    assert cli_main(["sweep", str(spec), "--out", str(out)]) == 0
    assert "0 to run" in capsys.readouterr().err
    # an external system's runs beside the sweep (hpcrl bench rllib-ppo's rounds.jsonl): an arm scored by evaluations
    for seed, returns in ((0, [10.0, 30.0]), (1, [12.0, 50.0])):
        ext = out / "external" / f"a-rllib-s{seed}"  # beside config a's arms
        ext.mkdir(parents=True)
        ext.joinpath("rounds.jsonl").write_text("".join(
            json.dumps({"round": k + 1, "env_steps": 256 * (k + 1), "seconds": 1.0 + k, "eval_returns": [r, r + 2]}) + "\n"
            for k, r in enumerate(returns)))
    # hpcrl analyze SWEEP_DIR: config by config, the arms against sync at four marks (every run evaluated: by
    # evaluations), the external arm with config a
    assert cli_main(["analyze", str(out), "--no-figures", "--no-html", "--artifact-names", "--reference", "sync"]) == 0
    table = (out / "analysis" / "arms.md").read_text()
    assert "# Sweep t: a: arms against sync" in table and "# Sweep t: b: arms against sync" in table, table
    assert "last evaluation (greedy episodes)" in table, table
    part_a = table.split("# Sweep t: b")[0]
    rows = [line for line in part_a.splitlines() if line.startswith(("| sync |", "| async |", "| rllib |"))]
    assert len(rows) == 3 and rows[0].count("+-") >= 4, table
    rllib = [c.strip() for c in rows[2].split("|")]
    assert rllib[2] == "2" and rllib[4] == "12.0 +- 1.4", table  # seeds 0 and 1: 11 and 13 at 256 steps
    p_values = [float(p) for p in rows[1].split("|")[7:11] if p.strip()]  # Welch's p at each mark after an evaluation
    assert len(p_values) >= 2 and all(0 <= p <= 1 for p in p_values), table
    # the artifact's files, a folder per seed, named by arm (CONFIG-ARM where two configs share an env)
    assert sorted(p.name for p in (out / "analysis" / "stellaris-csv" / "s1").glob("*~info.csv")) == [
        f"{c}-{a}~CartPole-v1~ppo~info.csv" for c in "ab" for a in ("async", "sync")]
    # --pricing marless: each arm priced as MARLess prices it, and against the reference arm's Lambda and c6a costs
    assert cli_main(["analyze", str(out), "--no-figures", "--no-html", "--reference", "sync",
                     "--pricing", "marless"]) == 0
    table = (out / "analysis" / "arms.md").read_text()
    head = next(line for line in table.splitlines() if line.startswith("| arm |")).split("|")
    sync = next(line for line in table.splitlines() if line.startswith("| sync |")).split("|")
    cells = dict(zip([h.strip() for h in head], [c.strip() for c in sync]))
    assert float(cells["Lambda / ref Lambda"]) == 1.0 and float(cells["Lambda / ref c6a"]) > 0, table
    assert float(cells["Lambda USD"].split()[0]) > 0, table
    assert next(v for k, v in cells.items() if k.startswith("in sync's range at")) == "2/2", table  # the reference's seeds lie within their own range
    # a run whose overrides the spec now changes is refused, not mixed into the old record
    write_spec(spec, config=None, configs={"a": "cartpole.yaml", "b": "cartpole.yaml"},
               overrides=FAST + ["stop.total_env_steps=700"])
    assert cli_main(["sweep", str(spec), "--out", str(out)]) == 2
    assert "ran with another overrides" in capsys.readouterr().err


def test_only_runs_the_runs_a_pattern_names_and_a_pattern_naming_none_is_one_line(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", parallel=2)
    out = tmp_path / "out"
    assert cli_main(["sweep", str(spec), "--out", str(out), "--only", "sync-*", "--only", "async-s1"]) == 0
    status = {n: e["status"] for n, e in json.loads((out / "sweep.json").read_text())["runs"].items()}
    assert status == {"sync-s0": "done", "sync-s1": "done", "async-s0": "pending", "async-s1": "done"}, status
    assert "3 to run (--only: 3 runs)" in capsys.readouterr().err
    for args, says in ((["--only", "ppo-*"], "--only 'ppo-*' matches none of the sweep's runs"),
                       (["--only", "sync-*", "--site", "local-cluster"], "--only runs a part of the sweep")):
        assert cli_main(["sweep", str(spec), "--out", str(out), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
    assert json.loads((out / "sweep.json").read_text())["runs"]["async-s0"]["status"] == "pending"


@pytest.mark.slow
def test_a_sweep_stopped_then_killed_mid_way_resumes_and_finishes_every_run_once(tmp_path):
    """SIGTERM to the sweep: each run checkpoints and exits 3 (stopped), the sweep exits 3; SIGKILL to the next
    sweep: its runs get SIGTERM from the parent-death signal; the third sweep resumes them and finishes."""
    spec = write_spec(tmp_path / "spec.yaml", parallel=2, arms={"sync": ["aggregation.policy=sync"]},
                      overrides=FAST + ["stop.total_env_steps=8000", "io.checkpoint_every=1",
                                        "io.checkpoint_min_seconds=0"], seeds=3)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "hpcrl", "sweep", str(spec), "--out", str(out)]

    def state() -> dict:
        return json.loads((out / "sweep.json").read_text())["runs"]

    def started_and_checkpointed(sweep: subprocess.Popen, since: float) -> None:
        deadline = time.monotonic() + 120
        while not any(p.stat().st_mtime > since for p in (out / "runs").glob("*/checkpoints/latest.pt")):
            assert time.monotonic() < deadline and sweep.poll() is None, "no checkpoint"
            time.sleep(0.2)
        time.sleep(1.0)

    sweep = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started_and_checkpointed(sweep, 0.0)
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(120) == 3
    assert [(state()[f"sync-s{s}"]["status"], state()[f"sync-s{s}"].get("exit")) for s in range(3)] == [
        ("stopped", 3), ("stopped", 3), ("pending", None)]
    sweep = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started_and_checkpointed(sweep, time.time())
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait(30)
    assert [state()[f"sync-s{s}"]["status"] for s in range(2)] == ["running", "running"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "started sync-s0 (resumed)" in done.stderr or "started sync-s1 (resumed)" in done.stderr, done.stderr
    assert all(e["status"] == "done" for e in state().values())
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["sync-s0", "sync-s1", "sync-s2"]
    for s in range(3):  # each run's fragments numbered once, 0, 1, ...: nothing sampled twice, nothing lost
        frags = read_table(out / "runs" / f"sync-s{s}" / "run.h5", "actors", ["fragment", "steps"])
        assert list(frags["fragment"]) == list(range(len(frags["fragment"])))
        assert frags["steps"].sum() >= 8000

def test_welchs_p_value_is_scipys():
    from scipy import stats

    from hpcrl.commands.analyze import load_analysis

    welch_p = load_analysis().sweep.welch_p
    rng = np.random.default_rng(3)
    for n1, n2, shift in ((5, 5, 0.3), (3, 7, 2.0), (2, 2, 0.1), (10, 4, 5.0)):
        a, b = rng.normal(0, 1, n1), rng.normal(shift, 1.5, n2)
        assert welch_p(list(a), list(b)) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
    assert math.isnan(welch_p([1.0], [2.0, 3.0]))


def test_the_shipped_specs_load_by_name_with_every_run_checked():
    from hpcrl.sweep.spec import PACKAGE_SPECS, load_spec

    names = sorted(p.stem for p in PACKAGE_SPECS.glob("*.yaml"))
    assert {"stellaris-fig11", "stellaris-fig13"} <= set(names)
    fig11 = load_spec("stellaris-fig11")
    assert len(fig11.runs) == 3 * 6 * 5 and fig11.runs[0].name == "hopper-sync-s0"
    assert all("launch.profile=stellaris-hpc" in r.overrides for r in fig11.runs)
    for name in names:
        load_spec(name)
