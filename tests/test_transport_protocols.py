"""Both transports against one set of Protocols: every method, with the Protocol's parameters.

The stress invariants (no gradient lost, doubled or torn, back-pressure instead of overwriting; no torn
weight copy, versions never going back; exact counter sums) run on both in tests/test_runtime_windows.py.
"""
from __future__ import annotations

import inspect

import pytest

from hpcrl.runtime.transport import (group_reduce, links as transport, local, local_node_reports, node_cache,
                                     node_reports, protocols, sharded, windows)

PAIRS = [
    (protocols.Counters, windows.CounterWindow, local.LocalCounters),
    (protocols.Mailbox, windows.GradientMailbox, local.LocalMailbox),
    (protocols.Board, windows.WeightBoard, local.LocalBoard),
    (protocols.Board, node_cache.NodeWeightCache, local.LocalBoard),
    (protocols.Mailbox, sharded.ShardedMailbox, local.LocalMailbox),  # aggregation.shards > 1
    (protocols.Board, sharded.ShardedBoard, local.LocalBoard),
    (protocols.Reports, transport.MpiReports, local.LocalReports),
    (protocols.Reports, node_reports.ReportRelay, local_node_reports.NodeMember),  # actors.reports=node
    (protocols.Reports, node_reports.ReportMember, local_node_reports.NodeMember),
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



def test_a_drain_takes_at_most_what_it_is_asked_for_in_order():
    """Rank 0 handles its reports a turn at a time (parameter.py REPORTS_TURN_SECONDS): in one process, and under MPI
    (tests/mpi_programs/reports_drain.py: 3 senders, 40 reports each, drained 7 at a time)."""
    from hpcrl.runtime.transport.local import LocalReports

    reports = LocalReports()
    for i in range(10):
        reports.send(i)
    assert reports.drain(4) == [0, 1, 2, 3] and reports.drain(4) == [4, 5, 6, 7] and reports.drain() == [8, 9]
    assert reports.drain(4) == []


@pytest.mark.mpi
def test_an_mpi_drain_takes_at_most_what_it_is_asked_for_in_order():
    from mpi_programs.launcher import run_mpi

    said = run_mpi(4, "reports_drain", 40, 7, timeout=60)
    assert "OK reports_drain" in said, said[-2000:]
