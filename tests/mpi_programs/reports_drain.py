"""Rank 0 drains the other ranks' reports a few at a time (``MpiReports.drain(most)``): every report once, each
sender's in the order it sent them, never more than ``most`` a call. Prints ``OK reports_drain calls=N``."""
import sys
import time

from mpi4py import MPI

from hpcrl.runtime.transport.links import MpiReports

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
EACH, MOST = int(sys.argv[1]), int(sys.argv[2])
reports = MpiReports(comm)
if rank:
    for i in range(EACH):
        reports.send((rank, i))
    reports.close()
    comm.Barrier()
else:
    comm.Barrier()  # every report sent before the first drain: a drain could take them all at once
    got, calls, deadline = [], 0, time.monotonic() + 20
    while len(got) < EACH * (size - 1) and time.monotonic() < deadline:
        part = reports.drain(MOST)
        assert len(part) <= MOST, len(part)
        calls += bool(part)
        got += part
    for sender in range(1, size):
        assert [i for s, i in got if s == sender] == list(range(EACH)), sender
    assert len(got) == EACH * (size - 1) and calls >= len(got) // MOST, (len(got), calls)
    assert reports.drain() == []
    print(f"OK reports_drain calls={calls}", flush=True)
