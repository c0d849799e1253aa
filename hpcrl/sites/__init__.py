"""Scheduler facts per site (``hpcrl/sites/<name>.yaml``), the one place they are written.

Loading a site reads one small YAML file from this package and nothing else: no scheduler
calls, no environment variables. ``hpcrl submit --site NAME`` renders the site's template
from ``slurm_templates/`` with these facts; the Parsl config factories in
``hpcrl.sites.parsl_configs`` and the Parsl apps (``hpcrl.parsl_runs``) read the same ones
(``parsl_configs.BATCH_SITE`` says which site file serves which Parsl site).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hpcrl.errors import ConfigError

SITE_DIR = Path(__file__).parent
Runtime = Literal["apptainer", "podman-hpc", "shifter"]


class Queue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_nodes: int = Field(ge=1)
    max_time: str = Field(pattern=r"^\d{1,3}:[0-5]\d:[0-5]\d$")
    """Longest walltime the queue (PBS queue, Slurm QOS or partition) accepts, HH:MM:SS."""
    min_nodes: int = Field(1, ge=1)
    max_jobs_per_user: int | None = Field(None, ge=1)
    """Jobs one user may have running or queued in it at once (ALCF's debug queues: 1); None: no limit known."""


class Site(BaseModel):
    """What a batch script for one machine needs to know; one YAML file per site."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str
    scheduler: Literal["slurm", "pbs"]
    template: str
    """File in slurm_templates/ that renders the batch script."""
    launcher: Literal["srun", "pals"]
    """How the ranks start: Slurm's srun, or the Cray PALS mpiexec of PBS sites (``hpcrl.launchers.for_site``)."""
    srun_mpi: str | None = None
    """srun --mpi=VALUE (pmi2 for the PyPI mpich wheel; none: the site default, e.g. cray_shasta)."""
    cores_per_node: int | None = Field(None, ge=1)
    """Physical cores; None when unknown (generic clusters): then no CPU binding is asked for."""
    threads_per_core: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    max_ranks_per_node: int | None = Field(None, ge=1)
    """Default cap on ranks per node when --nodes is not given (None: all ranks on one node)."""
    overcommit: bool = False
    """Allow more ranks than cores (#SBATCH --overcommit): small test machines."""
    max_array_size: int | None = Field(None, ge=1)
    """Slurm's MaxArraySize (a sweep's job array has at most this many tasks) where ``scontrol show config``
    cannot say (rendering away from the site); None: Slurm's default, 1001."""
    account_required: bool = False
    default_queue: str | None = None
    default_time: str = Field("00:30:00", pattern=r"^\d{1,3}:[0-5]\d:[0-5]\d$")
    queues: dict[str, Queue] = Field(default_factory=dict)
    """Known queues with their limits; empty: any queue name is passed through."""
    only_listed_queues: bool = False
    """True: ``queues`` names every queue there is; any other is refused before a script is written."""
    constraint: str | None = None
    """Slurm --constraint (Perlmutter: gpu / cpu)."""
    filesystems: str | None = None
    """PBS -l filesystems=... (ALCF: home:eagle, home:flare)."""
    filesystem_mounts: dict[str, str] = Field(default_factory=dict)
    """Path prefix -> PBS file system name, added to filesystems when the run directory lies there."""
    select_extra: str | None = None
    """Appended to PBS -l select=N (Polaris: system=polaris)."""
    filesystem_note: str = ""
    """Where runs should live on this machine (printed in docs and in the script header)."""
    setup: list[str] = Field(default_factory=list)
    """Shell lines run before the ranks start (module loads); trusted: they come from this package."""
    env: dict[str, str] = Field(default_factory=dict)
    """Exported before launch; values are quoted literally."""
    containers: dict[Runtime, list[str]] = Field(default_factory=dict)
    """Container runtimes the site supports, each with its setup lines (module loads, ABI paths)."""
    container_binds: list[str] = Field(default_factory=list)
    """Host paths every container on this site needs (Cray MPICH and PALS for the hybrid MPI model)."""
    resubmit: Literal["requeue", "qsub"] = "requeue"
    """After the walltime warning: scontrol requeue (Slurm) or submit the same script again (PBS)."""
    charge_unit: str = "node-hours"
    """What the centre bills the allocation in (NERSC: GPU or CPU node-hours; ALCF: node-hours)."""
    charge_per_node_hour: float = Field(1.0, ge=0)
    """The charge factor: units billed per node-hour of a job (QOS multipliers such as NERSC premium's are
    not in it). Every run records it with its job id (run.h5 ``allocations``); ``hpcrl analyze`` prices the
    job's node-seconds from sacct with it."""


def site_names() -> list[str]:
    return sorted(p.stem for p in SITE_DIR.glob("*.yaml"))


@lru_cache(maxsize=None)
def load_site(name: str) -> Site:
    """The facts of one site; unknown names raise ConfigError listing the known ones."""
    path = SITE_DIR / f"{name}.yaml"
    if name not in site_names():
        raise ConfigError(f"--site: unknown site {name!r}; known sites: {', '.join(site_names())}")
    try:
        return Site.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as exc:  # a broken data file is our bug, but say where
        err = exc.errors()[0]
        raise ConfigError(f"{path}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
