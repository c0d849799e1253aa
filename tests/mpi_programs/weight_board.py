"""Weight board: no torn read, versions match contents, old versions by version; counters.

Usage: weight_board.py PARAMS HISTORY SECONDS
Rank 0 republishes buffers filled with float(version) (probe filled with -version) as fast as it
can; every other rank reads the latest, a recent version and the probe, and checks each copy is
uniform and equal to the version it was returned with. Then counters: every rank adds, the sum
must be exact; a set flag is seen by all. The body runs on COMM_SELF first, then COMM_WORLD.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.transport.windows import CounterWindow, WeightBoard

STOP, READS, ADDS = 0, 1, 2


def check_uniform(buf, value, what):
    assert (buf == np.float32(value)).all(), f"torn {what}: expected {value}, got {np.unique(buf)[:5]}"


def exercise_board(comm, params, history, seconds):
    rank, size = comm.Get_rank(), comm.Get_size()
    board = WeightBoard(comm, 0, params, history=history, probe_size=3)
    flags = CounterWindow(comm, 0, 3)
    out = np.empty(params, np.float32)
    probe = np.empty(3, np.float32)
    assert board.read_latest(out) == -1 and board.latest_version() == -1
    comm.Barrier()
    reads = 0
    if rank == 0:
        v = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end or (size > 1 and flags.read(READS) < 20 * (size - 1)):
            board.publish(v, np.full(params, v, np.float32), np.full(3, -v, np.float32))
            if size == 1:  # read own board in between
                got = board.read_latest(out)
                check_uniform(out, got, "latest")
                assert got == v
                out[:] = -1.0  # the version held is still the newest: nothing copied
                assert board.read_latest(out, have=got) == got and (out == -1.0).all()
                assert board.read_latest(out, have=got - 1) == got  # an older one held: copied
                check_uniform(out, got, "latest after have")
                reads += 1
            v += 1
            if size > 1 and history == 1:
                # a reader needs the slot unchanged for one Get of PARAMS floats: back-to-back publishes
                # (about 20 us each) would starve it (a parameter rank publishes once per admitted
                # gradient, a millisecond or more apart); the slot is still rewritten under most reads
                time.sleep(2e-4)
        flags.set(STOP, 1)
        assert board.versions() == list(range(v - min(history, v), v))
        assert board.read_version(v - 1, out) and not board.read_version(v - history - 1, out)
        check_uniform(out, v - 1, "by version")
    else:
        last = -1
        while not flags.read(STOP):
            got = board.read_latest(out)
            if got < 0:  # nothing published yet: out was not written
                continue
            check_uniform(out, got, "latest")
            assert got >= last, "version went backwards"
            last = got
            if got >= 1 and board.read_version(got - 1, out):
                check_uniform(out, got - 1, "old version")
            pv = board.read_probe(probe)
            assert pv >= got, "probe older than the params read before it"
            check_uniform(probe, -pv, "probe")
            assert board.latest_version() >= pv
            reads += 1
            flags.add(READS)
    retries = comm.allreduce(board.retries)
    reads = comm.allreduce(reads)
    board.free()
    flags.free()
    return reads, retries


def exercise_counters(comm, adds):
    rank, size = comm.Get_rank(), comm.Get_size()
    c = CounterWindow(comm, size - 1, 4, initial=[0, 5, 0, 0])
    for _ in range(adds):
        c.add(0, rank + 1)
        c.add(1, -1)
    comm.Barrier()
    want0 = adds * size * (size + 1) // 2
    assert c.read(0) == want0, (c.read(0), want0)
    assert c.read(1) == 5 - adds * size
    if rank == 0:
        assert c.set(2, 7) == 0
    comm.Barrier()
    assert list(c.read_all()) == [want0, 5 - adds * size, 7, 0]
    try:
        c.read(4)
    except IndexError:
        pass
    else:
        raise AssertionError("counter index out of range did not raise")
    c.free()
    try:
        c.read(0)
    except RuntimeError:
        pass
    else:
        raise AssertionError("use after free did not raise")


def main(argv):
    params, history, seconds = int(argv[0]), int(argv[1]), float(argv[2])
    for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):
        reads, retries = exercise_board(comm, params, history, seconds / 4 if comm is MPI.COMM_SELF else seconds)
        exercise_counters(comm, 200)
        if MPI.COMM_WORLD.rank == 0:
            print(f"OK board size={comm.Get_size()} reads={reads} retries={retries}")


if __name__ == "__main__":
    main(sys.argv[1:])
