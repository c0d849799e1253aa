"""One hpcrl run as one Parsl MPI app: its job directory, resource specification and bash command.

The workflows in ``workflows/`` call :func:`prepare` for each run and hand ``spec.command`` to a
``@bash_app`` together with ``parsl_resource_specification=spec.resources``. The command is
``slurm_templates/parsl_app.sh.j2``: the batch scripts' rank environment, container setup and
start-or-resume (``_ranks.sh.j2``), then the ranks after ``$PARSL_MPI_PREFIX``
(:class:`hpcrl.launchers.ParslMpiPrefix`: Parsl's srun or mpiexec for the nodes it gave the app,
ending with the site launcher's binding options). When the app runs again (a Parsl retry) the
run resumes from its last checkpoint.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from parsl import bash_app

from hpcrl.config import RunConfig
from hpcrl.errors import ConfigError
from hpcrl.launchers import ParslMpiPrefix, for_site
from hpcrl.sites import Site, load_site
from hpcrl.sites.parsl_configs import BATCH_SITE, SITES
from hpcrl.submit import JOB_SUFFIX, check_path, layout, plan_rank_start, prepare_job_dir, render_template


@dataclass(frozen=True)
class AppRun:
    run_dir: Path
    job_dir: Path
    resources: dict
    """parsl_resource_specification: num_nodes, ranks_per_node, num_ranks, launcher_options."""
    command: str
    """The bash app's script (slurm_templates/parsl_app.sh.j2, every path quoted)."""


def app_launcher(site: Site | None) -> ParslMpiPrefix:
    """The launcher of an app on ``site``: Parsl's prefix over the site's own launcher (None: this machine)."""
    return ParslMpiPrefix(for_site(site) if site is not None else None)


def launcher_options(site: Site | None, cpus_per_rank: int | None) -> str:
    """Options appended to $PARSL_MPI_PREFIX: the site launcher's binding, as in the batch scripts."""
    return app_launcher(site).launcher_options(cpus_per_rank)


def prepare(cfg: RunConfig, site: str, run_dir: str | Path, *, nodes: int | None = None,
            python: str | None = None) -> AppRun:
    """Write RUN_DIR.job/config.yaml and compose the app for one run of ``cfg`` on ``site``."""
    if site not in SITES:
        raise ConfigError(f"--site: unknown Parsl site {site!r}; known: {', '.join(SITES)}")
    if not cfg.uses_mpi:
        raise ConfigError("launch.runner: serial runs every role in one process; a Parsl MPI app starts MPI ranks "
                          "(use -o launch.runner=mpi)")
    run_dir = Path(check_path("--run-dir", Path(run_dir).absolute()))
    job_dir = Path(str(run_dir) + JOB_SUFFIX)
    python = check_path("--python", python or sys.executable)
    ranks = cfg.num_ranks
    facts = load_site(BATCH_SITE[site]) if BATCH_SITE[site] else None
    if facts is None:
        nodes, per_node, cpus = 1, ranks, None
    else:
        nodes, per_node, cpus = layout(ranks, facts, nodes)
    launcher = app_launcher(facts)
    command = render_template("parsl_app.sh.j2", run_dir=run_dir, job_dir=job_dir,
                              rank_start=plan_rank_start(cfg, facts, run_dir, python),
                              resume_note=" (the app runs again)", launch=launcher.prefix(ranks, per_node, cpus))
    resources = launcher.resources(ranks, per_node, cpus, nodes)
    prepare_job_dir(cfg, run_dir, job_dir)  # only once everything above is valid
    return AppRun(run_dir=run_dir, job_dir=job_dir, resources=resources, command=command)


@bash_app(executors=["mpi"])
def mpi_run(command: str, stdout=None, stderr=None, parsl_resource_specification: dict | None = None) -> str:
    """The Parsl app of one run: ``command`` from :func:`prepare` (it starts the ranks with $PARSL_MPI_PREFIX).

    Defined in the package, not in a workflow script, so the worker can import it by name.
    """
    return command
