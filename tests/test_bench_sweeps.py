"""The seed benches run as sweeps (hpcrl/bench/sweep_runs.py): hpcrl bench marless and hopper-vs-cleanrl use a
results row only for the settings it was made with, ask the sweep for exactly the runs they lack (the same
``hpcrl run`` as before), still read results files of earlier benches, and (slow) a real marless bench run
twice into one folder runs nothing the second time and prints the same table."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.bench import hopper_vs_cleanrl as HC
from hpcrl.bench import marless, sweep_runs

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
TINY = ["-o", "env.num_envs=2", "-o", "algo.train_batch_size=300", "-o", "algo.minibatch_size=150",
        "-o", "algo.num_sgd_iter=1"]
"""MPE simple-spread IPPO in 300-step rounds of one pass (600 agent steps: 2 or 3 rounds, about 7 s serial)."""


@pytest.fixture
def asked(monkeypatch) -> list:
    """The runs the benches give the sweep; none runs, each is left pending."""
    runs: list = []

    def run_sweep(name, out, todo, jobs):
        runs.extend(todo)
        return {r.name: {"status": "pending"} for r in todo}

    monkeypatch.setattr(sweep_runs, "run_sweep", run_sweep)
    monkeypatch.setattr(HC, "run_sweep", run_sweep)
    return runs


def test_marless_uses_the_row_of_its_settings_and_runs_only_a_run_without_one(tmp_path, asked, capsys):
    results = marless.Results(tmp_path)
    results.add({"mode": "random", "env": "spread", "seeds": 1, "episodes": 2}, {"returns": {"all": -40.0}})
    run = marless.sweep_run("spread", "ippo", "spread-ippo-600", 0, 600, "serial", ["algo.lr=0.01"])
    results.add(marless.run_key("train", run, cross_episodes=0),
                {"rounds": 2, "rewards": {"all": [-38.0, -36.0]}, "wall": 5.0, "cross": {}})
    args = ["--algos", "ippo", "--seeds", "1", "--steps", "600", "--random-episodes", "2", "--last", "1",
            "--out", str(tmp_path)]
    assert marless.main([*args, "-o", "algo.lr=0.01"]) == 0
    assert asked == []
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ippo "))
    assert line.split()[3:8] == ["2", "-38.00", "-36.00", "4.00", "2.00"]  # rounds, first, final, -random, -first
    # another learning rate: the row does not count; the sweep gets the run (left pending here: exit 1)
    assert marless.main([*args, "-o", "algo.lr=0.02"]) == 1
    assert [r.name for r in asked] == ["spread-ippo-600-s0"]
    assert asked[0].overrides == ("env.seed=0", "stop.total_env_steps=600", "algo.lr=0.02", "launch.runner=serial")
    assert not [x for x in capsys.readouterr().out.splitlines() if x.startswith("ippo ")]  # the run is not done


def test_marless_compare_runs_every_arm_of_a_seed_with_the_arms_overrides_last(tmp_path, asked):
    assert marless.main(["--compare", "--algos", "ippo,mappo", "--seeds", "2", "--rounds", "3", "--out",
                         str(tmp_path), "-o", "algo.sharing=true"]) == 1
    assert [r.name for r in asked] == [f"{a}-{arm}-r3-s{s}" for s in (0, 1) for a in ("ippo", "mappo")
                                       for arm in ("off", "on")]
    assert asked[0].overrides == ("env.seed=0", f"stop.total_env_steps={10**12}", "stop.max_rounds=3",
                                  "algo.sharing=true", "algo.sharing=false", "algo.actor_scaling=false",
                                  "launch.runner=serial")


def test_hopper_results_of_earlier_benches_still_load():
    results = HC.load_results(RESULTS / "hopper-vs-cleanrl.jsonl", "Hopper-v4", 1_000_000, [])
    assert sorted(results) == [(impl, s) for impl in ("cleanrl", "hpcrl") for s in range(5)]
    assert HC.report(results, list(range(5)), [250_000, 500_000, 750_000, 1_000_000])


def test_hopper_runs_the_hpcrl_seeds_without_a_row_of_this_budget_as_a_sweep(tmp_path, asked):
    old = {"impl": "hpcrl", "seed": 1, "wall_seconds": 9.0, "steps": [500, 1000], "returns": [10.0, 20.0]}
    other_budget = {**old, "seed": 0, "env": "Hopper-v4", "budget": 5000}
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (old, other_budget)))
    assert HC.main(["--only", "hpcrl", "--seeds", "2", "--steps", "1000", "--out", str(tmp_path),
                    "-o", "algo.lr=0.001"]) == 1  # seed 0 left pending
    assert [r.name for r in asked] == ["hpcrl-Hopper-v4-1000-s0"]  # seed 1's row (no budget in it) counts
    assert asked[0].overrides == ("env.id=Hopper-v4", "env.seed=0", "stop.total_env_steps=1000", "algo.lr=0.001",
                                  "io.log_seconds=60", "launch.runner=serial")


def test_hopper_stopped_sweep_starts_no_cleanrl_run(tmp_path, monkeypatch):
    monkeypatch.setattr(HC, "run_sweep", lambda name, out, runs, jobs: {r.name: {"status": "stopped"} for r in runs})
    assert HC.main(["--cleanrl-script", str(tmp_path / "absent.py"), "--seeds", "1", "--steps", "1000",
                    "--out", str(tmp_path)]) == 3
    assert not (tmp_path / "cleanrl-seed0").exists()


@pytest.mark.slow
def test_marless_bench_again_into_the_same_folder_runs_nothing_and_prints_the_same_table(tmp_path, capsys):
    args = ["--algos", "ippo", "--seeds", "1", "--steps", "600", "--random-episodes", "2", "--out", str(tmp_path),
            *TINY]
    assert marless.main(args) == 0
    first = capsys.readouterr().out
    assert "started spread-ippo-600-s0" in first
    h5 = tmp_path / "runs" / "spread-ippo-600-s0" / "run.h5"
    written = h5.stat().st_mtime_ns
    assert marless.main(args) == 0
    second = capsys.readouterr().out
    assert "started" not in second and h5.stat().st_mtime_ns == written
    assert json.loads((tmp_path / "sweep.json").read_text())["runs"]["spread-ippo-600-s0"]["attempts"] == 1
    table = first[first.index("random policy"):]
    assert [x.split()[:3] for x in table.splitlines() if x.startswith("ippo ")][0] == ["ippo", "all", "0"]  # seed 0
    assert second[second.index("random policy"):] == table
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2  # the random policy's row and the run's


def test_hopper_speed_runs_pairs_in_turns_and_reports_the_median_ratio(tmp_path, monkeypatch, capsys):
    """--speed --repeat 2: hpcrl then CleanRL's script (a stand-in here, which notes when it ran), then CleanRL then
    hpcrl; env steps/s = budget / wall seconds each, the ratio of each pair and their median; the rows stay out of
    the curves' results."""
    ran = tmp_path / "ran"
    walls = iter([20.0, 40.0])

    def run_hpcrl(config, run_dir, runner, overrides, log):
        with ran.open("a") as f:
            f.write("hpcrl\n")
        assert (runner, overrides) == ("serial", ["env.id=Hopper-v4", "env.seed=0", "stop.total_env_steps=40960"])
        return next(walls)

    monkeypatch.setattr(HC.curves, "run_hpcrl", run_hpcrl)
    stand_in = tmp_path / "cleanrl.py"
    stand_in.write_text(f"import time\nopen({str(ran)!r}, 'a').write('cleanrl\\n')\ntime.sleep(0.2)\n"
                        "print('global_step=2048, episodic_return=[12.5]')\n")
    assert HC.main(["--speed", "--repeat", "2", "--cleanrl-script", str(stand_in), "--out", str(tmp_path)]) == 0
    assert ran.read_text().split() == ["hpcrl", "cleanrl", "cleanrl", "hpcrl"]
    rows = list(map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines()))
    assert [(r["pair"], r["impl"]) for r in rows] == [(0, "hpcrl"), (0, "cleanrl"), (1, "cleanrl"), (1, "hpcrl")]
    assert [r["env_steps_per_second"] for r in rows if r["impl"] == "hpcrl"] == [40960 / 20.0, 40960 / 40.0]
    cleanrl = [r for r in rows if r["impl"] == "cleanrl"]
    assert all(r["wall_seconds"] >= 0.2 and r["env_steps_per_second"] == 40960 / r["wall_seconds"] for r in cleanrl)
    ratios = [40960 / 20.0 / cleanrl[0]["env_steps_per_second"], 40960 / 40.0 / cleanrl[1]["env_steps_per_second"]]
    assert f"hpcrl / CleanRL: {(ratios[0] + ratios[1]) / 2:.2f}x" in capsys.readouterr().out
    assert HC.load_results(tmp_path / "results.jsonl") == {}


def test_hopper_speed_names_a_failed_side_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(HC.curves, "run_hpcrl", lambda *a: 20.0)
    broken = tmp_path / "cleanrl.py"
    broken.write_text("raise SystemExit('no such env')\n")
    assert HC.main(["--speed", "--cleanrl-script", str(broken), "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CleanRL seed 0 failed with exit code 1" in err[0] and "Traceback" not in err[0]
