"""Gradient mailbox under concurrency: no loss, no duplicate, no torn slot, sums match, back-pressure.

Usage: mailbox_stress.py GROUPS SLOTS PUSHES PARAMS OWNER_SLEEP_S [expect-wait]
Rank 0 owns the mailbox; ranks 1.. push (rank r into group (r-1) % GROUPS, so several ranks may
share a group); gradient values are rank * 1e5 + seq (exact in float32). On one rank the owner
pushes to itself and polls in between. The same body runs on COMM_SELF first, then COMM_WORLD.
"""
import random
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.transport.windows import FREE, GradientMailbox


def exercise(comm, groups, slots, pushes, params, owner_sleep):
    rank, size = comm.Get_rank(), comm.Get_size()
    mb = GradientMailbox(comm, 0, groups, slots, params)
    rng = random.Random(1234 + rank)
    pushers = range(1, size) if size > 1 else [0]
    expected = {(r, s) for r in pushers for s in range(pushes)}
    sent_sum = 0.0
    waits = []
    if rank in pushers and size > 1:
        group = (rank - 1) % groups
        for seq in range(pushes):
            grad = np.full(params, rank * 1e5 + seq, dtype=np.float32)
            waits.append(mb.push(group, seq, base_version=seq // 3, samples=rank, grad=grad, stats=[seq, -1.0]))
            sent_sum += float(grad.sum(dtype=np.float64))
            if rng.random() < 0.3:
                time.sleep(rng.random() * 1e-3)
    got = []
    if rank == 0:
        deadline = time.monotonic() + 40
        next_seq = 0
        while len(got) < len(expected):
            if size == 1 and next_seq < pushes:  # one rank: push up to `slots` at a time, then poll
                for _ in range(min(slots, pushes - next_seq)):
                    grad = np.full(params, next_seq, dtype=np.float32)
                    assert mb.try_push(0, next_seq, 0, 0, grad, stats=[next_seq, -1.0])
                    sent_sum += float(grad.sum(dtype=np.float64))
                    next_seq += 1
            got += mb.poll()
            assert time.monotonic() < deadline, f"owner timed out with {len(got)}/{len(expected)} gradients"
            if owner_sleep:
                time.sleep(owner_sleep * rng.random() * 2)
        assert (mb.states() == FREE).all()
    # invariants at the owner
    total_sent = comm.allreduce(sent_sum)
    if rank == 0:
        keys = [(h["rank"], h["seq"]) for h, _ in got]
        assert len(keys) == len(set(keys)), "duplicate gradient"
        assert set(keys) == expected, f"lost: {sorted(expected - set(keys))[:5]}"
        recv_sum = 0.0
        last = {}
        for h, g in got:
            want = h["rank"] * 1e5 + h["seq"] if size > 1 else h["seq"]
            assert (g == np.float32(want)).all(), f"torn or wrong slot from rank {h['rank']} seq {h['seq']}"
            assert h["group"] == ((h["rank"] - 1) % groups if size > 1 else 0)
            assert list(h["stats"]) == [h["seq"], -1.0]
            assert h["seq"] > last.get(h["rank"], -1), "out of order within a pusher"
            last[h["rank"]] = h["seq"]
            recv_sum += float(g.sum(dtype=np.float64))
        assert recv_sum == total_sent, (recv_sum, total_sent)
    total_wait = comm.allreduce(sum(waits))
    mb.free()
    try:
        mb.states()
    except RuntimeError:
        pass
    else:
        raise AssertionError("use after free did not raise")
    return total_wait


def main(argv):
    groups, slots, pushes, params = map(int, argv[:4])
    owner_sleep = float(argv[4])
    exercise(MPI.COMM_SELF, 1, slots, pushes, params, 0.0)
    total_wait = exercise(MPI.COMM_WORLD, groups, slots, pushes, params, owner_sleep)
    if len(argv) > 5 and argv[5] == "expect-wait":
        assert total_wait > 0, "a slow owner with few slots must make the learners wait"
    if MPI.COMM_WORLD.rank == 0:
        print(f"OK mailbox groups={groups} slots={slots} pushes/rank={pushes} wait_total={total_wait:.4f}s")


if __name__ == "__main__":
    main(sys.argv[1:])
