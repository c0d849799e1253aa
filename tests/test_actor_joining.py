"""actors.elastic=steps: an actor's sampler (its environments and forward passes) joins the running job while the
actor is active and leaves when it parks (runtime/roles/joining_sampler.py); the actor's own rank keeps its loop,
its sends and its trajectory file, so every fragment is sent and written once whichever rank sampled it.

On one machine each join is a second ``mpiexec``; test_joining_cluster.py starts them as Slurm job steps and jobs.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from hpcrl.config import ConfigError, build_config
from hpcrl.io import read_table, read_trajectories
from hpcrl.io.schema import ELASTIC_ACTIONS, ELASTIC_REASONS, GRADIENT_REASONS
from test_joining import run_killing_the_joined

T, N = 32, 2  # fragment length, environments per actor


def actors_config(run_dir, rounds: int, **actors) -> dict:
    return {
        "name": "actor-joining",
        "env": {"id": "CartPole-v1", "num_envs": N},
        "actors": {"count": 2, "fragment_length": T, "elastic": "steps", **actors},
        "algo": {"name": "ppo", "train_batch_size": 256, "minibatch_size": 64, "num_sgd_iter": 2},
        "stop": {"total_env_steps": 10_000_000, "target_return": None, "max_rounds": rounds},
        "io": {"run_dir": str(run_dir), "flush_seconds": 0.5, "checkpoint_every": 1000},
        "launch": {"timeout_seconds": 240},
    }


def run(tmp_path, data: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return subprocess.run([sys.executable, "-m", "hpcrl", "run", "-q", str(path)], capture_output=True, text=True,
                          timeout=240)


def joins(h5) -> dict[int, list[tuple[str, str]]]:
    """actor -> its actor_joins rows (action, reason) in time order."""
    t = read_table(h5, "actor_joins")
    out: dict[int, list[tuple[str, str]]] = {}
    for i in np.argsort(t["time"], kind="stable"):
        out.setdefault(int(t["actor"][i]), []).append((ELASTIC_ACTIONS[t["action"][i]], ELASTIC_REASONS[t["reason"][i]]))
    return out


def assert_each_fragment_once(run_dir) -> None:
    """Every actor's fragments are numbered 0 .. n-1 in the record, and its trajectory file holds exactly them."""
    frags = read_table(run_dir / "run.h5", "actors")
    view = read_trajectories(run_dir / "run.h5", ["policy_version"])["policy_version"]
    for a in (0, 1):
        mine = frags["fragment"][frags["actor"] == a]
        assert len(mine) and np.array_equal(mine, np.arange(len(mine))), (a, mine)
        assert int((view[a] >= 0).sum()) == len(mine) * T * N, (a, len(mine))


def test_joining_actors_need_the_mpi_runner_and_a_launcher_that_can_add_ranks(tmp_path):
    cfg = build_config(actors_config(tmp_path, 4))
    assert cfg.num_ranks == 1 + 1 + 2  # the actors' own ranks stay in the launch: they keep the loop
    serial = actors_config(tmp_path, 4)
    serial["launch"]["runner"] = "serial"
    with pytest.raises(ConfigError, match="actors.elastic=steps needs launch.runner=mpi"):
        build_config(serial)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "HPCRL_SITE"))}
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", "-o", "actors.elastic=jobs", "-o",
                          f"io.run_dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2 and not (tmp_path / "run").exists()
    assert res.stderr.strip().splitlines()[-1].startswith("hpcrl run: error: actors.elastic=jobs: joining ranks are "
                                                          "submitted as batch jobs (sbatch, qsub)")


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.alone
def test_a_parked_actor_s_sampler_leaves_and_a_new_one_joins_when_it_is_woken(tmp_path):
    run_dir = tmp_path / "run"
    data = actors_config(run_dir, 15)
    # actor 1 parked in rounds 1-3, active in 4-11, parked from 12; rounds of about a second (slowed learners)
    # leave the active window time for a join (3-5 s when the tests run one at a time); a parked sampler leaves
    # within 2 s (the first window needs no join: both actors join before round 0 ends)
    data["debug"] = {"active_actors": [1] * 4 + [2] * 8 + [1], "learner_delay_seconds": 0.1}
    res = run(tmp_path, data)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = joins(run_dir / "run.h5")
    # active at the start: joined; parked: left (its step ended with exit 0); woken: a new one joined; parked: left
    assert got[1] == [("joined", "job_step"), ("left", "job_step")] * 2, got
    assert got[0] == [("joined", "job_step"), ("left", "job_step")], got  # joined at the start, left at the end
    parks = read_table(run_dir / "run.h5", "actor_parks")
    assert list(parks["actor"]) == [1, 1], parks
    assert sorted(p.name for p in (run_dir / "joins").glob("*.log")) == ["actor-0-0.log", "actor-1-0.log",
                                                                         "actor-1-1.log"]
    assert_each_fragment_once(run_dir)
    grads = read_table(run_dir / "run.h5", "gradients")
    # every push admitted but those still queued when the run stops: at most the group's 2 mailbox slots
    refused = np.asarray(grads["reason"])[np.asarray(grads["admitted"]) == 0]
    assert len(grads["seq"]) > 2 and len(refused) <= 2, refused
    assert all(GRADIENT_REASONS[r] == "shutdown" for r in refused), refused


