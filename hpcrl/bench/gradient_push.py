"""Gradient push paths for a flat float32 gradient, as ratios to memcpy of the same buffer.

Paths: numpy memcpy (baseline); GradientMailbox push (claim CAS, Put, Flush, FULL CAS) timed at
the learner, and push-to-poll end to end (the owner's copy-out included); pickle round trip
(Stellaris pushed pickled gradients through Redis); ClusterEnv's JSON path (``list()`` of the
floats, ``json.dumps``/``loads``, back to numpy); pickle over MPI ``send`` (Redis-less
baseline); and buffer ``Send`` for reference. Starts its own ``mpiexec -n 2`` (rank 0 owns the
mailbox, rank 1 pushes).

usage: hpcrl bench gradient-push [--sizes 1048576,4194304] [--seconds 0.5] [--slots 2]
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WORKER_FLAG = "--mpi-worker"


def _rate(fn, seconds: float, min_reps: int = 3) -> float:
    """Median seconds per call of ``fn`` over about ``seconds`` of repetitions."""
    times = []
    end = time.perf_counter() + seconds
    while len(times) < min_reps or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _local_paths(grad: np.ndarray, seconds: float) -> dict[str, float]:
    dst = np.empty_like(grad)
    out = {"numpy memcpy": _rate(lambda: np.copyto(dst, grad), seconds)}
    out["pickle round trip"] = _rate(lambda: pickle.loads(pickle.dumps(grad, protocol=pickle.HIGHEST_PROTOCOL)), seconds)

    def json_path():
        np.asarray(json.loads(json.dumps(grad.tolist())), dtype=np.float32)

    out["JSON list() round trip"] = _rate(json_path, seconds, min_reps=1)
    out["  of which list() alone"] = _rate(grad.tolist, seconds, min_reps=1)
    return out


def _worker(sizes: list[int], seconds: float, slots: int) -> None:
    from mpi4py import MPI

    from hpcrl.runtime.backoff import Backoff
    from hpcrl.runtime.transport.windows import GradientMailbox

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != 2:
        raise SystemExit("gradient_push worker needs exactly 2 ranks")
    rows = []
    for P in sizes:
        grad = np.full(P, 1.0, dtype=np.float32)
        local = _local_paths(grad, seconds) if rank == 0 else {}
        comm.Barrier()
        # mailbox: learner pushes n gradients, owner polls them out
        mb = GradientMailbox(comm, 0, 1, slots, P)
        n = comm.bcast(max(5, int(seconds / max(local.get("numpy memcpy", 1e-3), 1e-5) / 20)) if rank == 0 else None)
        n = min(n, 400)
        comm.Barrier()
        t0 = time.perf_counter()
        if rank == 1:
            push_times, waits = [], 0.0
            for seq in range(n):
                t = time.perf_counter()
                waits += mb.push(0, seq, 0, 1, grad)
                push_times.append(time.perf_counter() - t)
            comm.send((float(np.median(push_times)), waits / n), dest=0)
        else:
            got, backoff = 0, Backoff(cap=1e-4)
            while got < n:
                items = mb.poll()
                got += len(items)
                if not items:
                    backoff.sleep()
            end_to_end = (time.perf_counter() - t0) / n
            push_median, wait_mean = comm.recv(source=1)
        mb.free()
        # pickle over MPI send (lowercase send) and buffer Send
        comm.Barrier()
        reps = min(n, 100)
        buf = np.empty_like(grad)
        t0 = time.perf_counter()
        for _ in range(reps):
            if rank == 1:
                comm.send(grad, dest=0, tag=5)
            else:
                comm.recv(source=1, tag=5)
        pickled_send = (time.perf_counter() - t0) / reps
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            if rank == 1:
                comm.Send([grad, MPI.FLOAT], dest=0, tag=6)
            else:
                comm.Recv([buf, MPI.FLOAT], source=1, tag=6)
        buffer_send = (time.perf_counter() - t0) / reps
        if rank == 0:
            rows.append((P, {
                **{k: v for k, v in local.items() if k == "numpy memcpy"},
                "mailbox push (learner)": push_median,
                "mailbox push -> poll (end to end)": end_to_end,
                "MPI Send/Recv of the buffer": buffer_send,
                "pickle over MPI send/recv": pickled_send,
                **{k: v for k, v in local.items() if k != "numpy memcpy"},
            }, wait_mean))
    if rank == 0:
        print(f"{'path':36s} {'floats':>9s} {'ms/op':>10s} {'GB/s':>8s} {'x memcpy':>9s}")
        for P, paths, wait_mean in rows:
            base = paths["numpy memcpy"]
            for name, t in paths.items():
                print(f"{name:36s} {P:9d} {t * 1e3:10.3f} {4 * P / t / 1e9:8.2f} {t / base:9.1f}")
            print(f"# P={P}: mean wait for a free slot per push {wait_mean * 1e3:.3f} ms ({slots} slots)")
        print(f"# MPI thread level {MPI.Query_thread()} (3 = MULTIPLE); one node, 2 ranks; times are medians where repeated")


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpcrl bench gradient-push", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1048576,4194304", help="comma-separated gradient sizes in floats")
    p.add_argument("--seconds", type=float, default=0.5, help="time per measured path")
    p.add_argument("--slots", type=int, default=2, help="mailbox slots for the one learner group")
    p.add_argument("--timeout", type=float, default=300, help="kill the MPI job after this many seconds")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    worker = WORKER_FLAG in argv
    if worker:
        argv.remove(WORKER_FLAG)
    args = _parse(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if worker:
        _worker(sizes, args.seconds, args.slots)
        return 0
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", "2", sys.executable, "-m", "mpi4py", "-m",
           "hpcrl.bench.gradient_push", WORKER_FLAG, "--sizes", args.sizes, "--seconds", str(args.seconds),
           "--slots", str(args.slots)]
    env = dict(os.environ, UCX_LOG_LEVEL=os.environ.get("UCX_LOG_LEVEL", "error"))
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        print(f"gradient-push: MPI job killed after {args.timeout} s", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
