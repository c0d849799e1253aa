"""Actor scaling in runs (algo.actor_scaling, MARLess section 4.4): parked actors, the actor_scaling rows, the
round size that follows the active actors, and a parked MPI actor rank that blocks, wakes and stops cleanly."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcrl.cli import main as cli_main
from hpcrl.config import build_config, load_config
from hpcrl.errors import ConfigError
from hpcrl.io import read_table
from hpcrl.io.schema import PARK_REASONS
from hpcrl.runtime.plan import make_plan

CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs"
# 3 actor ranks of 2 env copies x 6 agents, 25-step fragments (300 agent steps): a round is 3 fragments
SMALL = ["env.num_envs=2", "actors.count=3", "actors.fragment_length=25", "algo.train_batch_size=900",
         "algo.minibatch_size=150", "algo.num_sgd_iter=1", "io.flush_seconds=0.5"]


def _args(overrides) -> list[str]:
    return [a for o in overrides for a in ("-o", o)]


def _park_intervals(parks, actor):
    sel = parks["actor"] == actor
    return list(zip(parks["time"][sel] - parks["parked_seconds"][sel], parks["time"][sel], parks["reason"][sel]))


def _no_fragment_while_parked(h5: Path) -> None:
    parks, frags = read_table(h5, "actor_parks"), read_table(h5, "actors")
    for a in np.unique(parks["actor"]):
        sent = frags["time"][frags["actor"] == a]
        for start, end, _ in _park_intervals(parks, a):
            assert not ((sent > start + 1e-3) & (sent < end - 1e-3)).any(), (a, start, end)


def test_i_max_is_capped_at_the_actor_count_and_i_min_above_it_is_refused():
    base = {"env": {"id": "hpcrl/MPESimpleSpread-v3", "kwargs": {"N": 6}}, "actors": {"count": 4},
            "algo": {"name": "ippo", "agents": 6, "actor_scaling": True}}
    assert build_config(base).algo.actor_scaling_range(4) == (1, 4)  # I_min = ceil(4 / 6)
    assert build_config({**base, "algo": {**base["algo"], "actor_scaling_max": 50}}).algo.actor_scaling_range(4) == (1, 4)
    with pytest.raises(ConfigError, match="algo.actor_scaling_min=5 exceeds I_max=4"):
        build_config({**base, "algo": {**base["algo"], "actor_scaling_min": 5}})


@pytest.mark.slow
def test_serial_run_parks_actors_beyond_the_demand_and_records_every_round(tmp_path):
    """I_max = 2 of 3 actor ranks: once the first learner report is in, actor 2 parks for good (it stops parked)."""
    run_dir = tmp_path / "run"
    over = [*SMALL, "algo.policies=shared", "algo.actor_scaling=true", "algo.actor_scaling_max=2",
            "algo.actor_scaling_window=3", "algo.sharing_samples_per_agent=24", "algo.sharing_lanczos_steps=6",
            "stop.max_rounds=4", f"io.run_dir={run_dir}"]
    assert cli_main(["run", str(CONFIGS / "mpe_spread_ippo.yaml"), "--runner", "serial", *_args(over)]) == 0
    h5 = run_dir / "run.h5"
    cfg = load_config(run_dir / "config.yaml")
    sc, rounds = read_table(h5, "actor_scaling"), read_table(h5, "rounds")
    assert sc["round"].tolist() == rounds["round"].tolist() == list(range(4))  # one row per round, max_rounds exact
    assert sc["demanded"][0] == -1 and sc["active"][0] == 3  # no learner report yet: all actors stay
    assert np.all((sc["demanded"][1:] >= 1) & (sc["demanded"][1:] <= 2))  # I_t in [I_min, I_max] = [1, 2]
    assert np.array_equal(sc["active"][1:], sc["demanded"][1:])
    assert sc["changed"][1] == 1 and all(b"I_avg=" in r for r in sc["reason"][1:])
    assert all(r.startswith(b"0:") for r in sc["policy_demands"][1:])  # one policy, slot 0
    # the round after a decision holds round_steps_for(active) env steps (3 fragments x active / 3), give or take
    # the batch a learner had already taken when the count changed
    assert sum(rounds["env_steps"]) >= sum(make_plan(cfg).round_steps_for(int(a)) for a in [3, *sc["active"][:-1]])
    parks = read_table(h5, "actor_parks")
    assert 2 in parks["actor"].tolist()
    (start, end, reason), = _park_intervals(parks, 2)  # one park, ended by the stop
    assert PARK_REASONS[reason] == "stopped"
    frags = read_table(h5, "actors")
    assert (frags["time"][frags["actor"] == 2] < start + 1e-3).all()  # nothing sampled after it parked
    _no_fragment_while_parked(h5)
    # hpcrl analyze's per-round MARL table: the actors in force in round k are the decision of round k - 1
    out = tmp_path / "analysis"
    assert cli_main(["analyze", str(run_dir), "--out", str(out)]) == 0
    with open(next(out.glob("marl-rounds-*.csv"))) as fh:
        shown = [int(row["active_actors"]) for row in csv.DictReader(fh)]
    assert shown == [3, *sc["active"][:-1].tolist()]


@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_parked_actor_ranks_block_wake_and_the_run_ends_cleanly(tmp_path):
    """debug.active_actors: 1 active actor in rounds 0-9, all 3 from round 10 (a batch taken before the change can
    end a few short rounds at once); the evaluating actor (2) wakes for each evaluation requested while it is parked
    (after rounds 3 and 7), then parks again. The activation comes two rounds after the last of those requests:
    when both came as round 7 ended (rounds of 0.1 s) the park's end was either's, and the test raced (CI)."""
    run_dir = tmp_path / "run"
    over = [*SMALL, "algo.num_sgd_iter=1", f"debug.active_actors=[{','.join(['1'] * 10)},3]", "eval.episodes=1",
            "eval.every_rounds=4", "stop.max_rounds=13", f"io.run_dir={run_dir}"]
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(CONFIGS / "mpe_spread_ippo.yaml"), "--runner",
                          "mpi", *_args(over)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "stop.max_rounds=13 reached" in res.stdout
    h5 = run_dir / "run.h5"
    parks, frags, rounds = read_table(h5, "actor_parks"), read_table(h5, "actors"), read_table(h5, "rounds")
    for a in (1, 2):
        intervals = _park_intervals(parks, a)
        woken = [(s, e) for s, e, r in intervals if PARK_REASONS[r] == "woken"]
        assert len(woken) == 1, intervals
        start, end = woken[0]
        assert (frags["time"][frags["actor"] == a] > end).any()  # it came back and sampled again
    # rank 0 asks for an evaluation as it closes rounds 3 and 7; a park of actor 2 that spans the request ends
    # for it (actor 2 may still be starting at the first request on a slow machine: then it evaluates first)
    ends = rounds["start"] + rounds["duration"]
    requested = [float(ends[rounds["round"] == r][0]) for r in (3, 7)]
    spanning = [r for s, e, r in _park_intervals(parks, 2) for t in requested if s < t < e]
    # (none spans on a machine so loaded that actor 2 first parks after both requests: it was sampling then,
    # and evaluated between fragments, which the eval_episodes rows below show)
    assert all(PARK_REASONS[r] == "evaluation" for r in spanning), (requested, parks)
    assert len(read_table(h5, "eval_episodes")["round"]) >= 2
    sel = parks["reason"] == PARK_REASONS.index("woken")
    # blocked, not spinning: a few small counter reads per 50 ms nap
    assert np.all(parks["cpu_seconds"][sel] < 0.2 * parks["parked_seconds"][sel] + 0.05), parks
    _no_fragment_while_parked(h5)
    # rounds 1-9 hold one actor's share of the data (300 each), plus at most one 900-step batch taken before
    assert rounds["env_steps"][1:10].sum() <= 900 + 8 * 300


@pytest.mark.slow
def test_bench_compare_runs_both_arms_for_the_same_rounds_and_prices_them(capsys, tmp_path):
    from hpcrl.bench import marless

    over = [*SMALL, "algo.sharing_window=3", "algo.actor_scaling_window=3", "algo.sharing_samples_per_agent=24", "algo.sharing_lanczos_steps=6"]
    assert marless.main(["--compare", "--algos", "ippo", "--seeds", "1", "--rounds", "2", "--out", str(tmp_path),
                         *_args(over)]) == 0
    lines = capsys.readouterr().out.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("over seeds"))
    runs = [line.split() for line in lines[:end] if line.startswith("ippo ")]
    assert [(r[1], r[3]) for r in runs] == [("off", "2"), ("on", "2")]  # arm, rounds
    assert all(float(r[8]) > 0 for r in runs)  # learner + actor serverless cost
    summary = {line.split()[1]: line.split() for line in lines[end:] if line.startswith("ippo ")}
    assert float(summary["off"][-1]) == 1.0
    assert float(summary["on"][-1]) == pytest.approx(float(runs[1][8]) / float(runs[0][8]), rel=2e-2)


class _Mapped:
    def __init__(self, mapping):
        self.map = mapping

    def mapping(self):
        import torch

        return torch.tensor(self.map)


def test_parameter_scaling_rows_follow_the_policies_in_use_and_eq2(monkeypatch):
    """Scripted convexity ratios through ParameterScaling.end_round: 6 actor ranks, 6 agents (I_min 1, I_max 6,
    beta 0.5: threshold 2.5); per-policy windows of 3 rounds; a merged policy leaves the scaler."""
    from hpcrl.marl.scaling_rank import ParameterScaling

    cfg = build_config({"env": {"id": "hpcrl/MPESimpleSpread-v3", "kwargs": {"N": 6}},
                        "algo": {"name": "ippo", "agents": 6, "actor_scaling": True, "actor_scaling_window": 3}}).algo
    ratios = iter([{0: 1.0, 1: 5.0}, {0: 3.0, 1: 4.0}, {0: 2.0, 1: 9.0}, {0: 4.0}])
    scaling = ParameterScaling(cfg, loss=None)
    current = {}
    monkeypatch.setattr(scaling, "convexity", lambda model, report, slot: current[slot])

    def round_(k, mapping, active, report=True):
        if report:
            current.update(next(ratios))
        return scaling.end_round(_Mapped(mapping), {"round": k, "reports": [{}] if report else [],
                                                     "actors": {"count": 6, "active": active}})

    assert round_(0, [0, 0, 0, 1, 1, 1], 6, report=False) == 6  # no report yet: unchanged
    assert round_(1, [0, 0, 0, 1, 1, 1], 6) == 6  # windows of one value: S = 1, I^j = 6
    # policy 0: [1, 3] -> S = 0 -> I = 1; policy 1: [5, 4] -> S = 1 -> 6; average 3.5 >= 2.5: max
    assert round_(2, [0, 0, 0, 1, 1, 1], 6) == 6
    # policy 0: [1, 3, 2] -> S = 0.5 -> 3; policy 1: [5, 4, 9] -> S = 0 -> 1; average 2 < 2.5: average, 2
    assert round_(3, [0, 0, 0, 1, 1, 1], 6) == 2
    # policy 1 merged into 0: [3, 2, 4] -> S = 0 -> I_min = 1
    assert round_(4, [0] * 6, 2) == 1
    rows = scaling.records()["actor_scaling"]
    assert [r["active"] for r in rows] == [6, 6, 6, 2, 1] and [r["changed"] for r in rows] == [0, 0, 0, 1, 1]
    assert [r["demanded"] for r in rows] == [-1, 6, 6, 2, 1] and [r["policies"] for r in rows] == [2, 2, 2, 2, 1]
    assert ": max" in rows[2]["reason"] and ": average" in rows[3]["reason"] and "I=[1,6]" in rows[3]["reason"]
    assert rows[3]["policy_demands"].startswith("0:3.00(C=2)") and set(scaling.scaler.windows) == {0}
    assert scaling.records() == {}
