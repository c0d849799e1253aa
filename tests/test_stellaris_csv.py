"""`hpcrl analyze --stellaris-csv`: the Stellaris artifact's info/timeline CSV files from a real serial run,
read back the way its evaluation/experiment/plot.py reads them (pandas.read_csv)."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from hpcrl.cli import main as hpcrl_main
from hpcrl.commands.analyze import load_analysis
from hpcrl.config import build_config
from hpcrl.io import read_table
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import serial

pd = pytest.importorskip("pandas")

INFO = ["round_id", "duration", "num_rollout_workers", "num_envs_per_worker", "episodes_this_iter", "learner_time",
        "actor_time", "eval_reward_max", "eval_reward_mean", "eval_reward_min", "eval_reward_std", "staleness_max",
        "staleness_mean", "staleness_min", "staleness_std", "learner_loss", "cost", "serverless_bound"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("stellaris-csv") / "run"
    cfg = build_config({"name": "csv", "env": {"id": "CartPole-v1", "num_envs": 4},
                        "actors": {"count": 2, "fragment_length": 16}, "learners": {"groups": 2, "min_active": 2},
                        "aggregation": {"policy": "stellaris", "d": 0.9},
                        "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 64, "num_sgd_iter": 2},
                        "stop": {"total_env_steps": 2500}, "launch": {"runner": "serial"},
                        "io": {"run_dir": str(run_dir)}})
    assert serial.run(make_plan(cfg), run_dir, progress="plain").stop_reason.startswith("stop.")
    return run_dir


def test_info_and_timeline_read_as_plot_py_reads_them(run, tmp_path):
    assert hasattr(load_analysis(), "stellaris_csv"), "hpcrl_analysis is not this tree's analysis/ folder"
    out = tmp_path / "logs"
    assert hpcrl_main(["analyze", str(run), "--no-figures", "--stellaris-csv", "--out", str(out)]) == 0
    info = pd.read_csv(out / "stellaris~CartPole-v1~ppo~info.csv")
    timeline = pd.read_csv(out / "stellaris~CartPole-v1~ppo~timeline.csv")
    assert list(info.columns) == INFO
    assert list(timeline.columns) == ["Wall clock time (s)", "Episodic reward"]

    rounds = read_table(run / "run.h5", "rounds")
    order = np.argsort(rounds["start"])
    assert info["round_id"].tolist() == list(range(1, len(order) + 1))
    np.testing.assert_allclose(info["duration"], rounds["duration"][order], rtol=1e-6)
    assert (info["num_rollout_workers"] == 2).all() and (info["num_envs_per_worker"] == 4).all()
    # cost: the running total of the per-round Stellaris cost of the rounds CSV (plot.py takes the last row)
    with open(next(out.glob("rounds-*.csv"))) as fh:
        per_round = [float(r["cost"]) for r in csv.DictReader(fh)]
    np.testing.assert_allclose(info["cost"], np.cumsum(per_round), rtol=1e-5)
    assert info["cost"].iloc[-1] == pytest.approx(sum(per_round), rel=1e-5)
    # serverless_bound: no threshold in the observation round, then beta_k of Eq. 3
    assert np.isnan(info["serverless_bound"].iloc[0])
    np.testing.assert_allclose(info["serverless_bound"].iloc[1:], rounds["threshold"][order][1:], rtol=1e-6)
    assert info["serverless_bound"].iloc[1:].is_monotonic_decreasing

    # timeline: (0, 0), then every episode of round k at the cumulative duration of rounds 1..k
    ends = np.cumsum(rounds["duration"][order].astype(np.float64))
    near = lambda t, e: np.isclose(np.asarray(t)[:, None], np.asarray(e)[None, :], rtol=0, atol=1e-4).any(axis=1)  # noqa: E731
    assert timeline.iloc[0].tolist() == [0.0, 0.0]
    body = timeline.iloc[1:]
    assert near(body["Wall clock time (s)"], ends).all()
    assert body["Wall clock time (s)"].is_monotonic_increasing
    counts = info["episodes_this_iter"].to_numpy()
    assert len(body) == int(np.maximum(counts, 1).sum())  # a round without episodes: one 0 row
    ep = read_table(run / "run.h5", "episodes")
    in_rounds = ep["time"] < (rounds["start"] + rounds["duration"]).max()  # later episodes are in no round
    with_episodes = near(body["Wall clock time (s)"], ends[counts > 0])
    assert sorted(body["Episodic reward"][with_episodes]) == sorted(ep["return"][in_rounds].tolist())
    means = [body["Episodic reward"][near(body["Wall clock time (s)"], [e])].mean() for e in ends]
    np.testing.assert_allclose(means, np.where(counts > 0, info["eval_reward_mean"], 0.0), rtol=1e-6)


def test_scheduler_names_and_collisions(run, tmp_path):
    out = tmp_path / "logs"
    assert hpcrl_main(["analyze", str(run), "--no-figures", "--stellaris-csv", "--stellaris-scheduler", "policy",
                       "--out", str(out)]) == 0
    assert (out / "stellaris~CartPole-v1~ppo~timeline.csv").is_file()  # the run's policy is stellaris
    assert hpcrl_main(["analyze", str(run), str(run), "--no-figures", "--stellaris-csv", "--out", str(out)]) == 2


def test_artifact_names_lay_out_a_folder_that_the_artifacts_plot_reads(run, tmp_path, capsys):
    """--artifact-names: the files the artifact's plot.py opens, SCHEDULER~ENV~ALGO~{timeline,info}.csv for schedulers
    stellaris and sync on its MuJoCo ids, read as it reads them (the timeline's two columns, cost's last value); hpcrl's
    sync runs are not named rllib (the artifact's rllib is RLlib's PPO)."""
    ha = load_analysis()
    S = ha.stellaris_csv
    runs = []
    for policy, env in (("stellaris", "Hopper-v5"), ("sync", "Hopper-v5"), ("stellaris", "Walker2d-v4")):
        r = ha.load_run(run)
        r.attrs = {**r.attrs, "config_yaml": f"env:\n  id: {env}\naggregation:\n  policy: {policy}\nalgo:\n  name: ppo\n"}
        runs.append(r)
    logs = tmp_path / "logs"
    logs.mkdir()
    S.write_stellaris_csv(runs, logs, ha.metrics.load_prices(None), artifact_names=True)
    assert "has no evaluation episodes" in capsys.readouterr().err  # this run's timeline is its training episodes
    assert not list(logs.glob("rllib~*"))
    for scheduler in ("stellaris", "sync"):  # plot.py's scheduler_names; its env_names are config.envs' keys
        timeline = pd.read_csv(logs / f"{scheduler}~Hopper-v3~ppo~timeline.csv")
        assert len(timeline["Wall clock time (s)"]) == len(timeline["Episodic reward"]) > 1
        assert pd.read_csv(logs / f"{scheduler}~Hopper-v3~ppo~info.csv")["cost"].iloc[-1] > 0
    assert (logs / "stellaris~Walker2d-v3~ppo~timeline.csv").is_file()
