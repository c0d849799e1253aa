"""Rank map of one hpcrl MPI job: parameter rank, learner groups, actors.

World rank 0 is the parameter rank, ranks 1 .. S-1 the other parameter shards (``aggregation.shards``, S = 1 by
default: none), the next G x L ranks are G learner groups of L ranks (the first rank of a group is its root, the
one that pushes gradients), the rest are actors. run.h5's rank map records a shard as a parameter rank whose index
is its shard.
:func:`plan_roles` is pure (usable before MPI starts); :meth:`Topology.from_config` is
collective over the communicator it is given.
"""
from __future__ import annotations

import functools
from collections import Counter
import platform
from dataclasses import dataclass, field
from typing import NamedTuple

from hpcrl.errors import ConfigError
from hpcrl.io.schema import ROLES

PARAMETER, LEARNER, ACTOR, SHARD = "parameter", "learner", "actor", "shard"
PARAMETER_RANK = 0
ROLE_CODES = {**{name: i for i, name in enumerate(ROLES)}, SHARD: ROLES.index(PARAMETER)}
"""The role column of run.h5's rank_map table (a parameter shard is a parameter rank there)."""


class Role(NamedTuple):
    """One rank's place: role, learner group (-1 unless a learner), rank inside that group (-1 likewise; a parameter
    shard's: its shard)."""

    role: str
    group: int
    group_rank: int


def required_ranks(groups: int, ranks_per_group: int, actors: int, shards: int = 1) -> int:
    """S parameter ranks (1 unless sharded) + G x L learner ranks + A actor ranks."""
    return shards + groups * ranks_per_group + actors


def plan_roles(world_size: int, groups: int, ranks_per_group: int, actors: int, shards: int = 1) -> list[Role]:
    """The role of every world rank; ConfigError when the launch size does not match the config."""
    for name, value in (("learners.groups", groups), ("learners.ranks_per_group", ranks_per_group), ("actors.count", actors)):
        if value < 1:
            raise ConfigError(f"{name}: must be >= 1 (got {value})")
    need = required_ranks(groups, ranks_per_group, actors, shards)
    if world_size != need:
        raise ConfigError(
            f"launch: {world_size} ranks but the config needs {shards} parameter + {groups} x {ranks_per_group} "
            f"learners + {actors} actors = {need}"
        )
    roles = [Role(PARAMETER, -1, -1)] + [Role(SHARD, -1, s) for s in range(1, shards)]
    roles += [Role(LEARNER, g, r) for g in range(groups) for r in range(ranks_per_group)]
    roles += [Role(ACTOR, -1, -1)] * actors
    return roles


def one_process_rank_map() -> dict[str, list]:
    """run.h5's rank_map of a run that is one process (the fused loop): rank 0, the parameter role, this host."""
    return {"rank": [0], "role": [ROLE_CODES[PARAMETER]], "group": [-1], "index": [0],
            "node": [platform.node().encode()[:64]], "world_rank": [0]}


class RankMapFacts:
    """What the whole job's rank map says of its learner groups, worked out once: each group's root and node. Every
    rank's Topology in one process (the serial runner's, the virtual-time runner's) shares one: worked out per rank,
    these scans of the rank map were quadratic in the job's size (minutes for a 1,000-node sim's 34,001 ranks)."""

    def __init__(self, roles: list[Role], node_keys: list) -> None:
        self.roles, self.node_keys = roles, node_keys

    @functools.cached_property
    def learner_roots(self) -> list[int]:
        return [r for r, x in enumerate(self.roles) if x.role == LEARNER and x.group_rank == 0]

    @functools.cached_property
    def group_nodes(self) -> list[int]:
        numbers: dict = {}
        return [numbers.setdefault(self.node_keys[r], len(numbers)) for r in self.learner_roots]

    @functools.cached_property
    def most_groups_on_a_node(self) -> int:
        return max(Counter(self.group_nodes).values(), default=0)