@pytest.mark.mpi
@pytest.mark.slow
def test_a_park_shorter_than_keep_sampler_seconds_keeps_the_sampler(tmp_path):
    run_dir = tmp_path / "run"
    data = actors_config(run_dir, 17, keep_sampler_seconds=60.0)  # longer than the whole run
    # actor 1 active in rounds 0-9, parked in 10-12, active again. Each actor's first fragment waits for its join;
    # both start at once and ended within 0.5 s of each other in loaded runs: rounds 1-9 (about half a second each)
    # are for an actor 1 that joins later than actor 0
    data["debug"] = {"active_actors": [2] * 10 + [1] * 3 + [2], "learner_delay_seconds": 0.05}
    res = run(tmp_path, data)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = joins(run_dir / "run.h5")
    # one sampler each, for the whole run: actor 1's park did not release its sampler
    assert got == {0: [("joined", "job_step"), ("left", "job_step")], 1: [("joined", "job_step"), ("left", "job_step")]}
    parks = read_table(run_dir / "run.h5", "actor_parks")
    assert list(parks["actor"]) == [1], parks
    assert_each_fragment_once(run_dir)


@pytest.mark.mpi
@pytest.mark.slow
def test_samplers_that_do_not_connect_in_time_are_given_up_and_the_actors_sample_themselves(tmp_path):
    run_dir = tmp_path / "run"
    # no Python starts that fast. On-policy, so a batch waits for both actors' shares: actor 0 cannot sample every
    # fragment while actor 1 is still ending its given-up launch (a CI run saw actor 1 sample none)
    res = run(tmp_path, actors_config(run_dir, 3, join_timeout_seconds=0.05, on_policy=True))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "actor 1: its sampler did not connect within actors.join_timeout_seconds=0.05" in res.stdout + res.stderr
    got = joins(run_dir / "run.h5")
    assert got == {0: [("join_given_up", "join_timeout")], 1: [("join_given_up", "join_timeout")]}, got
    assert_each_fragment_once(run_dir)


@pytest.mark.mpi
@pytest.mark.slow
def test_a_joined_sampler_killed_mid_run_is_dropped_and_its_actor_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    data = actors_config(run_dir, None)
    data["stop"]["total_env_steps"] = 10_000
    code, out = run_killing_the_joined(tmp_path, data, run_dir / "joins" / "actor-0-0.ready", 1.0)  # sampling by then
    assert code == 0, out[-3000:]
    assert "actor 0: its joined sampler ended" in out
    got = joins(run_dir / "run.h5")
    assert got[0] == [("joined", "job_step"), ("left", "join_ended")], got
    assert_each_fragment_once(run_dir)  # the fragment it was sampling was sampled again by the actor: once
