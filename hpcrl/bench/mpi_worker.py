"""A bench's MPI worker job: ``mpiexec -n N python -m mpi4py -m MODULE ARGS`` with this Python's mpiexec (where
the environment has one), in its own session, killed whole when it outlives its timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


class WorkerFailed(RuntimeError):
    """The worker job timed out or failed; the message is the one line the bench prints."""


def run_worker(ranks: int, module: str, args: list[str], timeout: float, what: str,
               env: dict[str, str] | None = None) -> str:
    """The worker job's stdout. ``what`` names it in the one line of a :class:`WorkerFailed`; ``env``: variables
    added to this process's (UCX's warnings are silenced unless set)."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(ranks), sys.executable, "-m", "mpi4py",
           "-m", module, *args]
    full_env = dict(os.environ, UCX_LOG_LEVEL=os.environ.get("UCX_LOG_LEVEL", "error"), **(env or {}))
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise WorkerFailed(f"{what} was killed after {timeout:g} s") from None
    if proc.returncode:
        raise WorkerFailed(f"{what} failed ({proc.returncode})")
    return out
