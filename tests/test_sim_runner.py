"""launch.runner: sim: the job's roles in virtual time on a cluster profile (docs/sim.md).

The same config, profile and seed give the same record, bit for bit; with sync admission and on-policy batches
(where which data makes which update does not depend on timing) the simulated job's episodes, gradients and final
weights are the serial runner's exactly; the record's times are virtual and what simulating took is kept apart;
a profile that is unknown, too small or has no cost for the env is one line, exit 2, nothing written.
"""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcrl.cli import main as cli_main
from hpcrl.cluster_profiles import ProfileError, load_profile, place, shipped
from hpcrl.config import build_config
from hpcrl.io import read_attrs, read_table
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import serial, sim

SMALL = {
    "name": "sim-small",
    "env": {"id": "CartPole-v1", "num_envs": 4},
    "actors": {"count": 2, "fragment_length": 16},
    "learners": {"groups": 1, "ranks_per_group": 1},
    "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 64, "num_sgd_iter": 2},
    "stop": {"total_env_steps": 100_000, "max_rounds": 4},
    "io": {"tensorboard": False},
    "launch": {"runner": "sim"},
}


def config(run_dir: Path, **sections):
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in SMALL.items()}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    data["io"]["run_dir"] = str(run_dir)
    return build_config(data)


def datasets(path: Path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r", locking=False) as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.names:
        return a.dtype == b.dtype and all(same(a[n], b[n]) for n in a.dtype.names)
    if a.dtype.kind == "f":
        return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    return a.shape == b.shape and np.array_equal(a, b)


REAL = ("sim_real_seconds", "sim_setup_seconds", "sim_cpu_seconds", "sim_max_rss_bytes", "sim_ran_at_unix", "sim_host_pid")
"""run.h5 attributes about the real run of a simulation (kept apart from the record's virtual times)."""


def test_the_same_config_profile_and_seed_give_the_same_record(tmp_path):
    cfg = config(tmp_path / "a", aggregation={"policy": "stellaris"}, stop={"max_rounds": 2})
    plan = make_plan(cfg)
    for name in ("a", "b"):
        result = sim.run(plan, tmp_path / name)
        assert result.stop_reason.startswith("stop.max_rounds"), result.message
    a, b = datasets(tmp_path / "a" / "run.h5"), datasets(tmp_path / "b" / "run.h5")
    assert a.keys() == b.keys() and len(a) > 50
    assert [k for k in a if not same(a[k], b[k])] == []
    attrs_a, attrs_b = read_attrs(tmp_path / "a" / "run.h5"), read_attrs(tmp_path / "b" / "run.h5")
    assert [k for k in attrs_a if k not in REAL and str(attrs_a[k]) != str(attrs_b[k])] == []
    for name in ("a", "b"):  # and the trajectories
        for path in sorted((tmp_path / name / "traj").glob("*.h5")):
            other = tmp_path / ("b" if name == "a" else "a") / "traj" / path.name
            ta, tb = datasets(path), datasets(other)
            assert [k for k in ta if not same(ta[k], tb[k])] == []


def test_sync_on_policy_reproduces_the_serial_runners_record_exactly(tmp_path):
    """Which fragments make which batch and which weights sample them is fixed under sync admission with on-policy
    batches: the simulated job computes exactly what the serial runner's threads compute."""
    common = {"aggregation": {"policy": "sync"}, "actors": {"on_policy": True}}
    runs = {}
    for runner in ("serial", "sim"):
        run_dir = tmp_path / runner
        cfg = config(run_dir, launch={"runner": runner}, **common)
        result = (serial if runner == "serial" else sim).run(make_plan(cfg), run_dir)
        assert result.stop_reason.startswith("stop.max_rounds"), result.message
        h5 = run_dir / "run.h5"
        episodes = read_table(h5, "episodes")
        gradients = read_table(h5, "gradients")
        runs[runner] = {
            "episodes": sorted(zip(*(np.asarray(episodes[k]).tolist()
                                     for k in ("actor", "env_index", "return", "length", "policy_version")))),
            "gradients": [np.asarray(gradients[k]) for k in ("group", "seq", "base_version", "loss", "admitted")],
            "params": torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["params"]}
    s, v = runs["serial"], runs["sim"]
    assert len(s["episodes"]) > 10 and s["episodes"] == v["episodes"]
    assert all(np.array_equal(x, y) for x, y in zip(s["gradients"], v["gradients"]))
    assert torch.equal(s["params"], v["params"])


def test_the_record_holds_virtual_seconds_and_the_real_ones_apart(tmp_path):
    run_dir = tmp_path / "run"
    cfg = config(run_dir, launch={"runner": "sim", "profile": "stellaris-hpc"}, actors={"count": 8})
    result = sim.run(make_plan(cfg), run_dir)
    assert result.stop_reason.startswith("stop.max_rounds")
    attrs = read_attrs(run_dir / "run.h5")
    assert attrs["runner"] == "sim" and attrs["sim_profile"] == "stellaris-hpc"
    assert attrs["created"].startswith("2026-01-01T00:00:00")  # virtual second 0
    virtual = float(attrs["sim_virtual_seconds"])
    assert virtual > 0 and float(attrs["sim_real_seconds"]) > 0
    updates = read_table(run_dir / "run.h5", "updates")
    assert 0 < updates["time"][-1] <= virtual
    nodes = read_table(run_dir / "run.h5", "rank_map")["node"]
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in nodes]
    assert names[0].startswith("p3.16xlarge") and names[-1].startswith("hpc7a.96xlarge")  # actors on CPU nodes
    # what hpcrl bench sim-vs-real reads of a record, and its errors of a run against itself: none
    from hpcrl.bench.sim_vs_real import compare, measures

    got = measures(run_dir, skip=0.2)
    assert got["env_steps_per_s"] > 0 and got["pushes_per_s"] > 0 and 0 < got["admitted_share"] <= 1
    assert all(v == 0 for v in compare(got, got).values())


