"""Config -> the command line that starts the ranks.

Locally ``hpcrl run`` starts ``mpiexec -n N python -m hpcrl.runtime.main RUN_DIR`` itself;
on a site the batch script starts the same per-rank command with ``srun`` (Slurm) or the
PALS ``mpiexec`` (PBS at ALCF), optionally inside a container. Everything here is pure
string work except :func:`find_mpiexec` and :func:`mpi_flavour`, which look at the
filesystem and run ``mpiexec --version`` when asked (never at import).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from hpcrl.config import ContainerConfig, LaunchConfig
from hpcrl.errors import ConfigError

NO_MPIEXEC_HELP = (
    "install one with `pip install mpich` (or `pip install 'hpcrl[local-mpi]'`), "
    "or load your site's MPI module (e.g. `module load cray-mpich`), "
    "or name it in launch.mpiexec"
)

# Environment variables that every rank gets from the local launcher.
RANK_ENV = {
    "HDF5_USE_FILE_LOCKING": "FALSE",  # Lustre and concurrent readers (DESIGN.md section 6)
    "OMP_NUM_THREADS": "1",  # one core per rank; torch threads are set again in runtime.main
    "PYTHONUNBUFFERED": "1",
    "UCX_LOG_LEVEL": "error",  # MPICH's UCX netmod warns about cached RMA keys at exit
}


def job_rank(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(rank, size) when this process is already a rank of a multi-rank job, else None.

    Recognises MPICH/Hydra and Cray PMI (PMI_RANK, PMI_SIZE), Open MPI (OMPI_COMM_WORLD_*),
    a Slurm job step (SLURM_PROCID with SLURM_STEP_NUM_TASKS > 1; the batch script itself
    has no step task count, so ``hpcrl run`` inside an sbatch script still launches) and
    PALS (PALS_RANKID, Aurora/Polaris ``mpiexec``).
    """

    def num(key: str) -> int | None:
        value = environ.get(key, "")
        return int(value) if value.strip().isdigit() else None

    for rank_key, size_key in (
        ("PMI_RANK", "PMI_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
    ):
        rank, size = num(rank_key), num(size_key)
        if rank is not None and size is not None and size > 1:
            return rank, size
    rank = num("PALS_RANKID")
    if rank is not None:
        return rank, num("PALS_SIZE") or num("PMI_SIZE") or 0
    return None


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


def rank_command(run_dir: str | Path, python: str = sys.executable, resume: bool = False,
                 progress: str = "plain", container: ContainerConfig | None = None) -> list[str]:
    """What every rank executes: ``python -m hpcrl.runtime.main RUN_DIR`` (in a container if asked)."""
    cmd = [python, "-m", "hpcrl.runtime.main", str(run_dir), f"--progress={progress}"]
    if resume:
        cmd.append("--resume")
    return container_wrap(cmd, container) if container else cmd


def container_wrap(cmd: list[str], container: ContainerConfig) -> list[str]:
    """Run ``cmd`` inside the container: the MPI launcher stays outside, one container per rank."""
    if container.runtime == "apptainer":
        opts = ["--nv"] if container.gpu else []
        for b in container.binds:
            opts += ["--bind", b]
        # inside the image the interpreter is the image's own python
        return ["apptainer", "exec", *opts, container.image, "python3", *cmd[1:]]
    if container.runtime == "podman-hpc":
        opts = ["--rm", "--mpi"] + (["--gpu"] if container.gpu else [])
        for b in container.binds:
            src, _, dst = b.partition(":")
            opts += ["-v", f"{src}:{dst or src}"]
        return ["podman-hpc", "run", *opts, container.image, "python3", *cmd[1:]]
    opts = [f"--image={container.image}"] + (["--module=gpu"] if container.gpu else [])
    return ["shifter", *opts, "python3", *cmd[1:]]


def local_command(launch: LaunchConfig, num_ranks: int, run_dir: str | Path, *, mpiexec: str,
                  flavour: str, python: str = sys.executable, resume: bool = False,
                  progress: str = "plain") -> list[str]:
    """``mpiexec -n N [--oversubscribe] ARGS... python -m hpcrl.runtime.main RUN_DIR``.

    MPICH's Hydra places any number of ranks on a small machine; Open MPI needs
    ``--oversubscribe`` when N exceeds the cores.
    """
    cmd = [mpiexec, "-n", str(num_ranks)]
    if flavour == "openmpi" and num_ranks > (os.cpu_count() or 1) and "--oversubscribe" not in launch.mpiexec_args:
        cmd.append("--oversubscribe")
    cmd += list(launch.mpiexec_args)
    return cmd + rank_command(run_dir, python, resume, progress, launch.container)


def srun_command(num_ranks: int, run_dir: str | Path, *, python: str = "python3", resume: bool = False,
                 container: ContainerConfig | None = None, extra: list[str] = ()) -> list[str]:
    """Slurm (NERSC Perlmutter): ``srun -n N --cpu-bind=cores ... python -m hpcrl.runtime.main RUN_DIR``."""
    return ["srun", "-n", str(num_ranks), "--cpu-bind=cores", *extra,
            *rank_command(run_dir, python, resume, "plain", container)]


def pals_command(num_ranks: int, ranks_per_node: int, run_dir: str | Path, *, python: str = "python3",
                 resume: bool = False, container: ContainerConfig | None = None, extra: list[str] = ()) -> list[str]:
    """PBS + PALS (ALCF Polaris, Aurora): ``mpiexec -n N --ppn P --cpu-bind depth ... RUN_DIR``."""
    return ["mpiexec", "-n", str(num_ranks), "--ppn", str(ranks_per_node), "--cpu-bind", "depth", *extra,
            *rank_command(run_dir, python, resume, "plain", container)]


def rank_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The launcher's environment plus what every rank needs (see RANK_ENV); explicit values win."""
    env = dict(base)
    for key, value in RANK_ENV.items():
        env.setdefault(key, value)
    return env
