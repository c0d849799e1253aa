"""The node weight cache under real concurrency (run by tests/test_node_weight_cache.py under mpiexec).

``python -m mpi4py node_cache.py NODES SECONDS PARAMS CACHED [TREE]``: rank 0 owns a WeightBoard and republishes
buffers filled with float(version) (probe: -version) every ~0.5 ms for SECONDS; ranks 1.. are actors on NODES
"nodes" (``comm.Split`` by ``(rank - 1) % NODES``, then the cache's own ``Split_type(COMM_TYPE_SHARED)``,
which on one machine keeps each colour whole). CACHED=1: each actor reads through its node's
NodeWeightCache; CACHED=0: straight from the board (the old way, to show what the count measures). TREE=k (>= 2):
the caches fetch through a WeightTree of fanout k over the NODES nodes.

Checked on every read: the copy is whole (every value the version it came with, the probe too), versions never
go back, and the version is no older than the one rank 0 named newest just before the read began (an
actor acts with the newest version it could see). At the end, from rank 0's fetch counts (``fetch_rows``):
every version published has one row; with the cache no version was fetched by actors more often than there are
nodes, and the counts add up to the fetches the actors made; the bytes are the count times one version's size.
With the tree rank 0 served no version more often than k times, every relay was filled at most once per version, and
the nodes past the first k fetched through the relays (their fills add up to at least what the deepest nodes took).
Prints ``OK node_cache cached=C nodes=N reads=R versions=V max_per_version=M fetched=F``.
"""
from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from hpcrl.runtime.transport.node_cache import NodeWeightCache, for_actors
from hpcrl.runtime.transport.weight_tree import WeightTree, has_children
from hpcrl.runtime.transport.windows import CounterWindow, WeightBoard

PROBE = 3
STOP, READS = 0, 1


def _uniform(buf: np.ndarray, value: float, what: str) -> None:
    assert (buf == np.float32(value)).all(), f"torn {what}: expected {value}, got {np.unique(buf)[:5]}"


def main(nodes: int, seconds: float, params: int, cached: bool, tree: int = 0) -> str:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    assert size - 1 >= nodes >= 1, "need at least one actor per node"
    board = WeightBoard(comm, 0, params, history=4, probe_size=PROBE)
    flags = CounterWindow(comm, 0, 2, 0)
    # the fake nodes: actors of one colour share a node (as Split_type would find on a real one)
    fake_node = comm.Split((rank - 1) % nodes if rank else MPI.UNDEFINED, rank)
    if tree:  # the same colours, split from the actors' communicator the tree spans
        shared = for_actors(board, comm, rank > 0, tree_fanout=tree,
                            node_of=lambda actors: actors.Split(actors.Get_rank() % nodes, actors.Get_rank()))
    elif cached:
        shared = for_actors(board, fake_node, True) if rank else board
    else:
        shared = board
    if rank and cached:
        assert isinstance(shared, NodeWeightCache)
    out, probe = np.empty(params, np.float32), np.empty(PROBE, np.float32)
    comm.Barrier()
    reads = 0
    if rank == 0:
        v, end = 0, time.monotonic() + seconds
        while time.monotonic() < end or flags.read(READS) < 20 * (size - 1):
            board.publish(v, np.full(params, v, np.float32), np.full(PROBE, -v, np.float32))
            v += 1
            time.sleep(5e-4)  # a parameter rank publishes once per admitted gradient, a millisecond or so apart
        flags.set(STOP, 1)
        published = v
    else:
        last = -1
        while not flags.read(STOP):
            newest = board.latest_version()  # what this actor could see before reading
            got = shared.read_latest(out, have=last)
            if got < 0:
                continue
            assert got >= newest, f"read {got} while rank 0 already had {newest}"
            assert got >= last, "version went backwards"
            if got != last:
                _uniform(out, got, "params")
            last = got
            pv = shared.read_probe(probe)
            assert pv >= got, "probe older than the params read before it"
            _uniform(probe, -pv, "probe")
            reads += 1
            flags.add(READS)
            time.sleep(2e-4 * ((rank * 7 + reads) % 5))  # actors out of step with each other
        published = -1
    comm.Barrier()  # publishing over: the newest version stays put
    if rank:
        newest = shared.read_latest(out)
        assert shared.read_version(newest, out), "the newest version not readable by version"
        _uniform(out, newest, "params by version")
    comm.Barrier()  # every read done: the counts are final
    fetched = comm.allreduce(shared.fetches if isinstance(shared, NodeWeightCache) else 0)
    relay_fills = _relay_fills(shared, nodes, tree) if rank else []
    reads = comm.allreduce(reads)
    said = ""
    if rank == 0:
        rows = board.fetch_rows(final=True)
        versions = rows["version"]
        assert versions == list(range(published)), "not one row per published version"
        fetches = np.asarray(rows["actor_fetches"])
        assert (np.asarray(rows["actor_bytes"]) >= fetches * 4 * PROBE).all()
        assert not any(rows["learner_fetches"]), "no learner read"
        if cached:
            full = 4 * (params + PROBE)
            assert fetches.max() <= nodes, f"a version fetched {fetches.max()} times by {nodes} nodes"
            assert (np.asarray(rows["actor_bytes"]) == fetches * full).all(), "a node fetched something else"
            if tree:
                assert fetches.max() <= min(tree, nodes), f"rank 0 served a version {fetches.max()} times, fanout {tree}"
            else:
                assert fetches.sum() == fetched, (fetches.sum(), fetched)
        said = (f"cached={int(cached)} nodes={nodes} reads={reads} versions={len(versions)} "
                f"max_per_version={fetches.max()} fetched={int(fetches.sum())}")
        if tree:
            relay_fills = comm.recv(source=1)
            said += f" relay_fills={relay_fills}"
    elif rank == 1 and tree:
        comm.send(relay_fills, dest=0)
    if shared is not board:
        shared.free()  # its window, then the board
        try:
            shared.read_latest(out)
        except RuntimeError:
            pass
        else:
            raise AssertionError("NodeWeightCache: use after free did not raise")
    else:
        board.free()
    flags.free()
    if fake_node != MPI.COMM_NULL:
        fake_node.Free()
    return said


def _relay_fills(cache: NodeWeightCache, nodes: int, fanout: int) -> list[int]:
    """Actor side, after the last read: each relay's fills (checked: at most one per version its source had; the
    relays' children fetched through them)."""
    if not fanout:
        return []
    tree = cache.board
    assert isinstance(tree, WeightTree)
    newest = tree.latest_version()
    fills = [tree.relay_fills(i) for i in range(nodes) if has_children(i, fanout, nodes)]
    assert all(f <= newest + 1 for f in fills), f"a relay filled more often than there were versions: {fills}"
    assert sum(fills) > 0, "no node fetched through a relay"
    return fills


if __name__ == "__main__":
    nodes_, seconds_, params_, cached_ = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), bool(int(sys.argv[4]))
    tree_ = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    said_ = main(nodes_, seconds_, params_, cached_, tree_)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"OK node_cache {said_}", flush=True)
