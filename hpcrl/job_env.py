"""What the environment says about ranks, with nothing heavy imported (``hpcrl run`` reads it before its own imports).

:data:`RANK_ENV` is what every rank gets, :func:`rank_environment` adds it to an environment, and :func:`job_rank`
says whether this process already is a rank of a multi-rank job.
"""
from __future__ import annotations

from collections.abc import Mapping

# Environment variables that every rank gets: from the local launcher, and exported by the batch
# scripts and Parsl apps (slurm_templates/_ranks.sh.j2 renders this dict).
RANK_ENV = {
    "HDF5_USE_FILE_LOCKING": "FALSE",  # HDF5 file locks fail on Lustre and NFS; hpcrl opens files with locking=False anyway
    "OMP_NUM_THREADS": "1",  # one core per rank; torch threads are set again in runtime.runners.mpi
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


def rank_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The launcher's environment plus what every rank needs (see RANK_ENV); explicit values win."""
    env = dict(base)
    for key, value in RANK_ENV.items():
        env.setdefault(key, value)
    return env
