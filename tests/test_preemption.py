"""actors.sync_frac: DD-PPO's preemption threshold on on-policy places (hpcrl/runtime/roles/preemption.py).

A group's backlog takes ceil(places / sync_frac) reservations a round, the group trains on the first fragments to
arrive and closes the round (its word at twice the reservations, freed whole by rank 0 after the publish), and the
round's other fragments are dropped, however late they come; in virtual time a slow actor then no longer holds each
batch back.
"""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpcrl.config import ConfigError, build_config
from hpcrl.io import read_table
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.roles.preemption import FirstArrivals, WholeBatches, batch_places
from hpcrl.runtime.runners import sim
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.local import LocalCounters

ROOT = Path(__file__).resolve().parents[1]
WORD = control.BACKLOG + 1  # group 1's backlog


def _fragment(version: int, actor: int = 0) -> dict:
    return {"policy_version": version, "actor": actor, "rewards": np.zeros((2, 2), np.float32)}


def _reserve(counters: LocalCounters, cap: int) -> bool:
    """An actor's reservation as actor.py makes it: add 1, take it back when the word was at the cap."""
    if counters.add(WORD, 1) < cap:
        return True
    counters.add(WORD, -1)
    return False


@pytest.mark.parametrize("reservations", [2, 3])
def test_closing_a_round_leaves_twice_the_reservations_for_rank_0_to_free(reservations):
    counters = LocalCounters(control.BACKLOG + 4, threading.Event())
    places = FirstArrivals(counters, group=1, reserved=3)
    assert [_reserve(counters, 3) for _ in range(reservations)] == [True] * reservations
    passing = reservations == 3  # a reservation that fails at the cap adds 1 before it takes it back
    if passing:
        counters.add(WORD, 1)
    held = places.close([_fragment(5), _fragment(5, 1)], [])
    if passing:
        counters.add(WORD, -1)
    assert held == 6 and counters.read(WORD) == 6
    assert not _reserve(counters, 3)  # closed: no place until rank 0 frees the batch's
    counters.add_each(control.BACKLOG + 1, [-held])  # rank 0, after the publish (freed_places.py)
    assert counters.read(WORD) == 0 and _reserve(counters, 3)


def test_the_rounds_other_fragments_are_dropped_now_and_when_they_arrive():
    counters = LocalCounters(control.BACKLOG + 4, threading.Event())
    places = FirstArrivals(counters, group=1, reserved=4)
    waiting = [_fragment(7, 2), _fragment(8, 3)]  # a spare place's fragment of this round, and a next round's
    places.close([_fragment(7), _fragment(7, 1)], waiting)
    assert [f["actor"] for f in waiting] == [3]
    late = places.arrived([_fragment(7, 4), _fragment(6, 5), _fragment(8, 6)])
    assert [f["actor"] for f in late] == [6] and places.dropped == 3


def test_a_batch_of_two_versions_is_refused():
    places = FirstArrivals(LocalCounters(control.BACKLOG + 4, threading.Event()), group=1, reserved=2)
    with pytest.raises(RuntimeError, match="versions \\[3, 4\\]"):
        places.close([_fragment(3), _fragment(4)], [])


def test_whole_batches_hold_their_fragments_places_and_drop_nothing():
    places = batch_places(1.0, None, 0, 5)
    assert isinstance(places, WholeBatches)
    assert places.close([_fragment(1)] * 3, []) == 3 and len(places.arrived([_fragment(0)])) == 1
    assert isinstance(batch_places(0.6, LocalCounters(control.BACKLOG + 1, threading.Event()), 0, 5), FirstArrivals)


@pytest.mark.parametrize("actors, says", [
    ({"sync_frac": 0.6}, "actors.sync_frac=0.6 preempts on-policy fragments; it needs actors.on_policy=true"),
    ({"sync_frac": 0, "on_policy": True}, "sync_frac"),
    ({"sync_frac": 1.5, "on_policy": True}, "sync_frac"),
])
def test_a_threshold_it_cannot_use_is_refused(actors, says):
    with pytest.raises((ConfigError, ValueError), match=says):
        build_config({"env": {"id": "CartPole-v1"}, "actors": actors})


STRAGGLER = {
    "name": "preempt",
    "env": {"id": "CartPole-v1", "num_envs": 4},
    "actors": {"count": 4, "fragment_length": 16, "on_policy": True},
    "learners": {"groups": 2, "min_active": 2, "topology": "allreduce"},
    "aggregation": {"policy": "sync"},
    "algo": {"name": "ppo", "train_batch_size": 256, "minibatch_size": 64, "num_sgd_iter": 2},
    "stop": {"total_env_steps": 1_000_000, "max_rounds": 6},
    "io": {"tensorboard": False},
    "launch": {"runner": "sim"},
}


