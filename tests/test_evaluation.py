"""Evaluation episodes (eval.*): greedy actions, the evaluator's seeds, the eval_episodes table under
both runners, and the Stellaris CSV's eval_reward_* columns read from it."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.algos import make_algorithm
from hpcrl.cli import main as hpcrl_main
from hpcrl.config import build_config
from hpcrl.io import read_table
from hpcrl.runtime.roles.evaluation import Evaluator
from hpcrl.runtime.roles.sampler import VectorSampler
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import serial

EVAL_RUN = {"name": "eval", "env": {"id": "CartPole-v1", "num_envs": 4},
            "actors": {"count": 2, "fragment_length": 16},
            "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 128, "num_sgd_iter": 2},
            "eval": {"episodes": 3, "every_rounds": 4}, "stop": {"total_env_steps": 1100}}  # 9 rounds: 2 evaluations


def test_greedy_is_the_mode_of_the_policy():
    cfg = build_config({})
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    discrete = algo.make_model(spaces.Box(-1, 1, (4,)), spaces.Discrete(3))
    assert torch.equal(algo.greedy(discrete, obs), discrete.dist(obs).logits.argmax(-1))
    box = algo.make_model(spaces.Box(-1, 1, (4,)), spaces.Box(-2, 2, (2,)))
    torch.testing.assert_close(algo.greedy(box, obs), box.dist(obs).mean)
    hddpg = make_algorithm(build_config({"algo": {"name": "hddpg"}}).algo, cfg.model, cfg.aggregation)
    model = hddpg.make_model(spaces.Box(-1, 1, (4,)), spaces.Box(-2, 2, (2,)))
    torch.testing.assert_close(hddpg.greedy(model, obs), model.actor(model.obs(obs)))


def test_evaluator_is_reproducible_and_moves_on_to_new_seeds():
    cfg = build_config({"env": {"id": "CartPole-v1", "num_envs": 2}, "eval": {"episodes": 4, "seed": 7}})
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    torch.manual_seed(0)
    model = algo.make_model(spaces.Box(-5, 5, (4,)), spaces.Discrete(2))
    first, second = (Evaluator(cfg.env, cfg.eval, VectorSampler(cfg.env, 0)) for _ in range(2))
    a = first.run(algo, model)
    assert [r.env_index for r in a] == [0, 1, 2, 3]
    assert all(r.length >= 1 and r.episode_return == r.length for r in a)  # CartPole: +1 a step
    assert a == second.run(algo, model)  # same seeds, same greedy policy: the same episodes
    # evaluation k resets copy i with seed + k * episodes + i: the second evaluation's copies 0..3
    # are seeded 11..14, so a third evaluator started at seed 11 replays it
    third = Evaluator(cfg.env, cfg.eval.model_copy(update={"seed": 11}), VectorSampler(cfg.env, 0))
    assert first.run(algo, model) == third.run(algo, model)


def check_eval_table(run_dir, every: int, episodes: int) -> None:
    ev = read_table(run_dir / "run.h5", "eval_episodes")
    rounds = read_table(run_dir / "run.h5", "rounds")
    assert len(ev["round"]) >= episodes, "no evaluation recorded"
    assert (ev["round"] % every == 0).all() and (ev["round"] <= rounds["round"].max() + 1).all()
    for k in np.unique(ev["round"]):
        sel = ev["round"] == k
        assert sorted(ev["env_index"][sel]) == list(range(episodes))
        assert (ev["return"][sel] == ev["length"][sel]).all() and (ev["length"][sel] >= 8).all()
        assert len(np.unique(ev["policy_version"][sel])) == 1
    # evaluation episodes stay out of the training record: every training episode came from a fragment
    ep = read_table(run_dir / "run.h5", "episodes")
    actors = read_table(run_dir / "run.h5", "actors")
    assert ep["length"].sum() <= actors["steps"].sum()


def test_serial_run_records_evaluations(tmp_path):
    cfg = build_config({**EVAL_RUN, "launch": {"runner": "serial"}, "io": {"run_dir": str(tmp_path)}})
    result = serial.run(make_plan(cfg), tmp_path)
    assert result.stop_reason.startswith("stop.")
    check_eval_table(tmp_path, every=4, episodes=3)
    # the summary's evaluation line is the newest evaluation's
    ev = read_table(tmp_path / "run.h5", "eval_episodes")
    newest = ev["policy_version"] == ev["policy_version"].max()
    s = result.summary
    assert s["eval_return"] == pytest.approx(ev["return"][newest].mean()) and s["eval_episodes"] == 3
    assert s["eval_version"] == ev["policy_version"].max()
    # hpcrl analyze: the newest evaluation in the summary table, every evaluation drawn in the return figure
    assert hpcrl_main(["analyze", str(tmp_path), "--out", str(tmp_path / "analysis")]) == 0
    md = (tmp_path / "analysis" / "summary.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| last evaluation return (greedy) |"))
    assert float(row.split("|")[2]) == pytest.approx(ev["return"][newest].mean(), rel=5e-3), row  # 3 digits


@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_run_records_evaluations(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "hpcrl.cli", "run", "-o", f"io.run_dir={run_dir}", "-o", "name=eval",
            "-o", "env.num_envs=4", "-o", "actors.fragment_length=16", "-o", "algo.train_batch_size=128",
            "-o", "algo.minibatch_size=128", "-o", "algo.num_sgd_iter=2", "-o", "eval.episodes=3",
            "-o", "eval.every_rounds=4", "-o", "stop.total_env_steps=1100", "-o", "stop.target_return=null"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    check_eval_table(run_dir, every=4, episodes=3)
    assert "evaluation return (v" in out.stdout and "3 greedy episodes)" in out.stdout  # the summary's line


def test_stellaris_csv_takes_eval_rewards_from_the_evaluations(tmp_path):
    pd = pytest.importorskip("pandas")
    run_dir = tmp_path / "run"
    cfg = build_config({**EVAL_RUN, "launch": {"runner": "serial"}, "io": {"run_dir": str(run_dir)}})
    serial.run(make_plan(cfg), run_dir)
    out = tmp_path / "logs"
    assert hpcrl_main(["analyze", str(run_dir), "--no-figures", "--stellaris-csv", "--out", str(out)]) == 0
    info = pd.read_csv(out / "stellaris~CartPole-v1~ppo~info.csv")
    ev = read_table(run_dir / "run.h5", "eval_episodes")
    last = np.zeros(4)
    for row in info.itertuples():
        sel = ev["round"] == row.round_id
        if sel.any():
            r = ev["return"][sel].astype(np.float64)
            last = np.array([r.max(), r.mean(), r.min(), r.std()])
        got = [row.eval_reward_max, row.eval_reward_mean, row.eval_reward_min, row.eval_reward_std]
        np.testing.assert_allclose(got, last, rtol=1e-5, err_msg=f"round {row.round_id}")
    assert (info["eval_reward_mean"].iloc[:3] == 0).all() and info["eval_reward_mean"].iloc[3] > 0
    # the timeline is the evaluation episodes (the artifact's is), each evaluation at the end of the rounds before it
    timeline = pd.read_csv(out / "stellaris~CartPole-v1~ppo~timeline.csv")
    np.testing.assert_allclose(timeline["Episodic reward"].iloc[1:], ev["return"].astype(np.float64), rtol=1e-6)
    clock = timeline["Wall clock time (s)"].to_numpy()
    assert clock[0] == 0 and (np.diff(clock) >= 0).all() and clock[1] > 0
