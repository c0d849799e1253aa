"""Dynamic learner sharing in runs (algo.sharing): the contract hooks, the model/optimizer side, run.h5's policy_map."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.algos import make_algorithm
from hpcrl.cli import main as cli_main
from hpcrl.config import ModelConfig, build_config, load_config
from hpcrl.io import read_table
from hpcrl.marl.model import initial_map
from hpcrl.marl.replay import joint_transitions
from hpcrl.marl.sharing import MappingChange
from hpcrl.marl.sharing_rank import agent_returns, apply_change, spread_rows
from hpcrl.runtime.record.checkpoint import load_checkpoint

CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs"
OBS, ACT = spaces.Box(-np.inf, np.inf, (3,), np.float32), spaces.Discrete(4)
# W = 3 rounds and a gamma no slope reaches: the strategy toggles every time the window fills
TOGGLING = ["env.num_envs=2", "actors.fragment_length=25", "algo.train_batch_size=300", "algo.minibatch_size=150",
            "algo.num_sgd_iter=1", "algo.sharing=true", "algo.sharing_window=3", "algo.sharing_gamma=100",
            "algo.sharing_samples_per_agent=24", "algo.sharing_lanczos_steps=6", "io.flush_seconds=0.5"]


def _algo(name, agents=3, **algo):
    cfg = build_config({"env": {"id": "hpcrl/MPESimpleSpread-v3", "kwargs": {"N": agents}},
                        "algo": {"name": name, "agents": agents, "sharing": True, "sharing_samples_per_agent": 8,
                                 "sharing_lanczos_steps": 4, **algo}})
    return make_algorithm(cfg.algo, ModelConfig(hidden_sizes=[8]), cfg.aggregation)


def _fragment(T=8, copies=2, agents=3, seed=0):
    rng = np.random.default_rng(seed)
    N = copies * agents
    return {"obs": rng.normal(size=(T, N, 3)).astype(np.float32), "actions": rng.integers(4, size=(T, N)),
            "rewards": rng.normal(size=(T, N)).astype(np.float32), "terminated": np.zeros((T, N), np.int8),
            "truncated": np.zeros((T, N), np.int8), "behaviour_logp": np.full((T, N), -np.log(4), np.float32),
            "values": np.zeros((T, N), np.float32), "final_values": np.zeros((T, N), np.float32),
            "last_value": np.zeros(N, np.float32), "last_obs": rng.normal(size=(N, 3)).astype(np.float32)}


def test_per_agent_round_returns_need_every_agent():
    eps = {"env_index": list(range(6)), "return": [float(i) for i in range(6)]}  # 2 copies x 3 agents
    assert agent_returns(eps, 3).tolist() == [1.5, 2.5, 3.5]
    assert agent_returns({k: v[:2] for k, v in eps.items()}, 3) is None


def test_report_rows_are_spread_over_each_agents_rows():
    agent = np.arange(30) % 3
    idx = spread_rows(agent, 3, 4)
    assert [int((agent[idx] == j).sum()) for j in range(3)] == [4, 4, 4]
    assert idx[0] == 0 and idx[3] == 27  # agent 0's first and last rows


def test_a_split_copies_weights_resets_only_the_copied_slots_optimizer_state_and_maps():
    algo = _algo("ippo", policies="shared")
    model = algo.make_model(OBS, ACT)
    assert model.slots == 3 and model.mapping().tolist() == [0, 0, 0]  # sharing: one slot per agent
    opt = algo.make_optimizer(model)
    model.flat.grads.fill_(0.1)
    opt.step()
    assert all(p in opt.state for s in range(3) for p in model.policy_parameters(s))
    apply_change(model, opt, MappingChange(4, [0, 0, 0], [0, 1, 2], "off", copies=[(0, 1), (0, 2)]))
    assert model.mapping().tolist() == [0, 1, 2]
    assert all(p in opt.state for p in model.policy_parameters(0))
    assert not any(p in opt.state for s in (1, 2) for p in model.policy_parameters(s))
    for a, b in zip(model.policy_parameters(0), model.policy_parameters(2)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["ippo", "mappo", "iql", "vdn"])
def test_learner_report_gives_per_agent_samples_and_a_convexity_ratio(name):
    algo = _algo(name)
    model = algo.make_model(OBS, ACT)
    batch = algo.prepare([_fragment(), _fragment(seed=1)], model)
    report = algo.learner_report(batch)
    samples = algo.sharing_samples(model, report)
    assert [s.shape for s in samples] == [(8, 3 + 4)] * 3  # observation + one-hot action
    c = algo.sharing.convexity(model, report, 1)
    assert np.isfinite(c) and c >= 1.0


def _replayed_map(cfg, rows) -> list[int]:
    mapping = initial_map(cfg.algo.policies, cfg.algo.agents)
    for i in np.argsort(rows["round"], kind="stable"):
        mapping[int(rows["agent"][i])] = int(rows["new_policy"][i])
    return mapping


def _final_map(run_dir: Path, cfg) -> list[int]:
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    from hpcrl.runtime.roles.sampler import describe_env

    env = describe_env(cfg.env)
    model = algo.make_model(env.observation_space, env.action_space)
    model.flat.load_(load_checkpoint(run_dir)["params"])
    return model.mapping().tolist()


def _check_sharing_record(run_dir: Path) -> None:
    cfg = load_config(run_dir / "config.yaml")
    rows = read_table(run_dir / "run.h5", "policy_map")
    reasons = {r.decode() for r in rows["reason"]}
    assert any("sharing on (j=1)" in r for r in reasons) and any("sharing off" in r for r in reasons), reasons
    off = [i for i, r in enumerate(rows["reason"]) if b"sharing off" in r]
    assert all(rows["copied_from"][i] == rows["old_policy"][i] for i in off)  # a split agent starts from its shared policy
    rounds = read_table(run_dir / "run.h5", "rounds")["round"]
    assert rows["round"].max() <= rounds.max()
    assert _final_map(run_dir, cfg) == _replayed_map(cfg, rows)  # the model's map is the last recorded one


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("sharing") / "run"
    args = [a for o in [*TOGGLING, "stop.total_env_steps=3600", f"io.run_dir={run_dir}"] for a in ("-o", o)]
    assert cli_main(["run", str(CONFIGS / "mpe_spread_ippo.yaml"), "--runner", "serial", *args]) == 0
    return run_dir


@pytest.mark.slow
def test_serial_run_toggles_sharing_and_records_every_change(serial_run):
    _check_sharing_record(serial_run)


@pytest.mark.slow
def test_analyze_shows_policies_per_round_and_the_learner_actor_cost_split(serial_run, tmp_path, capsys):
    from hpcrl.commands.analyze import load_analysis

    assert cli_main(["analyze", str(serial_run), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "learner vs actor cost" in out and "policies, map changes and active roles per round" in out
    assert (tmp_path / "marl.png").stat().st_size > 0
    h5 = serial_run / "run.h5"
    pm, rounds = read_table(h5, "policy_map"), read_table(h5, "rounds")
    with open(tmp_path / "marl-rounds-mpe-spread-ippo-sync.csv") as fh:
        import csv

        rows = list(csv.DictReader(fh))
    assert [int(r["round"]) for r in rows] == rounds["round"].tolist()
    assert sum(int(r["changes"]) for r in rows) == len(pm["round"])
    policies = [int(r["policies"]) for r in rows]
    assert policies[0] == 6  # per_agent start
    for k in np.unique(pm["round"]):  # each switch holds from the next round, with the policy count it recorded
        if k + 1 < len(policies):
            assert policies[int(k) + 1] == int(pm["policies"][pm["round"] == k][0])
    ha = load_analysis()
    run = ha.load_run(serial_run)
    split, cost = ha.marl.cost_split(run, ha.metrics.load_prices(None)), ha.metrics.cost(run, ha.metrics.load_prices(None))
    la = read_table(h5, "learner_activity")
    assert split["learner_seconds"] == pytest.approx(float(la["compute_seconds"].sum()), rel=1e-5)
    assert split["serverless_learner"] == cost["serverless_learner"] > 0
    assert split["serverful_learner_actor"] == pytest.approx(cost["serverful_learner"] + cost["serverful_actor"])
    assert split["serverless_learner_actor"] < split["serverful_learner_actor"]


@pytest.mark.slow
def test_resume_goes_on_with_the_checkpointed_window_and_enablings(serial_run, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(serial_run, run_dir)
    state = load_checkpoint(run_dir)["algo_state"]["sharing"]
    enabled = state["decider"].enabled_times
    assert enabled >= 1 and state["report"] is not None
    assert cli_main(["run", "--resume", str(run_dir), "-o", "stop.total_env_steps=7200"]) == 0
    after = load_checkpoint(run_dir)["algo_state"]["sharing"]["decider"]
    # the count j of enablings went on from the checkpoint (rebuilt, it would start again at 0: 2 here)
    assert after.enabled_times > enabled


@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_run_toggles_sharing_and_records_every_change(tmp_path):
    run_dir = tmp_path / "run"
    args = [a for o in [*TOGGLING, "stop.total_env_steps=3600", f"io.run_dir={run_dir}"] for a in ("-o", o)]
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(CONFIGS / "mpe_spread_ippo.yaml"), "--runner",
                          "mpi", *args], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    _check_sharing_record(run_dir)
