"""hpcrl bench stellaris-ablation / stellaris-sensitivity (Figs. 11 and 13): the settings, the table with
Welch's t-test, results.jsonl resumption, the artifact-minibatch rule, and (slow) one real bench that runs
only the run missing from an existing folder."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.bench import stellaris_runs as SR
from hpcrl.config import load_config
from hpcrl.runtime.plan import make_plan

CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / "stellaris"


def row(setting: str, seed: int, eval_return: float, budget: int = 1000, **extra) -> dict:
    base = {"bench": "t", "setting": setting, "seed": seed, "budget": budget, "eval_return": eval_return,
            "final_return": eval_return / 10, "wall_seconds": 10.0 + seed, "cost": 0.01, "staleness_mean": 0.5,
            "updates": 40}
    return {**base, **extra}


def test_table_gives_mean_std_and_welch_p_against_the_reference():
    results = {(r["setting"], r["seed"]): r for r in
               [row("stellaris", k, v) for k, v in enumerate((1.0, 2.0, 3.0))]
               + [row("sync", k, v) for k, v in enumerate((4.0, 5.0, 6.0))]
               + [row("ssp", 0, 7.0)]}
    rows = {r["setting"]: r for r in SR.table(results, ["sync", "ssp", "stellaris"], "stellaris")}
    assert rows["sync"]["eval_return_mean"] == pytest.approx(5.0)
    assert rows["sync"]["eval_return_std"] == pytest.approx(1.0)  # ddof 1
    # Welch: t = -3 / sqrt(1/3 + 1/3) = -3.674, df = 4, two-sided p = 0.0213 (t-table)
    assert rows["sync"]["eval_return_p"] == pytest.approx(0.0213, abs=5e-4)
    assert math.isnan(rows["ssp"]["eval_return_p"])  # one seed: no test
    assert math.isnan(rows["stellaris"]["eval_return_p"])  # the reference itself
    text = SR.markdown(list(rows.values()), "stellaris")
    assert "| sync | 3 | 5.0 +- 1.0 |" in text and "0.021" in text
    assert "| ssp | 1 | 7.0 |" in text


def test_sensitivity_grid_runs_the_papers_setting_once():
    settings = SR.sensitivity_settings(["d", "v", "rho"])
    assert len(settings) == 1 + 4 + 3 + 3
    assert settings["paper"] == ["aggregation.policy=stellaris"]
    assert settings["d=0.92"] == ["aggregation.policy=stellaris", "aggregation.d=0.92"]
    assert "v=3" not in settings and "rho=1" not in settings and "d=0.96" not in settings
    assert list(SR.sensitivity_settings(["v"])) == ["paper", "v=1", "v=2", "v=4"]


def test_ablation_settings_are_fig_11():
    assert list(SR.ABLATION) == ["sync", "pure_async", "ssp", "softsync", "stellaris", "stellaris_no_is"]
    cfg = load_config(CONFIGS / "hopper_ppo.yaml", [*SR.LAYOUT, *SR.ABLATION["stellaris_no_is"]])
    assert cfg.aggregation.policy == "stellaris" and cfg.aggregation.is_truncation is False


@pytest.mark.parametrize("workload", ["hopper", "humanoid", "walker2d", "spaceinvaders", "qbert", "gravitar"])
def test_shipped_ppo_configs_use_the_artifacts_minibatch(workload):
    """The artifact's async learners take one whole share of the round's batch per gradient, 10 passes."""
    cfg = load_config(CONFIGS / f"{workload}_ppo.yaml")
    assert cfg.algo.minibatch_size == make_plan(cfg).group_batch_size
    assert cfg.algo.num_sgd_iter == 10


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_bench_artifact_minibatch_is_a_groups_whole_share(groups):
    over = [f"learners.groups={groups}", f"learners.min_active={groups}", *SR.MINIBATCH["artifact"](groups)]
    cfg = load_config(CONFIGS / "hopper_ppo.yaml", over)
    assert cfg.algo.minibatch_size == make_plan(cfg).group_batch_size


def test_bench_loads_only_rows_of_its_budget_and_runs_nothing_when_complete(tmp_path):
    rows = [row("sync", 0, 1.0), row("stellaris", 0, 2.0), row("stellaris", 0, 9.0, budget=5)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = SR.Bench("t", {"sync": [], "stellaris": []}, [0], 1000, tmp_path, [])
    got = bench.run(jobs=1)  # nothing missing: no hpcrl run starts
    assert got[("stellaris", 0)]["eval_return"] == 2.0
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 3
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, message", [(["--settings", "sync,bogus"], "unknown setting 'bogus'"),
                                           (["--budget", "0"], "must be at least 1")])
def test_ablation_refuses_bad_arguments(args, message):
    done = subprocess.run([sys.executable, "-m", "hpcrl", "bench", "stellaris-ablation", *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr


def test_sensitivity_refuses_an_unknown_parameter():
    done = subprocess.run([sys.executable, "-m", "hpcrl", "bench", "stellaris-sensitivity", "--params", "d,q"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown parameter 'q'" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ablation_bench_runs_only_what_is_missing(tmp_path):
    """A folder that already holds sync's row: the bench runs stellaris alone (serial runner, 2 rounds),
    appends its row, writes the artifact CSVs and a table with both settings."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text(json.dumps(row("sync", 0, 50.0, budget=2048, final_return=12.0)) + "\n")
    cmd = [sys.executable, "-m", "hpcrl", "bench", "stellaris-ablation", "--budget", "2048", "--seeds", "1",
           "--settings", "sync,stellaris", "--runner", "serial", "--out", str(out),
           "-o", "algo.train_batch_size=1024", "-o", "algo.minibatch_size=512", "-o", "algo.num_sgd_iter=1",
           "-o", "actors.fragment_length=64", "-o", "eval.episodes=2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["setting"], r["seed"]) for r in lines] == [("sync", 0), ("stellaris", 0)]
    new = lines[1]
    assert new["env_steps"] >= 2048 and new["updates"] > 0 and math.isfinite(new["eval_return"])
    assert not (out / "runs" / "sync-2048-s0").exists() and (out / "runs" / "stellaris-2048-s0" / "run.h5").is_file()
    assert json.loads((out / "sweep.json").read_text())["runs"]["stellaris-2048-s0"]["status"] == "done"
    assert sorted(p.name for p in (out / "logs" / "stellaris-2048-s0").iterdir()) == [
        "stellaris~Hopper-v3~ppo~info.csv", "stellaris~Hopper-v3~ppo~timeline.csv"]
    table = (out / "table.md").read_text()
    assert "| sync | 1 | 50.0 |" in table and "| stellaris | 1 |" in table
