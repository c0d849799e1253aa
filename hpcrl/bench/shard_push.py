"""Parameter shards (``aggregation.shards``): each shard's CPU per push and its bytes per version, at S = 1, 2, 4.

One ``mpiexec -n S+1`` per S: ranks 0 .. S-1 are the shards, rank S a learner pushing ``--pushes`` gradients of P
floats through the runtime's own objects (``ShardedMailbox``, ``ShardedBoard``, ``MpiShardLink``, hpcrl's Adam on
each shard's slice, cut by ``runtime/shards.py``). Each shard takes its slices out of its mailbox, applies each
(rank 0 decides and sends the others a ``ShardStep``, and waits after its publish until every shard has the version)
and publishes its slice. CPU is each shard's thread CPU in the passes that took or applied a push (idle polls are
waiting), per push; not counted: rank 0's record bookkeeping (run.h5 rows), the same at every S.

usage: hpcrl bench shard-push [--sizes 9156,1048576] [--shards 1,2,4] [--pushes 200]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from hpcrl.bench.mpi_worker import WorkerFailed, run_worker

WORKER_FLAG = "--mpi-worker"


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpcrl bench shard-push", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="9156,1048576", help="weight floats P (9156: the default CartPole job's)")
    p.add_argument("--shards", default="1,2,4")
    p.add_argument("--pushes", type=int, default=200)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for each MPI job")
    return p.parse_args(argv)


def _worker(S: int, P: int, N: int) -> None:
    """One job: shards 0 .. S-1, learner S. Prints each shard's line (rank 0's first)."""
    import torch
    from mpi4py import MPI
    from torch import nn

    from hpcrl.algos.adam import Adam
    from hpcrl.runtime.shards import ShardStep, StepPart, bounds
    from hpcrl.runtime.transport.shard_link import MpiShardLink
    from hpcrl.runtime.transport.sharded import ShardedBoard, ShardedMailbox
    from hpcrl.runtime.transport.windows import GradientMailbox, WeightBoard

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    sizes = [P // 4] * 3 + [P - 3 * (P // 4)]  # four tensors
    b = bounds(sizes, S)
    mine = rank if rank < S else -1
    mailbox = ShardedMailbox([GradientMailbox(comm, s, 1, 2, b[s + 1] - b[s]) for s in range(S)], b, mine)
    board = ShardedBoard([WeightBoard(comm, s, b[s + 1] - b[s], history=4) for s in range(S)], b, mine)
    link = MpiShardLink(comm, list(range(S)))
    comm.Barrier()
    line = None
    if rank == S:
        grad = np.random.default_rng(0).standard_normal(P).astype(np.float32) * 1e-3
        for seq in range(N):
            mailbox.push(0, seq, seq, 1, grad)
    else:
        whole = np.zeros(P, np.float32)
        own = [nn.Parameter(torch.from_numpy(whole[lo:hi])) for lo, hi in _pieces(sizes, b[mine], b[mine + 1])]
        grads = np.zeros(P, np.float32)
        for p, (lo, hi) in zip(own, _pieces(sizes, b[mine], b[mine + 1])):
            p.grad = torch.from_numpy(grads[lo:hi])
        adam = Adam(own, lr=1e-3)
        held, todo, done, cpu = {}, [], 0, 0.0
        while done < N:
            t = time.thread_time()
            got = mailbox.poll()
            for h, piece in got:
                held[(h.group, h.seq)] = piece
                if rank == 0:
                    step = ShardStep(h.seq + 1, (StepPart(h.group, h.seq, 1.0, 0, 0, False),), 1e-3)
                    for s in range(1, S):
                        link.send(s, step)
                    todo.append(step)
            if rank:
                todo += link.poll()
            worked = bool(got)
            while todo and all(part[:2] in held for part in todo[0].parts):
                worked = True
                step = todo.pop(0)
                grads[b[mine]:b[mine + 1]] = held.pop(step.parts[0][:2])
                adam.step()
                board.publish(step.version, whole)
                done += 1
                while rank == 0 and board.latest_version() < step.version:
                    time.sleep(2e-5)
            if worked:
                cpu += time.thread_time() - t
            else:
                time.sleep(2e-5)
        link.close()
        line = (rank, cpu / N * 1e3, 4 * (b[mine + 1] - b[mine]))
    lines = comm.gather(line, root=0)
    if rank == 0:
        for r, ms, nbytes in [x for x in lines if x is not None]:
            print(f"RESULT {S} {P} {r} {ms:.4f} {nbytes}", flush=True)
    comm.Barrier()
    mailbox.free()
    board.free()


def _pieces(sizes: list[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """The pieces of each tensor inside floats lo:hi (as ``roles/shard.SliceModel`` cuts them)."""
    out, start = [], 0
    for n in sizes:
        a, z = max(start, lo), min(start + n, hi)
        if a < z:
            out.append((a, z))
        start += n
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if WORKER_FLAG in argv:
        argv.remove(WORKER_FLAG)
        _worker(*map(int, argv))
        return 0
    args = _parse(argv)
    rows: dict[tuple[int, int], list[tuple[int, float, int]]] = {}
    for P in (int(x) for x in args.sizes.split(",") if x):
        for S in (int(x) for x in args.shards.split(",") if x):
            try:
                out = run_worker(S + 1, "hpcrl.bench.shard_push", [WORKER_FLAG, str(S), str(P), str(args.pushes)],
                                 args.timeout, f"shard-push: the S={S} P={P} job")
            except WorkerFailed as exc:
                print(exc, file=sys.stderr)
                return 1
            rows[(P, S)] = [(int(r), float(ms), int(n)) for _, _, _, r, ms, n in
                            (line.split() for line in out.splitlines() if line.startswith("RESULT"))]
    print(f"{'P floats':>9} {'S':>2} {'rank 0 ms/push':>15} {'others ms/push':>15} {'bytes/version/shard':>20} "
          f"{'rank 0 vs S=1':>14}")
    for (P, S), shards in rows.items():
        first = rows.get((P, 1), shards)[0][1]
        others = [ms for r, ms, _ in shards if r]
        print(f"{P:>9} {S:>2} {shards[0][1]:>15.3f} {(np.mean(others) if others else float('nan')):>15.3f} "
              f"{shards[0][2]:>20} {shards[0][1] / first:>13.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