def _profile(tmp_path):
    """Perlmutter's profile (a core for every rank of the job) with one of the 4 actors 10 times slower."""
    from hpcrl.cluster_profiles import HERE

    data = yaml.safe_load((HERE / "perlmutter.yaml").read_text())
    data["name"], data["stragglers"] = "one-slow-actor", {"slow_share": 0.25, "slow_factor": 10.0, "sigma": 0.0}
    path = tmp_path / "one-slow-actor.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(run_dir, profile, sync_frac: float) -> tuple[float, dict]:
    """The virtual seconds of the job's 6 rounds, and its actors table."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in STRAGGLER.items()}
    data["actors"]["sync_frac"] = sync_frac
    data["io"]["run_dir"] = str(run_dir)
    data["launch"]["profile"] = str(profile)
    result = sim.run(make_plan(build_config(data)), run_dir)
    assert result.stop_reason.startswith("stop.max_rounds"), result.message
    rounds = read_table(run_dir / "run.h5", "rounds")
    return float(np.sum(rounds["duration"])), read_table(run_dir / "run.h5", "actors")


def test_a_slow_actor_holds_back_every_batch_unless_its_fragments_are_preempted(tmp_path):
    """Each group's batch is 2 fragments and each actor takes at most one place of a group a round: with every
    place's fragment trained on, every round waits for the slow actor's two. With sync_frac 0.5 a group reserves 4
    places, one per actor, and trains on its first 2 fragments, so the same 6 rounds take a fraction of the virtual
    time, and the slow actor's fragments, always late, are dropped."""
    profile = _profile(tmp_path)
    whole, whole_actors = _run(tmp_path / "whole", profile, 1.0)
    first, first_actors = _run(tmp_path / "first", profile, 0.5)
    assert first < 0.5 * whole, (first, whole)
    # every batch is of one version either way (preemption.py refuses a mixed one); the fast actors sample more
    # fragments a round once the slow one no longer paces the rounds
    per_actor = [np.bincount(np.asarray(t["actor"]), minlength=4) for t in (whole_actors, first_actors)]
    assert per_actor[1].max() > per_actor[0].max(), per_actor
    # hpcrl bench sim-scale's rates: the dropped fragments were sampled, not trained on
    from hpcrl.bench.sim_vs_real import measures

    whole_rates, first_rates = measures(tmp_path / "whole", skip=0.2), measures(tmp_path / "first", skip=0.2)
    assert first_rates["env_steps_per_s"] > 1.3 * first_rates["trained_steps_per_s"], first_rates
    assert first_rates["trained_steps_per_s"] > 2 * whole_rates["trained_steps_per_s"], (first_rates, whole_rates)


@pytest.mark.mpi
@pytest.mark.slow
def test_under_mpi_both_topologies_train_first_arrivals_and_close_every_round(tmp_path):
    """The closing adds on MPI's counter window, through one parameter rank (each group's push frees its places) and
    through the allreduce (group 0's push frees every group's): 5 rounds, no batch of two versions (preemption.py
    would end the run), and no round left closed (a word never freed would hold every actor back until the timeout)."""
    common = ["learners.groups=2", "learners.min_active=2", "aggregation.policy=sync", "learners.push=gradient",
              "env.num_envs=2", "actors.count=3", "actors.fragment_length=8", "actors.on_policy=true",
              "actors.sync_frac=0.5", "algo.train_batch_size=32", "algo.minibatch_size=16", "algo.num_sgd_iter=2",
              "stop.max_rounds=5", "io.log_seconds=60", "io.tensorboard=false", "launch.timeout_seconds=120"]
    jobs = {name: subprocess.Popen(
        [sys.executable, "-m", "hpcrl", "run", str(ROOT / "hpcrl" / "configs" / "cartpole.yaml"),
         *[a for o in [*common, *extra, f"io.run_dir={tmp_path / name}"] for a in ("-o", o)]],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for name, extra in (("server", []), ("allreduce", ["learners.topology=allreduce"]))}
    for name, proc in jobs.items():
        out, _ = proc.communicate(timeout=200)
        assert proc.returncode == 0, f"{name}:\n{out[-3000:]}"
        rounds = read_table(tmp_path / name / "run.h5", "rounds")
        assert rounds["env_steps_total"].tolist()[-1] == 160, (name, rounds["env_steps_total"])
        sampled = read_table(tmp_path / name / "run.h5", "actors")["steps"]
        assert np.sum(sampled) >= 160, name
