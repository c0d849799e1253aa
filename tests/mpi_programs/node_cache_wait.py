"""An actor waiting on its node's fetcher beats its heartbeat (run by tests/test_node_weight_cache.py).

``python -m mpi4py node_cache_wait.py``, 3 ranks: rank 0 owns a WeightBoard and publishes version 0; ranks 1 and 2
share one node's NodeWeightCache. Rank 1 holds the node's lock for 0.6 s, as an actor stopped in the middle of
its fetch would; rank 2's read of version 0 must wait for it, beating all the while (so a watchdog names rank 1,
not the rank waiting on it), and then read version 0 whole. Prints ``OK node_cache_wait beats=B``.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.transport.node_cache import LOCK, for_actors
from hpcrl.runtime.transport.windows import WeightBoard

PARAMS, HELD_SECONDS = 1000, 0.6


def main() -> str:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    assert comm.Get_size() == 3
    board = WeightBoard(comm, 0, PARAMS, history=2)
    beats: list[float] = []
    cache = for_actors(board, comm, rank > 0, beat=lambda: beats.append(time.monotonic()))
    if rank == 0:
        board.publish(0, np.zeros(PARAMS, np.float32))
    comm.Barrier()
    said = ""
    if rank == 1:
        assert cache._cas(LOCK, 0, cache.node_rank + 1) == 0  # the fetcher's lock, taken and held
        comm.Barrier()
        time.sleep(HELD_SECONDS)
        assert cache._cas(LOCK, cache.node_rank + 1, 0) == cache.node_rank + 1
    elif rank == 2:
        comm.Barrier()
        start = time.monotonic()
        out = np.full(PARAMS, np.nan, np.float32)
        assert cache.read_latest(out) == 0 and (out == 0).all()
        waited = time.monotonic() - start
        assert waited >= HELD_SECONDS / 2, f"the read did not wait for the held lock ({waited:.2f} s)"
        assert len(beats) >= 10 and beats[-1] - beats[0] >= HELD_SECONDS / 2, f"{len(beats)} beats while waiting"
        said = f"beats={len(beats)}"
    else:
        comm.Barrier()
    comm.Barrier()
    cache.free()
    return said


if __name__ == "__main__":
    said_ = main()
    if said_:
        print(f"OK node_cache_wait {said_}", flush=True)