@dataclass
class Topology:
    """This rank's role plus the whole job's rank map. Build with :meth:`from_config` (collective)."""

    comm: object
    rank: int
    size: int
    role: str
    group: int
    """Learner group index, -1 for the parameter rank and actors."""
    group_rank: int
    group_comm: object
    """Communicator of this rank's learner group (MPI.COMM_NULL for other roles)."""
    node_comm: object
    """Ranks sharing this node's memory (Split_type COMM_TYPE_SHARED)."""
    roots_comm: object = field(default=None, kw_only=True)
    """The learner group roots, rank g = group g (learners.topology=allreduce: their allreduce); None otherwise, and
    MPI.COMM_NULL on the other ranks."""
    combine_comm: object = field(default=None, kw_only=True)
    """The group roots of this rank's node, in group order (learners.combine=node: their gather to the first); None
    otherwise, and MPI.COMM_NULL on the other ranks."""
    groups: int
    ranks_per_group: int
    roles: list[Role] = field(repr=False)
    nodes: list[str] = field(repr=False)
    node_ranks: list[int] = field(repr=False)
    world_ranks: list[int] = field(repr=False, default_factory=list)
    """Each rank's rank in the communicator the job was started with (its launcher's rank number)."""
    node_ids: list[int] = field(repr=False, default_factory=list)
    """Each rank's node as the lowest rank on it: the ranks that share memory (``node_comm``), which a hostname
    does not always tell (MPICH's cliques in the tests). Empty: the node names tell."""
    facts: RankMapFacts | None = field(repr=False, default=None, kw_only=True)
    """The rank map's learner facts, shared by the process's Topologies (None: this one works them out)."""

    def __post_init__(self) -> None:
        if self.facts is None:
            self.facts = RankMapFacts(self.roles, self.node_ids or self.nodes)

    @classmethod
    def from_config(cls, comm, learners_cfg, actors_count: int, placement=None, shards: int = 1) -> "Topology":
        """Collective over ``comm``: check the size against the config, order the ranks by the placement
        (hpcrl/runtime/placement.py: ``self.comm`` is then a reordered copy of ``comm``) and split the
        communicators."""
        from mpi4py import MPI

        from hpcrl.runtime.placement import role_order

        groups, per_group = learners_cfg.groups, learners_cfg.launched_ranks_per_group
        roles = plan_roles(comm.Get_size(), groups, per_group, actors_count, shards)
        world_rank = comm.Get_rank()
        order = list(range(comm.Get_size()))
        if placement is not None and placement.roles != "in_launch_order":
            hosts = comm.allgather(MPI.Get_processor_name())
            order = role_order(hosts, groups * per_group, placement.roles, placement.learners_per_node,
                               placement.parameter)
            comm = comm.Split(0, key=order.index(world_rank))
        rank = comm.Get_rank()
        mine = roles[rank]
        color = mine.group if mine.role == LEARNER else MPI.UNDEFINED
        group_comm = comm.Split(color, mine.group_rank if mine.role == LEARNER else 0)
        node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        roots_comm = None
        if learners_cfg.topology == "allreduce":
            is_root = mine.role == LEARNER and mine.group_rank == 0
            roots_comm = comm.Split(0 if is_root else MPI.UNDEFINED, mine.group if is_root else 0)
        combine_comm = None
        if learners_cfg.combine == "node":  # collective over the node's ranks
            is_root = mine.role == LEARNER and mine.group_rank == 0
            combine_comm = node_comm.Split(0 if is_root else MPI.UNDEFINED, mine.group if is_root else 0)
        lowest = node_comm.allreduce(rank, op=MPI.MIN)
        table = comm.allgather((MPI.Get_processor_name(), node_comm.Get_rank(), lowest))
        return cls(
            comm=comm, rank=rank, size=comm.Get_size(), role=mine.role, group=mine.group,
            group_rank=mine.group_rank, group_comm=group_comm, node_comm=node_comm,
            groups=groups, ranks_per_group=per_group, roles=roles,
            nodes=[t[0] for t in table], node_ranks=[t[1] for t in table], world_ranks=order, roots_comm=roots_comm,
            node_ids=[t[2] for t in table], combine_comm=combine_comm,
        )

    @property
    def parameter_rank(self) -> int:
        return PARAMETER_RANK

    @property
    def is_group_root(self) -> bool:
        return self.role == LEARNER and self.group_rank == 0

    @property
    def node_rank(self) -> int:
        """Node-local rank (GPU binding: a learner uses the device with this index modulo the count)."""
        return self.node_ranks[self.rank]

    @property
    def device_index(self) -> int:
        """A learner's GPU on its node: its index among the learner ranks of its node (distinct GPUs while a
        node holds no more learners than GPUs); other roles: their node-local rank."""
        if self.role != LEARNER:
            return self.node_rank
        mine = self.nodes[self.rank]
        return sum(1 for r in self.learner_ranks if r < self.rank and self.nodes[r] == mine)

    @property
    def group_nodes(self) -> list[int]:
        """Each group's node (its root's), numbered 0, 1 ... in the order of the groups: the order in which a step
        sums the nodes' gradients (``staleness.aggregate``)."""
        return self.facts.group_nodes

    @property
    def most_groups_on_a_node(self) -> int:
        """The most group roots that share a node (learners.combine=node: the members of the fullest node's push)."""
        return self.facts.most_groups_on_a_node

    def node_mates(self, group: int) -> list[int]:
        """The groups whose roots share ``group``'s node, in group order (``group`` among them)."""
        nodes = self.group_nodes
        return [g for g in range(self.groups) if nodes[g] == nodes[group]]

    @property
    def node_name(self) -> str:
        return self.nodes[self.rank]

    @property
    def shard(self) -> int:
        """The parameter shard this rank owns (0: the parameter rank), -1 for learners and actors."""
        return 0 if self.role == PARAMETER else self.group_rank if self.role == SHARD else -1

    @property
    def shard_ranks(self) -> list[int]:
        """Rank of each parameter shard, indexed by shard."""
        return [r for r, x in enumerate(self.roles) if x.role in (PARAMETER, SHARD)]

    @property
    def learner_roots(self) -> list[int]:
        """World rank of each group's root, indexed by group."""
        return self.facts.learner_roots

    @property
    def learner_ranks(self) -> list[int]:
        return [r for r, x in enumerate(self.roles) if x.role == LEARNER]

    @property
    def actor_ranks(self) -> list[int]:
        return [r for r, x in enumerate(self.roles) if x.role == ACTOR]

    @property
    def actor_index(self) -> int:
        """0-based index of this actor among the actors (-1 for other roles)."""
        return self.actor_ranks.index(self.rank) if self.role == ACTOR else -1

    def default_group_of_actor(self, actor_rank: int) -> int:
        """Static round-robin assignment of actors to learner groups (actor index mod G)."""
        return self.actor_ranks.index(actor_rank) % self.groups

    def rank_map(self) -> dict[str, list]:
        """run.h5's rank_map table (one row per world rank): role code, group, actor index or rank in the group, node."""
        actors = self.actor_ranks
        return {
            "rank": list(range(self.size)),
            "role": [ROLE_CODES[x.role] for x in self.roles],
            "group": [x.group for x in self.roles],
            "index": [actors.index(r) if x.role == ACTOR else max(x.group_rank, 0) for r, x in enumerate(self.roles)],
            "node": [n.encode()[:64] for n in self.nodes],
            "world_rank": list(self.world_ranks or range(self.size)),
        }

    def free(self) -> None:
        """Free the communicators this object split off (collective over their members)."""
        from mpi4py import MPI

        for name in ("group_comm", "combine_comm", "node_comm", "roots_comm"):
            c = getattr(self, name)
            if c is not None and c != MPI.COMM_NULL:
                c.Free()
            setattr(self, name, MPI.COMM_NULL)
