"""Per-node reports under real concurrency (run by tests/test_node_reports.py under mpiexec).

``python -m mpi4py node_reports.py NODES REPORTS``: rank 0 drains reports as the parameter rank does; ranks 1..
are actors on NODES "nodes" (``comm.Split`` by ``(rank - 1) % NODES``), the node's first its relay. Each actor
sends REPORTS fragment reports (some with episodes, each with its normalisation statistics) with random short
naps; midway the last actor and each relay park for PARK_SECONDS (a relay keeps polling, as an actor's wait
loop does), then send an ActorParked; the last actor closes late, so its relay's close waits on it.

Checked at the end (every report arrived by then: a relay's last send completes only once rank 0 took it):
every (actor, fragment) once, in the order the actor sent them, every episode once, only node messages reached
rank 0, fewer than one per report, each actor's newest normalisation statistics arrived last, no report waited
in a relay much longer than the flush bound, and a relay waiting on a late member beat its heartbeat.
Prints ``OK node_reports nodes=N reports=R messages=M max_delay_ms=D beats=B``.
"""
from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.messages import PARK_REASON, ActorParked, Episode, FragmentReport, NodeReports
from hpcrl.runtime.transport.control import wait_request
from hpcrl.runtime.transport.links import MpiReports
from hpcrl.runtime.transport.node_reports import ReportMember, ReportRelay
from hpcrl.runtime.transport.report_packing import FLUSH_SECONDS

PARK_SECONDS, LATE_CLOSE_SECONDS = 0.3, 0.6


def report(actor: int, i: int) -> FragmentReport:
    episodes = tuple(Episode(time=time.time(), actor=actor, env_index=e, episode_return=float(i), length=10,
                             policy_version=i) for e in range(i % 3))
    return FragmentReport(time=time.time(), actor=actor, fragment=i, steps=16, sample_seconds=0.0,
                          transport_wait_seconds=0.0, weight_sync_seconds=0.0, policy_version=i, group=0,
                          episodes=episodes, normalizer={"fragment": i})


def actor(comm, node, nodes: int, n: int) -> str:
    rank, size = comm.Get_rank(), comm.Get_size()
    beats: list[float] = []
    relay = node.Get_rank() == 0
    reports = (ReportRelay(node, MpiReports(comm), rank, lambda: beats.append(time.monotonic())) if relay
               else ReportMember(node, lambda: beats.append(time.monotonic())))
    rng = np.random.default_rng(rank)
    a = rank - 1
    for i in range(n):
        reports.send(report(a, i))
        time.sleep(rng.uniform(0, 3e-3))
        if i == n // 2 and (relay or rank == size - 1):
            end = time.monotonic() + PARK_SECONDS
            while time.monotonic() < end:
                reports.poll()
                time.sleep(0.05)
            reports.send(ActorParked(time=time.time(), actor=a, parked_seconds=PARK_SECONDS, cpu_seconds=0.0,
                                     active_actors=size - 1, reason=PARK_REASON["woken"]))
    if rank == size - 1:
        time.sleep(LATE_CLOSE_SECONDS)
    start = time.monotonic()
    reports.close()
    waited = [t for t in beats if t >= start]
    if relay and node_of(rank, nodes) == node_of(size - 1, nodes) and len(waited) < 5:
        raise AssertionError(f"relay {rank} waited {time.monotonic() - start:.2f} s on a late member, "
                             f"{len(waited)} beats")
    return str(len(waited)) if relay else ""


def node_of(rank: int, nodes: int) -> int:
    return (rank - 1) % nodes


def parameter(comm, nodes: int, n: int, done) -> str:
    reports = MpiReports(comm)
    fragments: dict[int, list[int]] = {}  # per actor, the fragment numbers in the order they came
    episodes: dict[int, list[int]] = {}  # per actor, each episode's policy version (its fragment's number)
    normalizers: dict[int, list[int]] = {}  # per actor, the newest statistics of each message
    parked, messages, delays = 0, 0, []
    while True:
        finished = done.Test()
        for m in reports.drain():
            messages += 1
            assert isinstance(m, NodeReports), f"rank 0 got a {type(m).__name__}, not a node's message"
            now = time.time()
            parked += sum(isinstance(r, ActorParked) for r in m.reports)
            f = m.fragments
            for a, i, sent in zip(f.actors["actor"], f.actors["fragment"], f.actors["time"]):
                fragments.setdefault(a, []).append(i)
                delays.append(now - sent)
            for a, i in zip(f.episodes["actor"], f.episodes["policy_version"]):
                episodes.setdefault(a, []).append(i)
            for a, normalizer in f.normalizers.items():
                normalizers.setdefault(a, []).append(normalizer["fragment"])
        if finished:
            break
        time.sleep(1e-3)
    actors = comm.Get_size() - 1
    assert sorted(fragments) == list(range(actors)), sorted(fragments)
    for a, got in fragments.items():
        assert got == list(range(n)), f"actor {a}: fragments {got}"
        assert episodes[a] == [i for i in range(n) for _ in range(i % 3)], f"actor {a}: episodes {episodes[a]}"
        seen = normalizers[a]
        assert seen == sorted(seen) and seen[-1] == n - 1, f"actor {a}: normalizers {seen}"
    assert parked == nodes + (actors > nodes), f"{parked} ActorParked"  # each relay's and the last actor's
    assert messages < actors * n, f"{messages} messages for {actors * n} reports: nothing batched"
    return f"reports={actors * n} messages={messages} max_delay_ms={1e3 * max(delays):.0f}"


def main(nodes: int, n: int) -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    node = comm.Split(node_of(rank, nodes) if rank else MPI.UNDEFINED, rank)  # the fake nodes
    said = actor(comm, node, nodes, n) if rank else ""
    done = comm.Ibarrier()  # entered by each actor after its close
    if rank == 0:
        said = parameter(comm, nodes, n, done)
    else:
        wait_request(done)
    beats = comm.gather(said, root=0)
    if rank == 0:
        print(f"OK node_reports nodes={nodes} {said} flush_ms={1e3 * FLUSH_SECONDS:.0f} "
              f"beats={max(int(b) for b in beats[1:] if b)}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
