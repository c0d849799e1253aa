"""Fragments from several actors reach their learner intact, in order, with bounded lead.

Usage: channels.py RECEIVERS FRAGMENTS MAX_IN_FLIGHT RECEIVER_SLEEP_S
Ranks 0..RECEIVERS-1 receive; the others are actors sending to receiver (rank % RECEIVERS).
Fragment contents are a function of (actor, index), so the receiver regenerates and compares.
Each actor checks before every send that it is never more than max_in_flight + prepost + 1
fragments ahead of what its receiver has processed (read from a counter window).
"""
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.transport.channels import FragmentReceiver, FragmentSender
from hpcrl.runtime.transport.layout import FragmentLayout
from hpcrl.runtime.transport.windows import CounterWindow

T, N, OBS, PREPOST = 16, 4, (5, 2), 2


def make_fragment(actor, index):
    rng = np.random.default_rng(actor * 100003 + index)
    return {
        "obs": rng.standard_normal((T, N) + OBS).astype(np.float32),
        "actions": rng.integers(0, 7, (T, N, 2)),
        "rewards": rng.standard_normal((T, N)),
        "terminated": rng.random((T, N)) < 0.1,
        "truncated": rng.random((T, N)) < 0.05,
        "behaviour_logp": -rng.random((T, N)),
        "values": rng.standard_normal((T, N)),
        "final_values": rng.standard_normal((T, N)),
        "last_value": rng.standard_normal(N),
        "policy_version": index // 2,
        "hidden": rng.standard_normal(3),
    }


def same(a, b):
    return all(np.array_equal(np.asarray(a[k]).astype(np.asarray(b[k]).dtype), b[k]) for k in a)


def main(argv):
    receivers, fragments, max_in_flight, sleep = int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    layout = FragmentLayout(T, N, OBS, np.float32, (2,), np.int16, extra={"hidden": ((3,), np.float64)})
    processed = CounterWindow(comm, 0, size)
    if rank < receivers:
        actors = [r for r in range(receivers, size) if r % receivers == rank]
        rx = FragmentReceiver(comm, layout, prepost=PREPOST)
        seen = {a: 0 for a in actors}
        deadline = time.monotonic() + 30
        while not rx.finished(actors):
            frag = rx.recv(timeout=0.5)
            assert time.monotonic() < deadline, "receiver timed out"
            if frag is None:
                continue
            a, i = frag["actor"], frag["fragment"]
            assert i == seen[a], f"actor {a}: fragment {i} arrived, expected {seen[a]}"
            assert same(make_fragment(a, i), frag), f"fragment {i} of actor {a} corrupted"
            seen[a] += 1
            processed.add(a, 1)
            if sleep:
                time.sleep(sleep)
        assert seen == {a: fragments for a in actors}, seen
        assert rx.poll() is None
        rx.close()
        waited = 0.0
    else:
        tx = FragmentSender(comm, layout, max_in_flight)
        dest = rank % receivers
        for i in range(fragments):
            lead = i - processed.read(rank)
            assert lead <= max_in_flight + PREPOST + 1, f"actor {rank} is {lead} fragments ahead"
            tx.send(dest, make_fragment(rank, i))
            assert tx.in_flight <= max_in_flight
        tx.close([dest])
        assert tx.in_flight == 0
        waited = tx.total_wait
    waited = comm.allreduce(waited)
    if sleep:
        assert waited > 0, "a slow receiver must make the actors wait"
    processed.free()
    if rank == 0:
        print(f"OK channels size={size} receivers={receivers} fragments={fragments} actor_wait={waited:.3f}s")


if __name__ == "__main__":
    main(sys.argv[1:])
