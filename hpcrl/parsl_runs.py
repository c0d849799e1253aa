"""One hpcrl run as one Parsl MPI app: its job directory, resource specification and bash command.

The workflows in ``workflows/`` call :func:`prepare` for each run and hand ``spec.command`` to a
``@bash_app`` together with ``parsl_resource_specification=spec.resources``. The command starts the
ranks with ``$PARSL_MPI_PREFIX`` (srun or mpiexec for the nodes Parsl gave the app) and, like the
batch scripts, resumes the run from its last checkpoint when the app runs again (a Parsl retry).
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from parsl import bash_app

from hpcrl.config import RunConfig
from hpcrl.launch_container import container_prefix, wrap
from hpcrl.sites import load_site
from hpcrl.sites.parsl_configs import BATCH_SITE, SITES
from hpcrl.errors import ConfigError
from hpcrl.submit import CHECKPOINT, JOB_SUFFIX, check_path, layout, prepare_job_dir


@dataclass(frozen=True)
class AppRun:
    run_dir: Path
    job_dir: Path
    resources: dict
    """parsl_resource_specification: num_nodes, ranks_per_node, num_ranks, launcher_options."""
    command: str
    """The bash app's command line (every path quoted)."""


def launcher_options(site: str, cpus_per_rank: int | None) -> str:
    """Options appended to $PARSL_MPI_PREFIX, matching the batch templates' launch lines."""
    if site == "local":
        return "-launcher fork"  # Hydra: every rank on this machine, no ssh
    if site == "local-slurm":
        return "--mpi=pmi2 --overcommit"  # PMI-2 for the mpich wheel; more ranks than the test node's cores
    if site == "perlmutter":
        return f"--cpus-per-task={cpus_per_rank} --cpu-bind=cores --gpu-bind=none"
    return f"--depth={cpus_per_rank} --cpu-bind depth"  # PALS mpiexec (Polaris, Aurora)


def prepare(cfg: RunConfig, site: str, run_dir: str | Path, *, nodes: int | None = None,
            python: str | None = None) -> AppRun:
    """Write RUN_DIR.job/config.yaml and compose the app for one run of ``cfg`` on ``site``."""
    if site not in SITES:
        raise ConfigError(f"--site: unknown Parsl site {site!r}; known: {', '.join(SITES)}")
    if not cfg.uses_mpi:
        raise ConfigError(f"algo.name: {cfg.algo.name!r} runs in one process; the workflows run algo.name=ppo jobs")
    run_dir = Path(check_path("--run-dir", Path(run_dir).absolute()))
    job_dir = Path(str(run_dir) + JOB_SUFFIX)
    python = check_path("--python", python or sys.executable)
    ranks = cfg.num_ranks
    facts = BATCH_SITE[site]
    if facts is None:
        nodes, per_node, cpus = 1, ranks, None
    else:
        nodes, per_node, cpus = layout(ranks, load_site(facts), nodes)
    binds = [] if cfg.launch.container is None or cfg.launch.container.runtime == "shifter" else [str(run_dir.parent)]
    if cfg.launch.container is not None:
        container_prefix(cfg.launch.container, binds)  # validate before anything is written
    config_path = prepare_job_dir(cfg, run_dir, job_dir)
    rank = wrap([python, "-m", "hpcrl", "run", "--inside-mpi"], cfg.launch.container, binds)
    q = shlex.quote
    command = (
        f"cd {q(str(job_dir))} && export HDF5_USE_FILE_LOCKING=FALSE OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 && "
        f"if [ -f {q(str(run_dir / CHECKPOINT))} ]; then set -- --resume {q(str(run_dir))}; "
        f"else {{ [ ! -e {q(str(run_dir))} ] || mv {q(str(run_dir))} {q(str(run_dir))}.incomplete-$(date +%s); }}; "
        f"set -- {q(str(config_path))}; fi && "
        f"$PARSL_MPI_PREFIX {' '.join(q(w) for w in rank)} \"$@\""
    )
    resources = {"num_nodes": nodes, "ranks_per_node": per_node, "num_ranks": ranks,
                 "launcher_options": launcher_options(site, cpus)}
    return AppRun(run_dir=run_dir, job_dir=job_dir, resources=resources, command=command)


@bash_app(executors=["mpi"])
def mpi_run(command: str, stdout=None, stderr=None, parsl_resource_specification: dict | None = None) -> str:
    """The Parsl app of one run: ``command`` from :func:`prepare` (it starts the ranks with $PARSL_MPI_PREFIX).

    Defined in the package, not in a workflow script, so the worker can import it by name.
    """
    return command
