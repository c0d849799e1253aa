"""learners.topology=allreduce (DD-PPO's decentralised update; docs/architecture.md "The groups' own allreduce").

- the serial runner's twin averages in rank 0's order, bit for bit against ``staleness.aggregate`` of a sync step;
  the stop flag reaches every group; a call abandoned when the run stops returns None, and so does every later one;
- rank 0 takes the pushed trained values and keeps its untrained ones (PPO's KL coefficient, set by its end_round);
- a whole job, under MPI and in virtual time: two groups averaging among themselves end with the weights one
  parameter rank makes of the same two groups' gradients under sync admission, element-wise, in half the versions;
- a serial job trains every group and pushes once per batch of all;
- a resumed job goes on with each group's optimizer and minibatch order;
- bad input: one line, exit 2.
"""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcrl.cli import main as cli_main
from hpcrl.config import load_config
from hpcrl.io import read_table
from hpcrl.runtime.record.checkpoint import load_checkpoint
from hpcrl.runtime.transport.groups_allreduce import LocalGroupsAllreduce
from hpcrl.staleness import GradientRecord, aggregate

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "hpcrl" / "configs" / "cartpole.yaml")
TWO_GROUPS = ["learners.groups=2", "learners.min_active=2", "aggregation.policy=sync", "learners.push=gradient"]
SAME_DATA = [*TWO_GROUPS, "env.num_envs=2", "actors.count=1", "actors.fragment_length=8", "actors.on_policy=true",
             "algo.train_batch_size=32", "algo.minibatch_size=16", "algo.num_sgd_iter=2", "stop.max_rounds=5",
             "algo.kl_coeff=0.0", "io.log_seconds=60", "io.tensorboard=false"]
"""One actor, on-policy: each group's batch is one fragment, sampled with the weights the previous batch made, the
actor's fragments alternating between the groups; 2 passes of one minibatch per batch; 5 rounds. The KL coefficient
is off: rank 0 changes it after a round's last version is published, which reaches the groups one minibatch later
through one parameter rank and one batch later through the allreduce (docs/architecture.md)."""


