"""How the head gets its workers: one merged communicator (head rank 0, worker i rank i+1) plus lifelines.

- ``local``: the head starts ``mpiexec -n W python -m hpcrl.clusterenv.worker --head HOST:PORT`` itself
  and joins it with MPI's dynamic process model: ``MPI.Open_port`` + ``COMM_SELF.Accept`` on the head,
  ``COMM_WORLD.Connect`` on the workers, then ``Merge``. Chosen over ``COMM_SELF.Spawn``: with a
  singleton head, MPICH's Spawn forks ``mpiexec -pmi_args ...`` found on PATH, and where another MPI's
  mpiexec comes first (here /usr/bin/mpiexec is Open MPI's) it hangs; an explicit mpiexec path cannot.
  Hydra runs with ``-disable-auto-cleanup`` so that one dead worker does not take the others down
  (the head reports it and can still close the rest).
- ``world``: the head is one rank of an existing job (``mpiexec``/``srun``); the others are workers.
- ``batch``: the head submits a worker job (:mod:`hpcrl.clusterenv.batch`) or attaches to a running one;
  the workers find the head's lifeline address in a rendezvous file, then connect as in ``local``.

``Accept`` has no timeout in MPI; it runs in a helper thread, and when the deadline passes the
head releases it by connecting a throwaway process to its own port (measured: the accept then
fails and the thread ends), so a missing worker is a one-line error, never a hang.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from hpcrl.clusterenv.lifeline import HeadLifeline


class ConnectError(RuntimeError):
    """The workers did not come (one line: what was waited for and what was seen)."""


@dataclass
class Link:
    comm: object
    lifeline: HeadLifeline
    process: subprocess.Popen | None = None
    """The local mpiexec (local mode)."""
    cleanup: list = field(default_factory=list)
    """Callables run at close (e.g. cancel a submitted batch job)."""


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the head process dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


def _accept(port: str, deadline: float, check) -> object:
    """COMM_SELF.Accept(port) that gives up at ``deadline`` (or when ``check()`` raises)."""
    from mpi4py import MPI

    result: dict = {}

    def run():
        try:
            result["comm"] = MPI.COMM_SELF.Accept(port, root=0)
        except Exception as exc:  # released by the throwaway connection below
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="clusterenv-accept")
    thread.start()
    problem = None
    while thread.is_alive():
        thread.join(0.1)
        try:
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise ConnectError("the workers said hello but did not join the MPI port in time")
        except Exception as exc:
            problem = exc
            break
    if problem is not None:
        subprocess.run([sys.executable, "-c", "import sys; from mpi4py import MPI; "
                        "MPI.COMM_SELF.Connect(sys.argv[1]).Disconnect()", port],
                       capture_output=True, timeout=60)
        thread.join(10)
        if "comm" in result:
            result["comm"].Disconnect()
        raise problem
    if "error" in result:
        raise ConnectError(f"MPI accept failed: {str(result['error']).splitlines()[0]}")
    return result["comm"]


def join_port(lifeline: HeadLifeline, workers: int, timeout: float, check, what: str) -> object:
    """Open an MPI port, hand it to ``workers`` hellos, accept them; the merged communicator."""
    from mpi4py import MPI

    port = MPI.Open_port()
    deadline = time.monotonic() + timeout
    try:
        try:
            lifeline.accept(workers, port, timeout, check)
        except TimeoutError as exc:
            raise ConnectError(f"ClusterEnv: {exc} within {timeout:.0f} s ({what})") from None
        inter = _accept(port, deadline, check)
    finally:
        MPI.Close_port(port)
    comm = inter.Merge(high=False)
    inter.Free()
    return comm


def worker_command(python: str, *where: str) -> list[str]:
    return [python, "-m", "hpcrl.clusterenv.worker", *where]


def connect_local(workers: int, mpiexec: str, mpiexec_args: list[str], python: str, timeout: float,
                  host: str | None) -> Link:
    from hpcrl.launch import mpi_flavour, rank_environment

    lifeline = HeadLifeline(host or "127.0.0.1")
    cmd = [mpiexec]
    if mpi_flavour(mpiexec) == "mpich":
        cmd.append("-disable-auto-cleanup")
    cmd += ["-n", str(workers), *mpiexec_args, *worker_command(python, "--head", lifeline.address)]
    env = rank_environment(os.environ)
    for key in [k for k in env if k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_"))]:
        del env[key]  # the head may itself be a singleton MPI process: its PMI settings are not the workers'
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)

    def check():
        if proc.poll() is not None:
            raise ConnectError(f"ClusterEnv: the worker launcher exited with code {proc.returncode} before "
                               f"all {workers} workers connected: {' '.join(cmd[:4])} ...")

    try:
        comm = join_port(lifeline, workers, timeout, check, f"started with {cmd[0]}")
    except BaseException:
        lifeline.close()
        _stop(proc)
        raise
    return Link(comm, lifeline, proc)


def connect_world(workers: int, timeout: float, host: str | None) -> Link:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()
    lifeline = HeadLifeline(host)
    comm.bcast(lifeline.address, root=0)
    try:
        lifeline.accept(workers, "", timeout)
    except TimeoutError as exc:
        raise ConnectError(f"ClusterEnv: {exc} within {timeout:.0f} s (ranks of this MPI job)") from None
    return Link(comm, lifeline)


def _stop(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)
