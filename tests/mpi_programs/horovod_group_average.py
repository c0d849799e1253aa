"""HorovodReducer on every learner group of a split COMM_WORLD: each group's mean, groups kept apart."""
import sys

import numpy as np
import torch
from mpi4py import MPI

from hpcrl.runtime.transport.group_reduce import HorovodReducer

world = MPI.COMM_WORLD
per_group = int(sys.argv[1])
group = world.Get_rank() // per_group
comm = world.Split(group, world.Get_rank())
reducer = HorovodReducer(comm, torch.device("cpu"))
assert reducer.size == comm.Get_size(), (reducer.size, comm.Get_size())
members = [group * per_group + i for i in range(comm.Get_size())]
for step in range(3):  # the same tensor name, call after call
    grad = torch.arange(1000, dtype=torch.float32) * (world.Get_rank() + 1) + step
    got = reducer.average(grad)
    want = np.mean([np.arange(1000, dtype=np.float32) * (r + 1) + step for r in members], axis=0)
    assert got.dtype == np.float32 and np.allclose(got, want), (world.Get_rank(), got[:4], want[:4])
reducer.close()
print(f"OK horovod rank {world.Get_rank()} group {group}", flush=True)
