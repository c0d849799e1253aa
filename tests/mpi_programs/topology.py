"""Topology on a real launch: roles, group communicators, rank map, node-local ranks.

Usage: topology.py GROUPS RANKS_PER_GROUP ACTORS
"""
import sys
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.topology import ACTOR, LEARNER, PARAMETER, ROLE_CODES, Topology


def main(argv):
    groups, per_group, actors = map(int, argv)
    comm = MPI.COMM_WORLD
    learners = SimpleNamespace(groups=groups, ranks_per_group=per_group, launched_ranks_per_group=per_group,
                               topology="server", combine="none")
    topo = Topology.from_config(comm, learners, actors)
    rank = comm.Get_rank()
    assert topo.learner_roots == [1 + g * per_group for g in range(groups)]
    assert topo.actor_ranks == list(range(1 + groups * per_group, comm.Get_size()))
    if rank == 0:
        assert topo.role == PARAMETER and topo.group_comm == MPI.COMM_NULL
    elif rank in topo.actor_ranks:
        assert topo.role == ACTOR and topo.group == -1 and topo.actor_index == rank - topo.actor_ranks[0]
        assert 0 <= topo.default_group_of_actor(rank) < groups
    else:
        assert topo.role == LEARNER and topo.group == (rank - 1) // per_group
        assert topo.group_comm.Get_size() == per_group and topo.group_comm.Get_rank() == topo.group_rank
        assert topo.is_group_root == (rank in topo.learner_roots)
        # the group communicator really groups the right ranks: allreduce of world ranks
        members = topo.group_comm.allreduce(rank)
        first = 1 + topo.group * per_group
        assert members == sum(range(first, first + per_group)), members
    table = topo.rank_map()  # run.h5's rank_map rows
    assert len({len(v) for v in table.values()}) == 1 and len(table["rank"]) == comm.Get_size()
    assert table["role"][rank] == ROLE_CODES[topo.role] and table["group"][rank] == topo.group
    assert table["index"][rank] == (topo.actor_index if topo.role == ACTOR else max(topo.group_rank, 0))
    assert table["node"][rank] == MPI.Get_processor_name().encode()[:64]
    assert topo.node_comm.Get_rank() == topo.node_rank
    # one node here: node-local ranks are 0..size-1
    assert sorted(topo.node_ranks) == list(range(comm.Get_size()))
    topo.free()
    if rank == 0:
        print("OK topology", {k: np.asarray(v).tolist() for k, v in table.items()})


if __name__ == "__main__":
    main(sys.argv[1:])
