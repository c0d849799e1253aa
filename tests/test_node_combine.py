"""Node-level aggregation (``learners.combine: node``, hpcrl/runtime/transport/node_combine.py).

- a node's push carries every member's header and comes back as one record per member;
- ``staleness.aggregate`` sums each node's gradients first, in group order: the order the pushes arrive in changes no
  bit, and a node's combined sum makes the step of its separate pushes to the bit;
- whole jobs: in virtual time (8 groups on 2 nodes) and under MPI (3 groups on 2 "nodes": MPICH's cliques, 2
  parameter shards), with sync admission and on-policy actors, combined pushes end with the weights of separate
  pushes to one parameter rank, element-wise, and every (group, seq) once in the record;
- bad input: one line, exit 2.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcrl.cli import main as cli_main
from hpcrl.io import read_table
from hpcrl.runtime.messages import CombinedPush, PushHeader
from hpcrl.runtime.record.checkpoint import load_checkpoint
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.node_combine import push_records
from hpcrl.staleness import GradientRecord, aggregate

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "hpcrl" / "configs" / "cartpole.yaml")
STATS = len(control.GRAD_STATS)


def _header(group: int, seq: int, base: int = 3) -> PushHeader:
    return PushHeader(seq=seq, group=group, base_version=base, samples=16 + group,
                      stats=np.arange(STATS, dtype=np.float64) + 100 * group)


def test_a_nodes_push_comes_back_as_a_record_per_member_in_group_order():
    members = (_header(1, 7, 5), _header(3, 9, 4))
    packed = CombinedPush(members, 4).pack()
    assert packed.size == CombinedPush.capacity(2, STATS)
    sum_ = np.ones(6, np.float32)
    recs = push_records(PushHeader(seq=7, group=1, base_version=5, samples=0, stats=packed), sum_, True,
                        [0, 1, 0, 1], STATS, 2.5)
    assert [(r.group, r.seq, r.base_version, r.samples, r.node) for r in recs] == [(1, 7, 5, 17, 1), (3, 9, 4, 19, 1)]
    assert recs[0].grad is sum_ and recs[0].scaled_for == 4 and recs[1].grad is None and recs[1].scaled_for == 0
    assert recs[1].stats == dict(zip(control.GRAD_STATS, members[1].stats)) and recs[1].received_at == 2.5
    with pytest.raises(ValueError, match="do not hold 3 members"):
        CombinedPush.unpack(np.concatenate([[3.0], packed[1:]]), STATS)


def _grads(n: int, size: int = 257) -> list[np.ndarray]:
    rng = np.random.default_rng(5)  # magnitudes over many decades: the order of a float32 sum shows
    return [(rng.standard_normal(size) * 10.0 ** rng.integers(-6, 6, size)).astype(np.float32) for _ in range(n)]


def test_the_sum_is_each_nodes_in_group_order_whatever_the_arrival_order_and_a_combined_push_is_the_same_bits():
    grads, nodes = _grads(5), [0, 1, 0, 1, 0]
    recs = [GradientRecord(group=g, seq=0, base_version=0, samples=1, grad=grads[g], node=nodes[g]) for g in range(5)]
    step = [(r, 1.0) for r in recs]
    expected = aggregate(step)
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert np.array_equal(aggregate([step[i] for i in rng.permutation(5)]), expected)
    arrival_order = np.zeros(257, np.float32)  # the sum in arrival order, as before nodes: not always the same bits
    for g in (4, 1, 0, 3, 2):
        arrival_order += np.float32(1 / 5) * grads[g]
    assert not np.array_equal(arrival_order, expected)
    scale = np.float32(1 / 5)
    combined = []
    for node in (1, 0):  # what each node's pusher sends: its groups' scaled gradients summed in group order from 0
        members = [g for g in range(5) if nodes[g] == node]
        total = np.zeros(257, np.float32)
        for g in members:
            total += scale * grads[g]
        combined += [GradientRecord(group=g, seq=0, base_version=0, samples=1, node=node,
                                    grad=total if g == members[0] else None, scaled_for=5 if g == members[0] else 0)
                     for g in members]
    assert np.array_equal(aggregate([(r, 1.0) for r in combined]), expected)
    with pytest.raises(ValueError, match="scaled for a step of 5"):
        aggregate([(r, 1.0) for r in combined[:3]])


SYNC = ["aggregation.policy=sync", "actors.on_policy=true", "learners.push=gradient", "algo.kl_coeff=0.2",
        "io.log_seconds=60"]


def _same_weights_and_rows(a: Path, b: Path, versions: int) -> None:
    """The same weights after the same versions (at least ``versions``), and the same pushes in the record."""
    one, other = load_checkpoint(a), load_checkpoint(b)
    assert one["version"] == other["version"] >= versions
    assert torch.equal(one["params"], other["params"]), (one["params"] - other["params"]).abs().max()
    ga, gb = (read_table(p / "run.h5", "gradients") for p in (a, b))
    keys = sorted(zip(np.asarray(gb["group"]).tolist(), np.asarray(gb["seq"]).tolist()))
    assert len(keys) == len(set(keys)) == len(ga["group"])  # every (group, seq) once, as many as separate pushes
    for column in ("group", "seq", "base_version", "staleness", "loss"):
        assert np.array_equal(np.sort(ga[column]), np.sort(gb[column])), column


def test_combined_pushes_in_virtual_time_make_the_weights_of_separate_ones(tmp_path):
    job = [*SYNC, "launch.runner=sim", "launch.profile=perlmutter", "learners.groups=8", "learners.min_active=8",
           "actors.count=8", "env.num_envs=2", "actors.fragment_length=16", "algo.train_batch_size=256",
           "algo.minibatch_size=16", "algo.num_sgd_iter=1", "stop.max_rounds=2"]  # 8 groups: 2 GPU nodes of 4; a
    # group's batch is its own actor's fragment, so which group trains on what does not hang on timing
    for combine in ("none", "node"):
        args = [a for o in [*job, f"learners.combine={combine}", f"io.run_dir={tmp_path / combine}"] for a in ("-o", o)]
        assert cli_main(["run", CARTPOLE, *args]) == 0
    _same_weights_and_rows(tmp_path / "none", tmp_path / "node", 4)


TWO_NODES = {"MPIR_CVAR_NUM_CLIQUES": "2", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo",
             "UCX_LOG_LEVEL": "error"}
"""Ranks in 2 cliques, round-robin (MPICH): the 3 group roots, launch ranks S .. S + 2 for S parameter ranks, fall
on the two "nodes" alternately, groups 0 and 2 on one and group 1 on the other, with 1 or 2 parameter ranks alike."""


@pytest.mark.mpi
@pytest.mark.slow
def test_two_shards_with_node_combine_make_the_weights_of_one_parameter_rank_element_wise(tmp_path):
    job = [*SYNC, "learners.groups=3", "learners.min_active=3", "actors.count=1", "env.num_envs=2",
           "actors.fragment_length=8", "algo.train_batch_size=48", "algo.minibatch_size=8", "algo.num_sgd_iter=2",
           "stop.max_rounds=3", "launch.timeout_seconds=120"]
    # one actor: its fragments of a batch go to the groups in one order whatever the timing (an actor sends to the
    # least backlogged group, and rank 0 frees every group's on-policy places in one write after the version; when
    # each group freed its own, this failed about one run in eight); with an actor per group, which actor fills
    # which group's place would depend on which started first
    runs = {"one": [], "two-node": ["aggregation.shards=2", "learners.combine=node"]}
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "hpcrl", "run", CARTPOLE,
         *[a for o in [*job, *extra, f"io.run_dir={tmp_path / name}"] for a in ("-o", o)]],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=dict(os.environ, **TWO_NODES)) for name, extra in runs.items()}  # side by side: mostly start-up
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=200)
        assert proc.returncode == 0, f"{name}:\n{out[-3000:]}"
    nodes = read_table(tmp_path / "two-node" / "run.h5", "rank_map")
    assert list(nodes["role"][:2]) == [0, 0]  # two parameter ranks
    rows = read_table(tmp_path / "two-node" / "run.h5", "gradients")
    waits = {g: np.asarray(rows["mailbox_wait_seconds"])[np.asarray(rows["group"]) == g] for g in range(3)}
    # a pusher's wait counts its node's gather (> 0 every time); group 2 handed every push to group 0 (none)
    assert (waits[0] > 0).all() and (waits[1] > 0).all() and (waits[2] == 0).all(), waits
    _same_weights_and_rows(tmp_path / "one", tmp_path / "two-node", 12)


@pytest.mark.parametrize("args, says", [
    (["-o", "learners.combine=node", "-o", "learners.groups=2", "-o", "learners.min_active=2"],
     "learners.combine=node: aggregation.policy=stellaris admits each group's push on its own"),
    (["-o", "learners.combine=node", "-o", "aggregation.policy=sync", "-o", "learners.groups=2"],
     "learners.combine=node: learners.min_active=1 would park groups"),
    (["--runner", "serial", "-o", "learners.combine=node", "-o", "aggregation.policy=sync"],
     "learners.combine=node: launch.runner=serial runs every group in one process, on no node of its own"),
    (["-o", "learners.combine=node", "-o", "aggregation.policy=sync", "-o", "learners.topology=allreduce",
      "-o", "learners.push=gradient"],
     "learners.combine=node: learners.topology=allreduce has no pushes to combine"),
    (["-o", "learners.combine=group"], "learners.combine"),
])
def test_what_a_node_combine_cannot_have_is_one_line(args, says, capsys):
    assert cli_main(["run", CARTPOLE, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
