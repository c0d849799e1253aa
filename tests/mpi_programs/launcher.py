"""Start an MPI program under the venv's mpiexec with a hard timeout; kill its process group on failure."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def run_mpi(n: int, program: str, *args: str, timeout: float = 30.0, env: dict[str, str] | None = None) -> str:
    """Run ``tests/mpi_programs/<program>.py`` on n ranks (python -m mpi4py: an exception aborts all ranks);
    ``env``: more environment (MPICH's cliques, say)."""
    cmd = [str(MPIEXEC), "-n", str(n), sys.executable, "-m", "mpi4py", str(HERE / f"{program}.py"), *map(str, args)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), UCX_LOG_LEVEL="error", PYTHONUNBUFFERED="1", **(env or {}))
    code, out = run_bounded(cmd, env, timeout, f"{program} on {n} ranks")
    if code != 0:
        raise AssertionError(f"{program} on {n} ranks exited {code}:\n{out[-4000:]}")
    return out


def run_bounded(cmd: list[str], env: dict[str, str], timeout: float, what: str) -> tuple[int, str]:
    """Run ``cmd`` in a session of its own (from the repository root); its exit code and output. Past ``timeout``
    its whole process group is killed and an AssertionError names ``what``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=ROOT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{what} hung (> {timeout} s):\n{out[-4000:]}") from None
    return proc.returncode, out
