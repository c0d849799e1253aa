"""A sweep as a Slurm job array: task I runs the sweep's run I (``hpcrl sweep SPEC --out DIR --task I``).

Each task is one node with as many tasks as the largest run has ranks (one for a serial or simulated run); the
array runs ``parallel`` tasks at a time. A task's run starts, or resumes from its checkpoint when the task runs
again: the walltime warning (``--signal=B:USR1``) makes the run checkpoint and stop, and the task requeues
itself (``scontrol requeue JOB_TASK``), up to ``--max-restarts`` times; ``hpcrl sweep SPEC`` (here, or
another array) goes on with whatever is left after that. Every task updates the one state file under its lock.

Refused before anything is written (one line, exit 2): a PBS site (its job arrays are not written yet: run the
sweep on a node with ``hpcrl sweep``), a run that needs more than one node, more runs than the site's largest
array (Slurm's MaxArraySize, from ``scontrol show config`` where Slurm answers, else the site file's
``max_array_size``, else Slurm's default of 1001), and the flags ``hpcrl submit`` refuses (names, walltime,
queue limits, account).
"""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpcrl.errors import ConfigError
from hpcrl.sites import Site
from hpcrl.sweep.spec import SweepSpec

SLURM_DEFAULT_MAX_ARRAY_SIZE = 1001
"""Slurm's MaxArraySize when slurm.conf does not set it (task indexes 0..1000)."""
TEMPLATE = "sweep_array.sbatch.j2"


@dataclass(frozen=True)
class SweepArray:
    name: str
    spec: str
    sweep_dir: str
    tasks: int
    parallel: int
    ranks: int
    time: str
    queue: str | None
    account: str | None
    warning_seconds: int
    max_restarts: int
    python: str
    env_script: str | None

    @property
    def script_path(self) -> str:
        return f"{self.sweep_dir}/{self.name}.sbatch"


def max_array_size(site: Site) -> tuple[int, str]:
    """(the largest array the site takes, where that number comes from)."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=20)
        m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out.stdout, re.M) if out.returncode == 0 else None
        if m:
            return int(m[1]), "scontrol show config"
    except (OSError, subprocess.TimeoutExpired):
        pass
    if site.max_array_size:
        return site.max_array_size, f"sites/{site.name}.yaml"
    return SLURM_DEFAULT_MAX_ARRAY_SIZE, "Slurm's default"


def run_ranks(spec: SweepSpec, site: Site) -> int:
    """The most ranks any run needs on the array's one node (1 for a run in one process)."""
    from hpcrl.config import load_config
    from hpcrl.submit import layout

    most = 1
    for run in spec.runs:
        cfg = load_config(run.config, list(run.overrides))
        if not cfg.uses_mpi:
            continue
        nodes, _, _ = layout(cfg.num_ranks, site)
        if nodes > 1:
            raise ConfigError(f"run {run.name}: {cfg.num_ranks} ranks need {nodes} nodes of {site.name}; a sweep's "
                              "array task is one node (submit that run with hpcrl submit)")
        most = max(most, cfg.num_ranks)
    return most


def plan_array(spec: SweepSpec, sweep_dir: Path, site: Site, *, parallel: int, time: str | None = None,
               queue: str | None = None, account: str | None = None, warning_seconds: int = 120,
               max_restarts: int = 10, python: str | None = None, env_script: str | None = None) -> SweepArray:
    """Validate the array against the site; nothing is written."""
    from hpcrl.submit import check_batch_flags, check_name, check_path

    if site.scheduler != "slurm":
        raise ConfigError(f"--site {site.name} schedules with {site.scheduler}; a sweep's job array is written for "
                          "Slurm only (run the sweep on a node with hpcrl sweep SPEC, or one hpcrl submit per run)")
    limit, source = max_array_size(site)
    if len(spec.runs) > limit:
        raise ConfigError(f"sweep {spec.name}: {len(spec.runs)} runs, more than the {limit} tasks of {site.name}'s "
                          f"largest job array (MaxArraySize, {source}); split the spec")
    queue, time = check_batch_flags(site, queue, time, account, warning_seconds, max_restarts, nodes=1)
    return SweepArray(name=check_name("name", f"sweep-{spec.name}"[:64]), spec=check_path("SPEC", spec.path),
                      sweep_dir=check_path("--out", sweep_dir), tasks=len(spec.runs), parallel=parallel,
                      ranks=run_ranks(spec, site), time=time, queue=queue, account=account,
                      warning_seconds=warning_seconds, max_restarts=max_restarts,
                      python=check_path("--python", python or sys.executable),
                      env_script=check_path("--env-script", Path(env_script).resolve()) if env_script else None)


def render_array(array: SweepArray, site: Site) -> str:
    from hpcrl.submit import render_template

    return render_template(TEMPLATE, array=array, site=site)


def submit_array(array: SweepArray, script: str) -> str:
    """Write the script into the sweep's directory and sbatch it; the array's job id."""
    from hpcrl.submit import run_submit

    path = Path(array.script_path)
    path.write_text(script)
    path.chmod(0o750)
    return run_submit(["sbatch", "--parsable", str(path)], "slurm", array.sweep_dir, "the array")
