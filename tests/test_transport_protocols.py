"""Both transports against one set of Protocols, and the in-memory twins under the MPI stress invariants.

The MPI windows are stressed under mpiexec by tests/mpi_programs/ (tests/test_runtime_windows.py);
the same invariants are checked here on the serial runner's twins with threads in place of ranks:
no gradient lost, doubled or torn, back-pressure instead of overwriting; no torn weight copy and
versions never going back; counter sums exact.
"""
from __future__ import annotations

import inspect
import random
import threading
import time

import numpy as np
import pytest

from hpcrl.runtime.transport import group_reduce, links as transport, local, protocols, windows

PAIRS = [
    (protocols.Counters, windows.CounterWindow, local.LocalCounters),
    (protocols.Mailbox, windows.GradientMailbox, local.LocalMailbox),
    (protocols.Board, windows.WeightBoard, local.LocalBoard),
    (protocols.Reports, transport.MpiReports, local.LocalReports),
    (protocols.Fragments, transport.MpiFragments, local.LocalFragments),
    (protocols.ActorLink, transport.ActorLink, local.LocalActorLink),
    (protocols.LearnerLink, transport.LearnerLink, local.LocalLearnerLink),
    (protocols.BatchSender, transport.BatchSender, local.LocalBatches),
    (protocols.BatchReceiver, transport.BatchReceiver, local.LocalBatchReceiver),
    (protocols.GroupReduce, group_reduce.MpiGroupReduce, local.LocalGroupReduce),
]


def _methods(proto) -> list[str]:
    return [n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")]


@pytest.mark.parametrize("proto, mpi, memory", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_both_implementations_have_every_method_with_the_protocols_parameters(proto, mpi, memory):
    for impl in (mpi, memory):
        assert issubclass(impl, proto), f"{impl.__name__} lacks a method of {proto.__name__}"
        for name in _methods(proto):
            want = [p for p in inspect.signature(getattr(proto, name)).parameters if p != "self"]
            have = [p for p in inspect.signature(getattr(impl, name)).parameters if p != "self"]
            assert have[:len(want)] == want, f"{impl.__name__}.{name}{have} vs {proto.__name__}.{name}{want}"


def test_local_mailbox_loses_doubles_and_tears_nothing_and_pushes_back():
    groups, slots, pushes, params, pushers = 2, 2, 300, 64, 4
    mb = local.LocalMailbox(groups, slots, params)
    refused = [0] * pushers

    def push(rank: int) -> None:
        rng = random.Random(rank)
        for seq in range(pushes):
            grad = np.full(params, rank * 1e5 + seq, dtype=np.float32)
            while not mb.try_push(rank % groups, seq, seq // 3, rank, grad, [seq, -1.0]):
                refused[rank] += 1  # the group's slots are full: wait, never overwrite
                time.sleep(1e-5)
            if rng.random() < 0.2:
                time.sleep(rng.random() * 1e-4)

    threads = [threading.Thread(target=push, args=(r,)) for r in range(pushers)]
    for t in threads:
        t.start()
    got, deadline = [], time.monotonic() + 30
    while len(got) < pushers * pushes and time.monotonic() < deadline:
        for header, grad in mb.poll():
            rank = header["samples"]
            assert np.all(grad == grad[0]) and grad[0] == rank * 1e5 + header["seq"]  # whole, not torn
            assert header["stats"][0] == header["seq"] and header["group"] == rank % groups
            got.append((rank, header["seq"]))
        time.sleep(2e-4)  # a slow owner: the pushers fill their slots
    for t in threads:
        t.join()
    assert sorted(got) == sorted((r, s) for r in range(pushers) for s in range(pushes))  # each exactly once
    assert sum(refused) > 0
    assert mb.poll() == []


def test_local_board_never_gives_a_torn_copy_and_versions_never_go_back():
    params, versions, readers = 4096, 400, 3
    board = local.LocalBoard(params, history=2)
    board.publish(0, np.zeros(params, np.float32))
    errors: list[str] = []

    def read() -> None:
        out, last = np.empty(params, np.float32), 0
        while last < versions:
            v = board.read_latest(out)
            if not np.all(out == v):
                errors.append(f"torn copy: version {v} holds {np.unique(out)[:3]}")
            if v < last:
                errors.append(f"version went back from {last} to {v}")
            last = v

    threads = [threading.Thread(target=read) for _ in range(readers)]
    for t in threads:
        t.start()
    for v in range(1, versions + 1):
        board.publish(v, np.full(params, v, np.float32))
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors[:3]
    out = np.empty(params, np.float32)
    assert board.read_version(versions - 1, out) and np.all(out == versions - 1)  # history keeps the one before


def test_local_counters_sum_exactly_under_concurrent_adds():
    counters = local.LocalCounters(4, threading.Event())
    adds = 2000

    def add(word: int) -> None:
        for _ in range(adds):
            counters.add(word, 1)
            counters.add(3, 2)

    threads = [threading.Thread(target=add, args=(w % 3,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counters.read_all().tolist() == [2 * adds, 2 * adds, 2 * adds, 6 * adds * 2]