def _meet(shared: LocalGroupsAllreduce, calls) -> list:
    """Each group's ``calls(handle)`` in its own thread; their results in group order."""
    out = [None] * shared.size

    def run(g: int) -> None:
        out[g] = calls(shared.for_group(g))

    threads = [threading.Thread(target=run, args=(g,)) for g in range(shared.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    return out


def test_the_local_twin_averages_as_a_sync_step_of_rank_0_does():
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(1001).astype(np.float32) for _ in range(3)]
    step = [(GradientRecord(group=g, seq=0, base_version=0, samples=1, grad=grads[g]), 1.0) for g in range(3)]
    got = _meet(LocalGroupsAllreduce(3), lambda h: (h.mean(grads[h.group], h.group == 2, lambda: False),
                                                     h.sum(np.array([h.group, 1.5]), lambda: False)))
    expected = aggregate(step)
    for (mean, stopping), sums in got:
        assert np.array_equal(mean, expected) and stopping  # group 2 was stopping: every group learns it
        assert sums.tolist() == [3.0, 4.5]


def test_a_call_abandoned_when_the_run_stops_returns_none_and_so_do_later_ones():
    shared = LocalGroupsAllreduce(2)
    alone = shared.for_group(0)
    polls = []

    def stopped() -> bool:
        polls.append(1)
        return len(polls) >= 3  # group 1 never comes; the run stops on the third look

    assert alone.mean(np.ones(4, dtype=np.float32), False, stopped) is None
    assert alone.broken and shared.for_group(1).sum(np.zeros(2), lambda: False) is None


def test_in_virtual_time_a_group_waiting_at_the_allreduce_leaves_when_the_run_stops_not_a_second_later():
    """Under MPI a waiting root looks at ``wait()`` between tests of the collective; the sim's meeting is woken by
    the STOP word too (a run that stopped at 0.5 s drained until 1.5 s: its groups waited a heartbeat's second)."""
    from hpcrl.runtime.transport import control
    from hpcrl.runtime.transport.sim import GroupNews, SimCounters, SimGroupsAllreduce
    from hpcrl.runtime.virtual_time import VirtualClock, VirtualWorld

    world = VirtualWorld()
    news = GroupNews(world)
    counters = SimCounters(control.num_counters(2, 2), world, news)
    shared = SimGroupsAllreduce(world, news, 2, lambda nbytes: 0.0)
    root, rank0 = VirtualClock(world, lambda work, count: 0.0), VirtualClock(world, lambda work, count: 0.0)
    left = {}

    def waiting():
        got = shared.for_group(0).sum(np.ones(2), lambda: bool(counters.read(control.STOP)))
        left["at"], left["got"] = root.now(), got

    def stopping():
        rank0.sleep(0.01)
        counters.set(control.STOP, 1)  # group 1 never comes to the allreduce

    world.spawn(1, "group 0's root", waiting, root, None)
    world.spawn(0, "rank 0", stopping, rank0, None)
    world.run()
    assert left["got"] is None and abs(left["at"] - 0.01) < 1e-9, left


def test_rank_0_takes_the_trained_values_and_keeps_its_own_untrained_ones():
    from hpcrl.runtime.plan import make_plan
    from hpcrl.runtime.roles.push_apply import TakeWeights
    from hpcrl.runtime.roles.sampler import describe_env
    from hpcrl.runtime.runners.job import role_parts

    cfg = load_config(CARTPOLE, ["algo.kl_coeff=0.2"])
    model = role_parts(make_plan(cfg), describe_env(cfg.env), torch.device("cpu"))[1]
    model.constants["kl_coeff"].fill_(0.05)  # end_round moved it after the groups pulled their weights
    pushed = np.random.default_rng(0).standard_normal(model.flat.num_params).astype(np.float32)
    TakeWeights(model).step(torch.from_numpy(pushed))
    kl = model.flat.slice_of(model.constants["kl_coeff"])
    trained = np.ones(model.flat.num_params, dtype=bool)
    trained[kl] = False
    assert np.array_equal(model.flat.numpy()[trained], pushed[trained])
    assert model.flat.numpy()[kl].tolist() == [np.float32(0.05)]


def _run(tmp_path: Path, name: str, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hpcrl", "run", CARTPOLE,
           *[a for o in [*SAME_DATA, *extra, f"io.run_dir={tmp_path / name}"] for a in ("-o", o)]]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.parametrize("runner", ["sim", pytest.param("mpi", marks=[pytest.mark.mpi, pytest.mark.slow])])
def test_two_groups_allreducing_make_the_weights_of_one_parameter_rank_element_wise(tmp_path, runner):
    """Under MPI, and in virtual time (the sim's twin, with the allreduce's time on the perlmutter profile's links)."""
    extra = [f"launch.runner={runner}"] + (["launch.profile=perlmutter"] if runner == "sim" else [])
    jobs = {"server": _run(tmp_path, "server", extra),
            "allreduce": _run(tmp_path, "allreduce", [*extra, "learners.topology=allreduce"])}
    for name, proc in jobs.items():  # side by side: each is mostly start-up
        out, _ = proc.communicate(timeout=150)
        assert proc.returncode == 0, f"{name}:\n{out[-3000:]}"
    server, allreduce = (load_checkpoint(tmp_path / name) for name in ("server", "allreduce"))
    assert server["version"] == 10 and allreduce["version"] == 5  # a version per step; per batch of both groups
    assert torch.equal(server["params"], allreduce["params"]), (server["params"] - allreduce["params"]).abs().max()
    pushes = read_table(tmp_path / "allreduce" / "run.h5", "gradients")
    assert pushes["group"].tolist() == [0] * 5 and pushes["staleness"].tolist() == [0] * 5
    assert read_table(tmp_path / "allreduce" / "run.h5", "rounds")["env_steps_total"].tolist() == [32, 64, 96, 128,
                                                                                                    160]
    if runner == "mpi":  # after its first batch a group reads rank 0's untrained values only (the KL coefficient)
        fetched = read_table(tmp_path / "allreduce" / "run.h5", "weight_fetches")
        per_fetch = fetched["learner_bytes"][fetched["learner_fetches"] > 0] / fetched["learner_fetches"][
            fetched["learner_fetches"] > 0]
        assert per_fetch[0] == 4 * server["params"].numel() and (per_fetch[1:] == 4).all(), per_fetch


def test_a_serial_job_trains_every_group_and_pushes_once_per_batch_of_all(tmp_path, capsys):
    """The serial runner's twin end to end (its learning is one parameter rank's: the exactness test above)."""
    code = cli_main(["run", CARTPOLE, "--runner", "serial", *[a for o in [
        *TWO_GROUPS, "algo.minibatch_size=128", "stop.max_rounds=6", "stop.target_return=null", "io.tensorboard=false",
        f"io.run_dir={tmp_path / 'run'}"] for a in ("-o", o)], "-o", "learners.topology=allreduce"])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    run_h5 = tmp_path / "run" / "run.h5"
    activity, pushes = read_table(run_h5, "learner_activity"), read_table(run_h5, "gradients")
    n = len(pushes["group"])
    for g in (0, 1):  # every batch of each group (a last one may end as rank 0 stops), one push (group 0's) per batch
        assert n <= (activity["group"] == g).sum() <= n + 1 and n >= 3
    assert set(pushes["group"].tolist()) == {0} and load_checkpoint(tmp_path / "run")["version"] == len(pushes["group"])


@pytest.mark.parametrize("args, says", [
    (["-o", "aggregation.policy=stellaris"], "aggregation.policy=stellaris admits pushes on a parameter rank"),
    (["-o", "learners.min_active=1"], "learners.min_active=1 would park groups the allreduce waits for"),
    (["-o", "actors.elastic=steps"], "ranks that join (learners.elastic, actors.elastic) are not in the allreduce"),
    (["-o", "learners.push=update"], "learners.push=update is the parameter rank's mode"),
    (["-o", "aggregation.shards=2"], "aggregation.shards=2 shards a parameter rank"),
    (["-o", "actors.weight_sync=aaps"], "actors.weight_sync=aaps probes a parameter rank's steps"),
])
def test_what_an_allreduce_cannot_have_is_one_line(args, says, capsys):
    overrides = [a for o in TWO_GROUPS if o.split("=")[0] not in " ".join(args) for a in ("-o", o)]
    code = cli_main(["run", CARTPOLE, *overrides, "-o", "algo.minibatch_size=128", "-o", "learners.topology=allreduce",
                     *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and says in err, err


def test_a_resumed_allreduce_job_goes_on_with_each_groups_optimizer_and_minibatch_order(tmp_path):
    """In virtual time (cheap, and the same schedule every time): 2 rounds, then --resume for a third. Each group's
    Adam continues (the same in both groups: they step on the same means), and so does each group's own minibatch
    generator."""
    run_dir = tmp_path / "run"
    base = ["launch.runner=sim", "launch.profile=perlmutter", *TWO_GROUPS, "algo.minibatch_size=64",
            "stop.target_return=null", "io.tensorboard=false", f"io.run_dir={run_dir}"]
    assert cli_main(["run", CARTPOLE, *[a for o in [*base, "stop.max_rounds=2"] for a in ("-o", o)],
                     "-o", "learners.topology=allreduce"]) == 0
    first = load_checkpoint(run_dir)["inner_states"]
    assert cli_main(["run", "--resume", str(run_dir), "-o", "stop.max_rounds=3"]) == 0
    second = load_checkpoint(run_dir)["inner_states"]
    per_batch = 20 * 2  # 20 passes of a fragment's 128 steps in minibatches of 64
    for g in (0, 1):
        assert _adam_steps(first[g]["optimizer"]) == 2 * per_batch
        assert _adam_steps(second[g]["optimizer"]) == 3 * per_batch  # a fresh optimizer would have taken 40
        gen = torch.Generator()
        gen.set_state(first[g]["minibatch_rng"])
        for _ in range(20):
            torch.randperm(128, generator=gen)
        assert torch.equal(gen.get_state(), second[g]["minibatch_rng"])  # its own stream went on
    assert not torch.equal(first[0]["minibatch_rng"], first[1]["minibatch_rng"])


def _adam_steps(state: dict) -> int:
    steps = {int(s["step"]) for s in state["state"].values()}
    assert len(steps) == 1
    return steps.pop()