def test_every_shipped_profile_loads_says_its_sources_and_holds_the_default_job():
    assert {"this-machine", "perlmutter", "polaris", "stellaris-hpc", "marless"} <= set(shipped())
    for name in shipped():
        profile = load_profile(name)
        assert profile.sources and profile.description
        slots = place(profile, 1, 2, "CartPole-v1")
        assert len(slots) == 4
    testbed = load_profile("stellaris-hpc")  # the paper's: 16 V100, 960 actor cores
    assert sum(k.count * k.gpus for k in testbed.nodes) == 16
    assert sum(k.count * k.cores for k in testbed.nodes if not k.gpus) == 960
    assert sum(k.count * k.cores for k in load_profile("marless").nodes) == 1920
    with pytest.raises(ProfileError, match="learner ranks, one a GPU"):
        place(testbed, 17, 10, "CartPole-v1")


@pytest.mark.parametrize("overrides, says", [
    (["launch.profile=nonesuch"], "no such cluster profile"),
    (["launch.profile=marless", "actors.count=2000"], "cannot hold"),
    (["env.id=Acrobot-v1"], "no costs.env_step for env 'Acrobot-v1'"),
    (["learners.ranks_per_group=2", "algo.minibatch_size=128"], "learners.ranks_per_group"),
    (["launch.sim_actors=node", "actors.on_policy=true"], "does not simulate actors.on_policy=true"),
    (["launch.sim_actors=node", "actors.weight_sync=aaps"], "does not simulate actors.weight_sync=aaps"),
])
def test_a_profile_that_cannot_run_the_job_is_one_line_and_nothing_is_written(tmp_path, capsys, overrides, says):
    run_dir = tmp_path / "run"
    args = ["run", "-o", "launch.runner=sim", "-o", f"io.run_dir={run_dir}"]
    for o in overrides:
        args += ["-o", o]
    rc = cli_main(args)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and says in err, err
    assert not run_dir.exists()


