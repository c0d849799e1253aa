"""Which rank takes which role, from the nodes the launcher put the ranks on (``launch.placement``).

The launcher (mpiexec, srun, PALS, Parsl's prefix) only decides how many ranks start on each node.
The roles are then given by hostname, the same way under every launcher: the ranks gather their
hostnames and reorder themselves (``comm.Split`` with a key) so that rank 0 is the parameter rank,
the learner groups' ranks follow, then the actors, each on the node the placement chose.

- ``in_launch_order`` (default): the launch order is the role order, as in a local run: world
  rank 0 is the parameter rank, the next G x L ranks the learners, the rest the actors.
- ``learners_first``: nodes in the order their first rank was launched. The parameter rank is
  the first rank of the first node; learner ranks fill the nodes from the first one, at most
  ``learners_per_node`` on a node (a GPU node's GPU count: a learner takes the GPU of its index
  among its node's learners) and none on the parameter rank's node with ``parameter: apart``;
  actors take every other rank, node after node, so actors spread over the nodes the learners
  leave and an actor's index follows its node.

:func:`role_order` is pure (no MPI): ``hpcrl submit`` runs it on the block layout it will ask for,
so a placement that cannot fit is refused before anything is written.
"""
from __future__ import annotations

from typing import Literal, Sequence

Roles = Literal["in_launch_order", "learners_first"]
Parameter = Literal["with_learners", "apart"]


def role_order(hosts: Sequence[str], learner_ranks: int, roles: Roles = "in_launch_order",
               learners_per_node: int | None = None, parameter: Parameter = "with_learners") -> list[int]:
    """World ranks in role order (parameter, then ``learner_ranks`` learner ranks, then the actors) for ranks
    whose hostnames are ``hosts`` (index = world rank). ValueError (one line) when the learners do not fit."""
    size = len(hosts)
    if roles == "in_launch_order":
        return list(range(size))
    if roles != "learners_first":
        raise ValueError(f"launch.placement.roles={roles!r}; allowed: in_launch_order, learners_first")
    by_node: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_node.setdefault(host, []).append(rank)
    nodes = list(by_node.values())  # in the order of each node's first rank
    parameter_rank = nodes[0][0]
    learners: list[int] = []
    for k, ranks in enumerate(nodes):
        if k == 0 and parameter == "apart":
            continue
        free = [r for r in ranks if r != parameter_rank]
        room = len(free) if learners_per_node is None else min(len(free), learners_per_node)
        learners += free[:min(room, learner_ranks - len(learners))]
        if len(learners) == learner_ranks:
            break
    if len(learners) < learner_ranks:
        where = ", ".join(f"{host}: {len(r)}" for host, r in by_node.items())
        raise ValueError(
            f"launch.placement: {learner_ranks} learner rank(s) do not fit (ranks per node {where}; "
            f"learners_per_node={learners_per_node}, parameter={parameter}); allowed: more nodes or ranks per node, "
            "a larger learners_per_node, or parameter: with_learners")
    taken = {parameter_rank, *learners}
    actors = [r for ranks in nodes for r in ranks if r not in taken]
    return [parameter_rank, *learners, *actors]


def block_hosts(ranks: int, ranks_per_node: int) -> list[str]:
    """The hostnames a block launch of ``ranks`` ranks, ``ranks_per_node`` a node, gives (node0, node1 ...):
    what ``hpcrl submit`` checks a placement against before it writes the script."""
    return [f"node{r // ranks_per_node}" for r in range(ranks)]


NODE_CACHE_MODES = ("auto", "on", "off")
"""``launch.node_weight_cache``: auto (default: on when a node holds more than one actor), on, off."""


def node_weight_caches(mode: str, actor_nodes: list[str], tree_fanout: int = 0) -> bool:
    """Whether the actors read through node weight caches (runtime/transport/node_cache.py; the sim runner prices
    the same): ``on``, ``off``, or ``auto`` = some node holds more than one actor (with one actor per node a cache
    only adds a shared copy) or a weight tree connects them."""
    if mode not in NODE_CACHE_MODES:
        raise ValueError(f"launch.node_weight_cache: {mode!r}; allowed: {', '.join(NODE_CACHE_MODES)}")
    if mode == "auto":
        return tree_fanout > 0 or len(set(actor_nodes)) < len(actor_nodes)
    return mode == "on"
