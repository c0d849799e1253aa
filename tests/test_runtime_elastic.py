"""Elastic learner groups: the rule, and runs where a backlog appears (slow learners) and goes away.

``debug.learner_delay_seconds`` makes every gradient slow for the first seconds of the run, so
fragments pile up behind the one active group: a second group must be activated. When the
delay ends the groups are fast and the backlog is gone: one must be parked. A parked group must
block: the CPU it used while parked, as it reports it, stays a small fraction of the park.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml

from hpcrl.config import build_config
from hpcrl.io import read_table
from hpcrl.io.schema import ELASTIC_ACTIONS, ELASTIC_REASONS
from hpcrl.runtime.roles.elastic import ElasticRule
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import serial
from test_runtime_profile import check_profile

ACT, PARK, PARKED = (ELASTIC_ACTIONS.index(a) for a in ("activate", "park", "parked"))
SPARE = ELASTIC_REASONS.index("supply_below_capacity")
DELAY_UNTIL = 3.0

ELASTIC = {
    "name": "elastic",
    # one env per actor: once the delay ends, the actors supply less than one group trains (two envs
    # each did until the actors' step stopped building a distribution object: then they out-sampled
    # a group under the serial runner, and no park came within the run)
    "env": {"id": "CartPole-v1", "num_envs": 1},
    "actors": {"count": 2, "fragment_length": 32},
    "learners": {"groups": 2, "ranks_per_group": 1, "min_active": 1, "elastic_seconds": 1.0},
    # large minibatches: once the delay ends one group trains faster than the actors sample
    "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 64, "num_sgd_iter": 1},
    # the activation comes during the delay, a window (elastic_seconds) or two after the start
    "stop": {"total_env_steps": 10_000_000, "max_wall_seconds": DELAY_UNTIL + 2.0},
    "io": {"flush_seconds": 0.5, "checkpoint_every": 1000},
    "debug": {"learner_delay_seconds": 0.2, "learner_delay_until_seconds": DELAY_UNTIL},
    "launch": {"runner": "serial", "timeout_seconds": 120},
}


def config(run_dir, runner: str) -> dict:
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in ELASTIC.items()}
    data["io"]["run_dir"] = str(run_dir)
    data["launch"]["runner"] = runner
    return data


def feed(rule: ElasticRule, t0: float, t1: float, supply: float, capacity: float) -> None:
    """One actor sampling at ``supply`` steps/s, gradients of 32 steps at ``capacity`` steps/s, every 0.1 s."""
    for t in np.arange(t0, t1, 0.1):
        rule.fragment(0, 320, 320 / supply)
        rule.gradient(t, 32, 32 / capacity)


def test_rule_activates_on_excess_supply_parks_on_spare_capacity_and_holds_in_between():
    rule = ElasticRule(lo=1, hi=3, headroom=0.2, window=1.0)
    feed(rule, 0.0, 1.5, supply=1000, capacity=400)
    assert rule.decide(1.5, active=1, waiting=0) is None  # nothing waits: no activation
    d = rule.decide(1.5, active=1, waiting=2)
    assert (d.action, d.active, d.reason) == ("activate", 2, "supply_above_capacity") and d.load == pytest.approx(2.5)
    feed(rule, 1.5, 2.0, supply=1000, capacity=400)
    assert rule.decide(2.0, active=2, waiting=4) is None  # a whole window of new measurements first
    feed(rule, 2.0, 3.0, supply=1000, capacity=400)
    assert rule.decide(3.0, active=2, waiting=4).active == 3  # load 1.25 > 1.2
    feed(rule, 3.0, 5.0, supply=1000, capacity=400)
    assert rule.decide(5.0, active=3, waiting=6) is None  # at hi; two groups would be at 1.25: no park
    feed(rule, 5.0, 8.0, supply=150, capacity=400)  # supply drops (the actor's average follows)
    d = rule.decide(8.0, active=3, waiting=0)
    assert (d.action, d.active, d.reason) == ("park", 2, "supply_below_capacity")
    feed(rule, 8.0, 9.5, supply=350, capacity=400)  # one group would run at 0.875 >= 0.8: stay
    assert rule.decide(9.5, active=2, waiting=0) is None


def check_elastic(h5, parked_rows: bool = True, parks_again: bool = False) -> None:
    """The activation under the backlog; (``parked_rows``) the parked group's rows and every update's count of
    active groups; (``parks_again``) the group parked again once the delay is over (the serial run: there a
    group's busy time is its thread's CPU time, so its capacity leaves out the waits for the interpreter lock,
    which in wall seconds kept it below the actors' rate on a loaded machine)."""
    ev = read_table(h5, "elastic_events")
    act = (ev["action"] == ACT) & (ev["group"] == 1)
    assert act.any(), f"no second group activated under the backlog: {ev}"
    if parks_again:
        park = (ev["action"] == PARK) & (ev["group"] == 1)
        assert (park & (ev["time"] > ev["time"][act].min())).any(), f"group 1 was never parked after the backlog: {ev}"
        assert (ev["time"][park] > DELAY_UNTIL).all() and (ev["reason"][park] == SPARE).all()
    assert ev["reason"][act][0] == ELASTIC_REASONS.index("supply_above_capacity")
    assert (ev["load"][act] > 1.2).all() and (ev["fragments_waiting"][act] >= 1).all()
    grads = read_table(h5, "gradients")
    assert (grads["group"] == 1).any()  # the activated group trained
    if not parked_rows:
        return
    parks = ev["action"] == PARKED
    assert parks.any() and (ev["parked_seconds"][parks] > 0).all()
    assert (ev["cpu_seconds"][parks] <= 0.05 * ev["parked_seconds"][parks] + 0.02).all(), "a parked group spins"
    # every update records the groups active when it was applied: the state after the newest
    # activate / park decision before it (how many updates follow the park depends on the load)
    up = read_table(h5, "updates")
    decisions = (ev["action"] == ACT) | (ev["action"] == PARK)
    times, active = ev["time"][decisions], ev["active_groups"][decisions]
    before = np.searchsorted(times, up["time"], side="right") - 1
    expected = np.where(before >= 0, active[np.maximum(before, 0)], 1)
    assert up["active_groups"].max() == 2 and (up["active_groups"] == expected).all()


@pytest.mark.slow
def test_serial_run_activates_a_group_under_a_backlog_parks_it_after_and_profiles(tmp_path):
    run_dir = tmp_path / "run"
    data = config(run_dir, "serial")
    data["stop"]["max_wall_seconds"] = DELAY_UNTIL + 5.0  # the park comes 2-3 s after the delay ends (two windows)
    result = serial.run(make_plan(build_config(data)), run_dir, progress="plain")
    assert result.stop_reason.startswith("stop.")
    check_elastic(run_dir / "run.h5", parks_again=True)
    check_profile(run_dir / "run.h5")


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.alone
def test_mpi_run_activates_and_parks_and_profiles_every_gradient(tmp_path):
    run_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    data = config(run_dir, "mpi")
    data["stop"]["max_wall_seconds"] = DELAY_UNTIL + 3.0  # the activation is checked, not the park after the delay
    path.write_text(yaml.safe_dump(data))
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", str(path)], capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # the park after the delay and the parked rows are checked under the serial runner: with a process per rank on
    # two shared cores the actors' rate after the delay is not reliably below one group's capacity
    check_elastic(run_dir / "run.h5", parked_rows=False)
    check_profile(run_dir / "run.h5")
