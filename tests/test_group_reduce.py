"""A learner group of several ranks under the serial runner: the in-memory group (local.LocalGroup) against
the one-rank group, and a whole run.

The MPI group (group_reduce.MpiGroupReduce) runs in tests/test_runtime_e2e.py's 2 x 2-rank job.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hpcrl.commands.run import validate
from hpcrl.config import load_config
from hpcrl.io import read_table
from hpcrl.runtime.roles.learner import LearnerGroup
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.runners import serial
from hpcrl.runtime.messages import Startup
from hpcrl.runtime.runners.job import make_role
from hpcrl.runtime.runners.serial import build_jobs
from hpcrl.runtime.transport.local import LocalGroup, RunAborted


def _learner_groups(tmp_path, ranks_per_group: int, overrides: list[str]) -> list[LearnerGroup]:
    cfg = load_config(None, ["launch.runner=serial", "actors.count=1", f"learners.ranks_per_group={ranks_per_group}",
                             f"io.run_dir={tmp_path}", *overrides])
    jobs = build_jobs(make_plan(cfg), tmp_path, resume=False, progress="plain", abort=threading.Event())
    weights = jobs[0].model.flat.params.detach().cpu().numpy()
    jobs[0].board.publish(0, weights)  # what the parameter role publishes first
    learners = [job for job in jobs if job.topo.role == "learner"]
    for job in learners:
        job.startup = Startup(start_unix=0.0, version=0, seq_next=(0,), fragment_next=(0,), normalizers=(None,))
    return [make_role(job) for job in learners]


def _batch(rows: int) -> dict[str, np.ndarray]:
    """A prepared CartPole batch (what algo.prepare would hand the minibatches)."""
    rng = np.random.default_rng(7)
    return {"obs": rng.normal(size=(rows, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, rows).astype(np.int64),
            "behaviour_logp": np.log(rng.uniform(0.3, 0.7, rows)).astype(np.float32),
            "advantages": rng.normal(size=rows).astype(np.float32),
            "returns": rng.normal(size=rows).astype(np.float32),
            "values": rng.normal(size=rows).astype(np.float32)}


def _gradients(groups: list[LearnerGroup], batch: dict) -> list[np.ndarray]:
    """The gradients the group's root pushes for one prepared batch, with its other ranks serving in threads."""
    root = groups[0]
    members = [threading.Thread(target=m.run) for m in groups[1:]]
    for t in members:
        t.start()
    assert root._train(None, len(batch["advantages"]), 0, prepared=batch)
    root.group_reduce.release()
    for t in members:
        t.join(timeout=10)
        assert not t.is_alive()
    return [grad for _, grad in root.job.mailbox.poll()]


def test_a_two_rank_group_pushes_the_one_rank_gradient_of_each_minibatch(tmp_path):
    # without per-minibatch statistics (advantage standardisation, norm clipping) the loss is a mean over rows,
    # so the mean of the two shares' gradients (rows 0::2 and 1::2, equal weights as MPI's Allreduce / L) is the
    # whole minibatch's gradient
    overrides = ["learners.push=gradient", "algo.normalize_advantages=false", "algo.max_grad_norm=1e9",
                 "algo.kl_coeff=0.2", "algo.entropy_coeff=0.01", "algo.minibatch_size=32", "algo.num_sgd_iter=1",
                 "algo.vf_clip=1.0"]
    batch = _batch(64)
    one = _gradients(_learner_groups(tmp_path / "one", 1, overrides), batch)
    two = _gradients(_learner_groups(tmp_path / "two", 2, overrides), batch)
    assert len(one) == len(two) == 2  # two minibatches, one push each
    for a, b in zip(one, two):
        assert np.abs(a).max() > 1e-3
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_a_member_is_handed_copies_of_its_rows_parks_and_ends(tmp_path):
    group = LocalGroup(2, threading.Event())
    root, member = group.rank(0), group.rank(1)
    got, beats = [], []
    serving = threading.Thread(target=member.serve, args=(lambda w, b, win: got.append((w, b, win)),
                                                          lambda: None, lambda: beats.append(1)))
    serving.start()
    weights = np.arange(3, dtype=np.float32)
    rows = {"x": np.arange(10.0).reshape(5, 2)}
    root.park()
    mine, window = root.hand_out(weights, {"x": _tensor(rows["x"])}, [np.arange(5.0)])
    weights[:] = -1  # the root's buffer is read again for the next minibatch: the member holds its own copy
    root.release()
    serving.join(timeout=5)
    assert not serving.is_alive() and beats
    assert mine["x"].tolist() == rows["x"][0::2].tolist() and window[0].tolist() == [0.0, 2.0, 4.0]
    [(w, b, win)] = got  # PARK asked for nothing
    assert w.tolist() == [0.0, 1.0, 2.0]
    assert b["x"].tolist() == rows["x"][1::2].tolist() and b["x"].flags.c_contiguous
    assert win[0].tolist() == [1.0, 3.0]


def test_the_group_average_is_the_mean_in_rank_order_and_an_abort_ends_every_wait():
    abort = threading.Event()
    group = LocalGroup(3, abort)
    out = [None] * 3

    def rank(r: int) -> None:
        out[r] = group.rank(r).average(_tensor(np.full(4, float(r + 1), np.float32)))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert all(o.dtype == np.float32 and o.tolist() == [2.0] * 4 for o in out)

    failed = []

    def waiting(body) -> None:
        try:
            body()
        except RunAborted:
            failed.append(body)

    blocked = [threading.Thread(target=waiting, args=(lambda: group.rank(0).average(_tensor(np.zeros(4))),)),
               threading.Thread(target=waiting, args=(lambda: group.rank(1).serve(None, lambda: None, lambda: None),))]
    for t in blocked:
        t.start()
    time.sleep(0.1)
    start = time.monotonic()
    abort.set()  # what the serial runner does when another role fails
    for t in blocked:
        t.join(timeout=5)
    assert len(failed) == 2 and time.monotonic() - start < 2


@pytest.mark.slow
def test_a_serial_run_with_a_two_rank_learner_group_trains(tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config(None, ["launch.runner=serial", "learners.ranks_per_group=2", "stop.total_env_steps=10000",
                             f"io.run_dir={run_dir}"])
    validate(make_plan(cfg))  # hpcrl run's checks take it (they refused a serial group of several ranks)
    assert serial.run(make_plan(cfg), run_dir, progress="plain").stop_reason.startswith("stop.total_env_steps")
    h5 = run_dir / "run.h5"
    assert list(read_table(h5, "rank_map")["role"]) == [0, 1, 1, 2, 2]
    grads = read_table(h5, "gradients")
    assert np.array_equal(np.sort(grads["seq"]), np.arange(len(grads["seq"])))  # none lost, none doubled
    assert np.all(grads["samples"] == cfg.algo.minibatch_size)  # a whole minibatch, not the root's share
    returns = read_table(h5, "episodes")["return"]
    assert returns[-20:].mean() > 3 * returns[:20].mean()  # CartPole: ~20 at first, ~100-300 by 10k steps


def _tensor(a: np.ndarray):
    import torch

    return torch.as_tensor(a)