def test_hpcrl_profiles_lists_them_and_shows_one_with_its_sources(capsys):
    assert cli_main(["profiles"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in shipped())
    assert cli_main(["profiles", "stellaris-hpc"]) == 0
    shown = capsys.readouterr().out
    assert "2 x p3.16xlarge (64 cores, 8 GPUs)" in shown and "source     nodes: Stellaris" in shown
    assert cli_main(["profiles", "nonesuch"]) == 2
    assert "no such cluster profile" in capsys.readouterr().err


def test_the_benches_profiles_load_and_hold_their_jobs(tmp_path):
    """sim-scale's Perlmutter with 64 actors per CPU node, and sim-vs-real's profile with a case's CPU costs
    measured now."""
    from hpcrl.bench.sim_scale import profile_for
    from hpcrl.bench.sim_vs_real import measured_profile

    scaled = load_profile(str(profile_for(64, tmp_path)))
    assert {k.name: k.cores for k in scaled.nodes} == {"gpu": 64, "cpu": 64}
    slots = place(scaled, 128, 2048, "CartPole-v1")  # the 64-node job: 32 GPU nodes x 4, 32 CPU nodes x 64
    assert len({s.node for s in slots}) == 64
    slow = load_profile(str(profile_for(64, tmp_path, {"slow_share": 0.25, "slow_factor": 2.0, "sigma": 0.1})))
    assert (slow.stragglers.slow_share, slow.stragglers.slow_factor, slow.stragglers.sigma) == (0.25, 2.0, 0.1)
    assert slow.name != scaled.name and scaled.stragglers.slow_share == 0
    measured = load_profile(str(measured_profile("two-groups", "this-machine", tmp_path, [], seconds=0.05)))
    assert measured.costs.gradient.per_sample_float == 0 and measured.costs.gradient.fixed > 0
    assert measured.costs.env_step["CartPole-v1"] > 0 and "measured right before" in " ".join(measured.sources.values())


@pytest.mark.parametrize("value", ["0.1", "2,1", "0.1,0.5", "0.1,2,-1", "a,b"])
def test_sim_scale_refuses_stragglers_it_cannot_make_in_one_line(value, capsys):
    from hpcrl.bench.sim_scale import main

    with pytest.raises(SystemExit) as ended:
        main(["--stragglers", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and f"--stragglers {value!r}: SHARE,FACTOR[,SIGMA]" in err[-1]


def test_a_nodes_actor_ranks_as_one_role_send_as_the_ranks_would(tmp_path):
    """launch.sim_actors=node: each node's actor ranks run in lockstep in one role (one batched sampler), yet every
    rank sends its own fragments (numbered 0, 1, ... per actor), its episodes are its own, the learners drain them
    all, no trajectory file is written; and the job's rates and staleness stay close to the rank-by-rank
    simulation's (both deterministic)."""
    from hpcrl.bench.sim_scale import profile_for
    from hpcrl.bench.sim_vs_real import measures

    profile = str(profile_for(4, tmp_path))  # CPU nodes of 4 actor ranks
    got = {}
    for mode in ("rank", "node"):
        # 40 rounds (15 fragments per actor), not max_wall_seconds: the parameter role checks the wall clock every
        # 0.5 virtual seconds (190 rounds here); the rates of 40 rounds agree within 2 %, staleness within 0.05
        cfg = config(tmp_path / mode, actors={"count": 8}, learners={"groups": 2, "min_active": 2},
                     algo={"train_batch_size": 256}, stop={"max_rounds": 40},
                     launch={"profile": profile, "sim_actors": mode})
        result = sim.run(make_plan(cfg), tmp_path / mode)
        assert result.stop_reason.startswith("stop.max_rounds"), result.message
        got[mode] = measures(tmp_path / mode, skip=0.2)
        frags = read_table(tmp_path / mode / "run.h5", "actors", ["actor", "fragment"])
        for a in range(8):
            numbers = frags["fragment"][frags["actor"] == a]
            assert len(numbers) > 2 and list(numbers) == list(range(len(numbers))), (mode, a)
        episodes = read_table(tmp_path / mode / "run.h5", "episodes", ["actor", "env_index"])
        assert set(episodes["actor"].tolist()) == set(range(8)) and episodes["env_index"].max() < 4
    assert not list((tmp_path / "node" / "traj").glob("*.h5")) and len(list((tmp_path / "rank" / "traj").glob("*.h5"))) == 8
    for measure in ("env_steps_per_s", "pushes_per_s"):
        assert got["node"][measure] == pytest.approx(got["rank"][measure], rel=0.1), measure
    assert abs(got["node"]["staleness_mean"] - got["rank"]["staleness_mean"]) < 1.0


def test_node_actors_are_for_the_sim_and_cannot_be_resumed(tmp_path, capsys):
    with pytest.raises(ValueError, match="launch.sim_actors=node needs launch.runner=sim"):
        config(tmp_path, launch={"runner": "serial", "sim_actors": "node"})
    run_dir = tmp_path / "run"
    args = ["run", "-o", "launch.runner=sim", "-o", "launch.sim_actors=node", "-o", f"io.run_dir={run_dir}",
            "-o", "stop.max_rounds=2", "-o", "io.tensorboard=false"]
    assert cli_main(args) == 0
    capsys.readouterr()
    assert cli_main(["run", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "keeps no trajectory files to resume from" in err, err


def test_a_push_waiting_for_a_slot_tries_again_when_it_would_have_nap_by_nap(tmp_path, monkeypatch):
    """A learner waiting for a mailbox slot is woken by its group's news and sleeps on to the back-off's next tick
    (transport/sim.py ``SimMailbox._nap``): the gradients are pushed at the virtual times they were pushed when the
    learners woke at each tick. 8 groups on rank 0, which is the bound, so many pushes wait."""
    from hpcrl.bench.sim_scale import profile_for
    from hpcrl.runtime.transport.push import PushLoop
    from hpcrl.runtime.transport.sim import SimMailbox

    profile = str(profile_for(4, tmp_path))
    got = {}
    for mode in ("woken", "every-tick"):
        if mode == "every-tick":
            monkeypatch.setattr(SimMailbox, "_nap", PushLoop._nap)
        # one round: 310 pushes, 142 of them waited for a slot (max_wall_seconds ran 0.5 virtual seconds, its check's
        # period, whatever the bound)
        cfg = config(tmp_path / mode, actors={"count": 4}, learners={"groups": 8, "min_active": 8},
                     algo={"train_batch_size": 512, "minibatch_size": 16, "num_sgd_iter": 8},
                     stop={"max_rounds": 1}, launch={"profile": profile, "sim_actors": "node"})
        result = sim.run(make_plan(cfg), tmp_path / mode)
        assert result.stop_reason.startswith("stop.max_rounds"), result.message
        got[mode] = read_table(tmp_path / mode / "run.h5", "gradients",
                               ["time", "group", "seq", "base_version", "mailbox_wait_seconds"])
    waited = got["woken"]["mailbox_wait_seconds"]
    assert (waited > 0).sum() > 50  # the case the wake is for
    # the same pushes at the same virtual times; only which of two groups tied at one instant goes first may differ
    # (SimPy runs events of one time in the order they were scheduled, and a woken learner schedules its wake later)
    key = lambda rows: sorted(zip(*(rows[k].tolist() for k in ("time", "seq", "base_version"))))
    assert key(got["woken"]) == key(got["every-tick"])
    per_group = lambda rows: np.bincount(rows["group"], minlength=8).tolist()
    assert per_group(got["woken"]) == per_group(got["every-tick"])


def test_an_actor_waiting_for_room_looks_again_when_it_would_have_nap_by_nap(tmp_path, monkeypatch):
    """An actor waiting for room to send naps through the ticks at which nothing it looks at changed
    (transport/sim.py ``ActorNap``): the record is the one of an actor that looked at every tick, to the bit. 8
    actors on one learner, so they wait on its backlog most of the time; off-policy and on-policy (places reserved
    per version)."""
    from hpcrl.runtime.backoff import Backoff
    from hpcrl.runtime.transport.sim import ActorNap

    for on_policy in (False, True):
        records = {}
        for mode in ("skipping", "every-tick"):
            if mode == "every-tick":
                monkeypatch.setattr(ActorNap, "sleep", Backoff.sleep)
            run_dir = tmp_path / f"{mode}-{on_policy}"
            cfg = config(run_dir, actors={"count": 8, "on_policy": on_policy}, stop={"max_rounds": 3},
                         algo={"train_batch_size": 512, "minibatch_size": 128})
            result = sim.run(make_plan(cfg), run_dir)
            assert result.stop_reason.startswith("stop.max_rounds"), result.message
            records[mode] = datasets(run_dir / "run.h5")
            monkeypatch.undo()
        skipping, every_tick = records["skipping"], records["every-tick"]
        assert skipping.keys() == every_tick.keys() and len(skipping) > 50
        assert [k for k in skipping if not same(skipping[k], every_tick[k])] == []
        assert (read_table(tmp_path / f"skipping-{on_policy}" / "run.h5", "actors")["transport_wait_seconds"] > 0).sum() >= 8


def test_the_node_that_holds_the_last_actor_runs_the_evaluations(tmp_path):
    """launch.sim_actors=node with eval.episodes: the last actor rank's node plays the evaluation episodes after
    each round, as that actor rank would (run.h5 eval_episodes)."""
    from hpcrl.bench.sim_scale import profile_for

    cfg = config(tmp_path / "run", actors={"count": 8}, eval={"episodes": 2, "every_rounds": 1},
                 stop={"max_rounds": 8}, launch={"profile": str(profile_for(4, tmp_path)), "sim_actors": "node"})
    result = sim.run(make_plan(cfg), tmp_path / "run")
    assert result.stop_reason.startswith("stop.max_rounds"), result.message
    ev = read_table(tmp_path / "run" / "run.h5", "eval_episodes", ["round", "env_index", "length", "policy_version"])
    assert len(ev["round"]) >= 4 and set(ev["env_index"].tolist()) == {0, 1} and ev["round"].min() >= 1
    assert (ev["length"] > 0).all() and ev["policy_version"].max() > 0


@pytest.mark.parametrize("name,rows", [("mpe_spread_ippo.yaml", 1200), ("mpe_spread_iql.yaml", 128 * 6),
                                       ("mpe_spread_vdn.yaml", 128 * 6)])
def test_every_marl_learner_runs_on_the_marless_profile_priced_by_its_own_minibatch(tmp_path, name, rows):
    """The virtual-time runner prices a gradient by the rows it is computed over (AlgoSection.gradient_rows): a
    PPO minibatch's agent steps; a replay minibatch's joint transitions x agents (value-based learners have no
    train_batch_size)."""
    from hpcrl.config import load_config

    run_dir = tmp_path / "run"
    cfg = load_config(str(Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / name),
                      ["launch.runner=sim", "launch.profile=marless", "actors.count=2", "stop.max_rounds=2",
                       "io.tensorboard=false", f"io.run_dir={run_dir}"])
    plan = make_plan(cfg)
    assert cfg.algo.gradient_rows(plan.fragment_steps) == rows
    result = sim.run(plan, run_dir)
    assert result.stop_reason.startswith("stop.max_rounds"), result.message
    assert len(read_table(run_dir / "run.h5", "gradients", ["seq"])["seq"]) > 0


def test_the_wall_clock_limit_is_checked_each_turn_not_each_half_second(tmp_path):
    """stop.max_wall_seconds is looked at on every turn of rank 0 (the other stop rules every 0.5 s), so a job in
    virtual time told to run 0.6 s stops then, not at rank 0's next half-second check (1.0 s)."""
    run_dir = tmp_path / "run"
    cfg = config(run_dir, stop={"max_rounds": None, "max_wall_seconds": 0.6}, launch={"profile": "stellaris-hpc"},
                 actors={"count": 8})
    result = sim.run(make_plan(cfg), run_dir)
    assert result.stop_reason.startswith("stop.max_wall_seconds"), result.stop_reason
    assert read_table(run_dir / "run.h5", "updates", ["time"])["time"][-1] < 0.61
    assert float(read_attrs(run_dir / "run.h5")["sim_virtual_seconds"]) < 0.7
