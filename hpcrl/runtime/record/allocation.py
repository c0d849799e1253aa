"""The batch job a run's ranks run in, as run.h5's ``allocations`` row (one per start: first run, each resume).

The scheduler's accounting is what a user is billed by: ``hpcrl analyze`` looks each recorded job up in
``sacct`` and prices its node-seconds with the site's charge factor. The batch script that ``hpcrl submit``
writes exports the site's name and charge (``HPCRL_SITE``, ``HPCRL_CHARGE_UNIT``,
``HPCRL_CHARGE_PER_NODE_HOUR``); the job itself comes from the scheduler's own variables, which mpiexec and
srun pass on to every rank. Outside a batch job there is no row.
"""
from __future__ import annotations

import math
import os
from typing import Mapping

from hpcrl.io.schema import SCHEDULERS


def batch_job(environ: Mapping[str, str] | None = None) -> dict | None:
    """The allocations row's columns for this process's batch job (no ``time``), or None outside one."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID"):
        scheduler, job_id = "slurm", env["SLURM_JOB_ID"]
        text = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
        nodes = int(text) if text.isdigit() else -1
    elif env.get("PBS_JOBID"):
        scheduler, job_id = "pbs", env["PBS_JOBID"]
        nodes = _pbs_nodes(env.get("PBS_NODEFILE", ""))
    else:
        return None
    try:
        per_node_hour = float(env.get("HPCRL_CHARGE_PER_NODE_HOUR", "nan"))
    except ValueError:
        per_node_hour = math.nan
    return {"scheduler": SCHEDULERS.index(scheduler), "job_id": job_id.encode(),
            "step_id": env.get("SLURM_STEP_ID", "").encode(), "cluster": env.get("SLURM_CLUSTER_NAME", "").encode(),
            "nodes": nodes, "site": env.get("HPCRL_SITE", "").encode(),
            "charge_unit": env.get("HPCRL_CHARGE_UNIT", "").encode(), "charge_per_node_hour": per_node_hour}


def _pbs_nodes(nodefile: str) -> int:
    """Distinct hosts in $PBS_NODEFILE (one line per rank slot), or -1 when it cannot be read."""
    try:
        with open(nodefile) as f:
            return len({line.strip() for line in f if line.strip()})
    except OSError:
        return -1
