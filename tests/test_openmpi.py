"""hpcrl under Debian's Open MPI (4.1): the default job and the RMA windows' stress bodies.

mpi4py's wheel carries an extension for each MPI ABI; ``MPI4PY_LIBMPI`` naming Open MPI's libmpi.so.40 makes
it load the Open MPI one, so the ranks run Open MPI's library under its own ``mpiexec`` (what a second venv
with mpi4py built against Open MPI would do, without the 4-minute build). Open MPI 4.1's one-sided atomics
crash over its shared-memory and libfabric BTLs; ``hpcrl run`` says so in one line and sets
``OMPI_MCA_btl=self,tcp`` (launch.openmpi_environment), which the stress bodies use too.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_programs.launcher import run_bounded

from hpcrl.io import read_table
from hpcrl.launch import OPENMPI_BTL, mpi_flavour, openmpi_environment

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = "/usr/bin/mpiexec.openmpi"
LIBMPI = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"


def _has_openmpi_extension() -> bool:
    """mpi4py's wheel (4.1+) holds ``MPI.openmpi.*.so`` beside ``MPI.mpich.*.so``; a source build has one MPI."""
    import mpi4py

    return any(Path(mpi4py.__file__).parent.glob("MPI.openmpi.*"))


pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(not (Path(MPIEXEC).exists() and Path(LIBMPI).exists()),
                                 reason="Debian's Open MPI is not installed (apt-get install openmpi-bin; "
                                        "scripts/install_system_deps.sh does it as root)"),
              pytest.mark.skipif(not _has_openmpi_extension(),
                                 reason="this mpi4py has no Open MPI extension (a source build against one MPI; "
                                        "the PyPI wheel >= 4.1 has both)")]


def openmpi_env(**extra: str) -> dict[str, str]:
    """mpi4py on Open MPI's library; Open MPI's mpiexec allowed as root (CI runs as root)."""
    return dict(os.environ, MPI4PY_LIBMPI=LIBMPI, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                PYTHONUNBUFFERED="1", **extra)


def run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    code, out = run_bounded(cmd, env, timeout, f"{' '.join(cmd[:4])}...")
    return subprocess.CompletedProcess(cmd, code, out, "")


def test_the_launcher_knows_open_mpi_and_leaves_a_users_transport_choice_alone():
    assert mpi_flavour(MPIEXEC) == "openmpi"
    needed, line = openmpi_environment({})
    assert needed == {"OMPI_MCA_btl": OPENMPI_BTL} and "OMPI_MCA_btl=self,tcp" in line
    assert openmpi_environment({"OMPI_MCA_btl": "self,vader"}) == ({}, None)
    assert openmpi_environment({"OMPI_MCA_osc": "ucx"}) == ({}, None)


@pytest.mark.timeout(240)
def test_the_default_job_runs_under_open_mpi_and_says_what_it_set(tmp_path):
    probe = run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version())"], openmpi_env(), 60)
    assert probe.stdout.startswith("Open MPI v4"), probe.stdout  # the ranks below run Open MPI's library
    run_dir = tmp_path / "run"
    done = run([sys.executable, "-m", "hpcrl", "run", "-o", f"launch.mpiexec={MPIEXEC}", "-o", "stop.total_env_steps=3000",
                "-o", "launch.timeout_seconds=180", "-o", f"io.run_dir={run_dir}"], openmpi_env(), 220)
    assert done.returncode == 0, done.stdout[-4000:]
    assert f"hpcrl run: Open MPI: OMPI_MCA_btl={OPENMPI_BTL} (" in done.stdout
    assert "stop.total_env_steps=3000 reached" in done.stdout
    grads = read_table(run_dir / "run.h5", "gradients")
    assert (grads["admitted"] == 1).sum() > 0  # learners pushed through the windows and rank 0 admitted them


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n, name, args", [
    (6, "mailbox", (3, 2, 300, 2000, 0)),  # 5 pushers into 3 groups (two shared), 2 slots each, random sleeps
    (4, "mailbox", (3, 2, 40, 100_000, 0.01, 1)),  # back pressure: learners wait for a slot
    (3, "board", (20_000, 1, 0.6)),  # the reader's slot rewritten under it: the seqlock must hold
], ids=["mailbox-shared-groups", "mailbox-back-pressure", "board-torn-copies"])
def test_the_windows_stress_bodies_hold_under_open_mpi(n, name, args):
    cmd = [MPIEXEC, "--oversubscribe", "-n", str(n), sys.executable, "-m", "mpi4py",
           str(ROOT / "tests" / "mpi_programs" / "stress.py"), name, *map(str, args)]
    done = run(cmd, openmpi_env(PYTHONPATH=str(ROOT), OMPI_MCA_btl=OPENMPI_BTL), 180)
    assert done.returncode == 0, done.stdout[-4000:]
    assert f"OK {name}" in done.stdout, done.stdout[-2000:]
