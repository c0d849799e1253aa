"""The torn-version body of the sharded weight board (``runtime/transport/sharded.py``), on both transports.

S owner ranks publish versions of their slices as a sharded job does (``runtime/roles/shard_lead.py``): shard 0
publishes version v, the others publish v once they see it (rank 0's decision reaching them), after a sleep of
their own (none, short, long or a burst: every order of the shards' publishes), and shard 0 waits until every
shard has v before it makes v + 1. Every other rank reads the latest version over and over, and every version
before it, and checks each copy: shard s's floats of version v all equal ``v * 8 + s`` (a copy that mixed two
versions anywhere fails), versions never go back, a version is never seen before every shard published it.

Run as ``mpiexec -n N python -m mpi4py shard_stress.py SHARDS VERSIONS PARAMS HISTORY`` (tests/test_shards.py;
COMM_WORLD), or on threads with :func:`run_threads`, the serial runner's in-memory boards.
"""
from __future__ import annotations

import random
import sys
import time

import numpy as np

try:  # the teams of tests/mpi_programs/stress.py: imported by pytest, or run by mpiexec from this folder
    from mpi_programs.stress import MpiTeam, on_threads
except ImportError:
    from stress import MpiTeam, on_threads

from hpcrl.runtime.transport.sharded import ShardedBoard

DONE, READS = 0, 1


def _sizes(params: int, shards: int) -> list[int]:
    """Uneven slices: shard s a little larger than s - 1."""
    weights = [s + 2 for s in range(shards)]
    sizes = [params * w // sum(weights) for w in weights]
    sizes[-1] += params - sum(sizes)
    return sizes


def _boards(team, sizes: list[int], history: int) -> list:
    if isinstance(team, MpiTeam):
        from hpcrl.runtime.transport.windows import WeightBoard

        return [WeightBoard(team.comm, owner, n, history=history) for owner, n in enumerate(sizes)]
    from hpcrl.runtime.transport.local import LocalBoard

    return team._made_by_rank_0(lambda: [LocalBoard(n, history=history) for n in sizes])


def torn_versions(team, shards: int, versions: int, params: int, history: int) -> str:
    rank, size = team.rank, team.size
    sizes = _sizes(params, shards)
    bounds = list(np.cumsum([0, *sizes]))
    board = ShardedBoard(_boards(team, sizes, history), bounds, rank if rank < shards else -1)
    flags = team.counters(0, 2, 0)
    rng = random.Random(77 + rank)
    team.barrier()
    reads = 0
    if rank < shards:
        mine = np.empty(params, np.float32)
        own = board.own_slice()
        style = rank % 4  # 0: leads; 1: at once; 2: short sleeps; 3: long sleeps in bursts
        for v in range(versions):
            if rank == 0:
                while min(board.shard_versions()) < v - 1:  # every shard has v - 1: v may be made
                    time.sleep(1e-5)
            else:
                while board.parts[0].latest_version() < v:  # rank 0's decision has reached this shard
                    time.sleep(1e-5)
                pause = {1: 0.0, 2: rng.random() * 3e-4, 3: rng.random() * 4e-3 if rng.random() < 0.2 else 0.0}
                time.sleep(pause.get(style, rng.random() * 1e-3))
            mine[own] = np.float32(v * 8 + rank)
            board.publish(v, mine)
        if rank == 0:
            while min(board.shard_versions()) < versions - 1:
                time.sleep(1e-4)
            flags.set(DONE, 1)
    else:
        out, old, last = np.empty(params, np.float32), np.empty(params, np.float32), -1
        while True:
            done = flags.read(DONE)
            v = board.read_latest(out)
            if v >= 0:
                shard_latest = board.shard_versions()
                assert min(shard_latest) >= v, f"version {v} read before every shard had it: {shard_latest}"
                _check(out, v, bounds, "latest")
                assert v >= last, f"version went back: {last} -> {v}"
                last = v
                if v >= 1 and board.read_version(v - 1, old):
                    _check(old, v - 1, bounds, "older")
                assert not board.read_version(v + 1 + versions, old), "a version never published was read"
                reads += 1
            if done:
                break
        assert last == versions - 1, f"the last read was {last}, not {versions - 1}"
    reads = team.allreduce(reads)
    team.barrier()
    if rank == 0:
        assert board.versions()[-1] == versions - 1 and board.latest_version() == versions - 1
    team.free(flags)
    team.barrier()
    for part in board.parts:
        team.free(part)
    return f"shards={shards} size={size} versions={versions} reads={reads}"


def _check(buf: np.ndarray, v: int, bounds: list[int], what: str) -> None:
    for s in range(len(bounds) - 1):
        piece = buf[bounds[s]:bounds[s + 1]]
        if not (piece == np.float32(v * 8 + s)).all():
            raise AssertionError(f"torn {what} copy of version {v}: shard {s} holds {np.unique(piece)[:4]}")


def run_threads(n: int, *args) -> str:
    return f"OK torn_versions {on_threads(n, torn_versions, args)}"


def main(argv: list[str]) -> None:
    from mpi4py import MPI

    said = torn_versions(MpiTeam(MPI.COMM_WORLD), *map(int, argv))
    if MPI.COMM_WORLD.rank == 0:
        print(f"OK torn_versions {said}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
