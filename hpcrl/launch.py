"""Config -> the command line that starts the ranks.

Every launcher of :mod:`hpcrl.launchers` starts the same per-rank command, :func:`rank_command`:
locally ``hpcrl run`` runs :func:`local_command` (``LocalMpiexec``'s words + it); the batch
scripts (``hpcrl submit``) put it after the site's ``Srun`` or ``PalsMpiexec`` line; a Parsl app
puts it after ``$PARSL_MPI_PREFIX`` (``ParslMpiPrefix``).
Everything here is pure string work except :func:`find_mpiexec` and :func:`mpi_flavour`,
which look at the filesystem and run ``mpiexec --version`` when asked (never at import).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from hpcrl.config import ContainerConfig, LaunchConfig
from hpcrl.errors import ConfigError
from hpcrl.job_env import RANK_ENV, job_rank, rank_environment  # noqa: F401 - their home before job_env.py
from hpcrl.launch_container import wrap
from hpcrl.launchers import LocalMpiexec

NO_MPIEXEC_HELP = (
    "install one with `pip install mpich` (or `pip install 'hpcrl[local-mpi]'`), "
    "or load your site's MPI module (e.g. `module load cray-mpich`), "
    "or name it in launch.mpiexec"
)


def find_mpiexec(launch: LaunchConfig, python: str = sys.executable) -> str:
    """The mpiexec to use: an explicit path, else the one next to the interpreter, else PATH."""
    name = launch.mpiexec
    if os.sep in name:
        if Path(name).is_file() and os.access(name, os.X_OK):
            return name
        raise ConfigError(f"launch.mpiexec: {name!r} is not an executable file; {NO_MPIEXEC_HELP}")
    beside = Path(python).parent / name  # a venv's bin/ (pip install mpich puts mpiexec there)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise ConfigError(f"launch.mpiexec: no {name!r} found next to {python} or on PATH; {NO_MPIEXEC_HELP}")


def mpi_flavour(mpiexec: str) -> str:
    """'mpich', 'openmpi' or 'unknown', from ``mpiexec --version``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (out.stdout + out.stderr).lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    return "unknown"


OPENMPI_BTL = "self,tcp"
"""Open MPI's byte transfer layers for a local job. Open MPI 4.1's one-sided ``osc/rdma`` emulates atomics
over a BTL, and a Compare_and_swap crashes over the shared-memory one (``mca_btl_vader_emu_acswap``: SIGSEGV on
a null endpoint, the parameter rank's CAS on its own window: transport/windows.py) and over libfabric's
(``mca_btl_ofi_acswap``, a learner's CAS on rank 0's window), both measured with Debian's 4.1.4; over
``self`` and ``tcp`` the same atomics run."""


def openmpi_environment(base: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """What an Open MPI job's ranks need beside ``base`` (the environment), and the one line that says so; none
    when the user chose the transports (``OMPI_MCA_btl`` or ``OMPI_MCA_osc`` set)."""
    if "OMPI_MCA_btl" in base or "OMPI_MCA_osc" in base:
        return {}, None
    return {"OMPI_MCA_btl": OPENMPI_BTL}, (
        f"Open MPI: OMPI_MCA_btl={OPENMPI_BTL} (Open MPI 4.1's one-sided atomics crash over its shared-memory "
        "and libfabric BTLs; set OMPI_MCA_btl or OMPI_MCA_osc to choose otherwise)")


def rank_command(run_dir: str | Path, *, python: str = sys.executable, resume: bool = False,
                 progress: str = "plain", container: ContainerConfig | None = None,
                 binds: Iterable[str] = (), fit_actors: bool = False) -> list[str]:
    """The argv of one rank, the same for every launcher (local mpiexec, batch scripts, Parsl apps).

    ``python -m hpcrl.runtime.runners.mpi RUN_DIR --progress=MODE [--resume] [--fit-actors]``; the run directory
    holds the resolved ``config.yaml`` (``fit_actors``: the actors are the ranks the job has beyond the
    parameter and learner ranks, for a job whose node count varies). With a container the rank runs inside it with the image's Python;
    ``binds`` are the site's host paths every container needs, and the run directory's parent is
    bound too (apptainer binds only home and cwd, podman-hpc nothing; shifter mounts scratch and
    home itself and refuses other volumes).
    """
    cmd = [python, "-m", "hpcrl.runtime.runners.mpi", str(run_dir), f"--progress={progress}"]
    if resume:
        cmd.append("--resume")
    if fit_actors:
        cmd.append("--fit-actors")
    if container is None:
        return cmd
    binds = list(binds)
    if container.runtime != "shifter":
        binds.append(str(Path(run_dir).parent))
    return wrap(cmd, container, binds)


def local_command(launch: LaunchConfig, num_ranks: int, run_dir: str | Path, *, mpiexec: str,
                  flavour: str, python: str = sys.executable, resume: bool = False,
                  progress: str = "plain") -> list[str]:
    """``mpiexec -n N [--oversubscribe] ARGS... python -m hpcrl.runtime.runners.mpi RUN_DIR`` (``LocalMpiexec``)."""
    launcher = LocalMpiexec(mpiexec, flavour, tuple(launch.mpiexec_args))
    return launcher.words(num_ranks, num_ranks) + rank_command(run_dir, python=python, resume=resume,
                                                               progress=progress, container=launch.container)
