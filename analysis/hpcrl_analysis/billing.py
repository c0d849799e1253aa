"""What the allocation is billed: the batch jobs a run ran in, their node-seconds from the scheduler's accounting.

The serverless and serverful costs of the summary are the cost model's views of the run (active
rank-seconds, or every rank for the whole wall-clock). A centre bills neither: it bills each job's
allocation, nodes x elapsed seconds, whatever the ranks did, times its charge factor. Each start of a
run inside a batch job writes an ``allocations`` row in run.h5 (job id, cluster, the site's charge unit
and factor from ``hpcrl submit``); this module reads those jobs from Slurm's ``sacct``::

    sacct -j ID[,ID...] -D -n -P -o JobID,JobIDRaw,ElapsedRaw,NNodes,State [--clusters NAME]

``-D`` lists every run of a requeued job (each one was billed). A job's billed node-seconds are the
ElapsedRaw x NNodes of its allocation rows (the ``ID`` lines; Slurm bills the allocation, so steps and the
batch shell add nothing); its steps are listed beside them. Jobs that have ended are kept in
``RUN_DIR/accounting.json``, so the run can be priced again where there is no sacct (a copy on a laptop).
PBS jobs (ALCF) are recorded but not read yet: their row says so.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np

from .h5read import Run

SCHEDULERS = ("slurm", "pbs")
"""run.h5 allocations.scheduler codes (hpcrl.io.schema.SCHEDULERS)."""
CACHE = "accounting.json"
FIELDS = ("JobID", "JobIDRaw", "ElapsedRaw", "NNodes", "State")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE", "REQUEUED")
"""sacct states after which a job's (or a requeued run's) elapsed seconds no longer grow."""


def recorded_jobs(run: Run) -> list[dict]:
    """The distinct jobs of run.h5's allocations rows, in the order they first ran: scheduler, job id,
    cluster, site, charge unit and factor (from the job's first row)."""
    t = run.table("allocations")
    jobs: dict[tuple[str, str], dict] = {}
    for i in np.argsort(t["time"], kind="stable") if t else ():
        code = int(t["scheduler"][i])
        scheduler = SCHEDULERS[code] if 0 <= code < len(SCHEDULERS) else str(code)
        job_id, cluster = _text(t["job_id"][i]), _text(t["cluster"][i])
        factor = float(t["charge_per_node_hour"][i])  # NaN: not from an hpcrl submit script
        jobs.setdefault((cluster, job_id), {
            "scheduler": scheduler, "job_id": job_id, "cluster": cluster, "site": _text(t["site"][i]),
            "charge_unit": _text(t["charge_unit"][i]) or "node-hours",
            "charge_per_node_hour": factor if math.isfinite(factor) else 1.0})
    return list(jobs.values())


def billed(run: Run, sacct: str | None = "sacct") -> dict:
    """The run's bill: ``jobs`` (one dict per job: id, state, allocation rows, steps, node_seconds),
    ``node_seconds``, ``charge`` (node-hours x factor) with its ``unit``, and ``note`` (empty when every job was
    read; otherwise why not). ``sacct=None``: only what ``accounting.json`` keeps. Asked once per run."""
    if "bill" in run.cache:
        return run.cache["bill"]
    run.cache["bill"] = bill = _billed(run, sacct)
    return bill


def _billed(run: Run, sacct: str | None) -> dict:
    jobs = recorded_jobs(run)
    if not jobs:
        return {"jobs": [], "node_seconds": math.nan, "charge": math.nan, "unit": "", "note": "not run in a batch job"}
    cache_path = run.path / CACHE
    cache = _read_cache(cache_path)
    notes, changed = [], False
    for job in jobs:
        key = f"{job['cluster']}/{job['job_id']}"
        rows = cache.get(key)
        if rows is None and job["scheduler"] != "slurm":
            notes.append(f"job {job['job_id']}: {job['scheduler']} accounting is not read yet")
            continue
        if rows is None:
            found = _sacct(sacct, job["job_id"], job["cluster"])
            if isinstance(found, str):
                notes.append(f"job {job['job_id']}: {found}")
                continue
            rows = found
            if rows and all(r["State"].split()[0] in ENDED for r in rows if r["JobID"] == job["job_id"]):
                cache[key], changed = rows, True
        job.update(_bill(job["job_id"], rows))
    if changed:
        try:
            cache_path.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
        except OSError:  # a read-only run directory: priced, not kept
            pass
    read = [j for j in jobs if "node_seconds" in j]
    node_seconds = sum(j["node_seconds"] for j in read) if read else math.nan
    charge = sum(j["node_seconds"] / 3600 * j["charge_per_node_hour"] for j in read) if read else math.nan
    units = {j["charge_unit"] for j in read}
    return {"jobs": jobs, "node_seconds": node_seconds, "charge": charge, "unit": " + ".join(sorted(units)),
            "note": "; ".join(notes)}


def _bill(job_id: str, rows: list[dict]) -> dict:
    """A job's allocation runs (``ID`` lines: one per run of a requeued job) and its steps, with node-seconds."""
    runs = [r for r in rows if r["JobID"] == job_id]
    steps = [r for r in rows if r["JobID"].startswith(f"{job_id}.")]
    seconds = sum(int(r["ElapsedRaw"] or 0) * int(r["NNodes"] or 0) for r in runs)
    states = [r["State"].split()[0] for r in runs]
    return {"node_seconds": seconds, "state": states[-1] if states else "unknown", "runs": len(runs),
            "nodes": max((int(r["NNodes"] or 0) for r in runs), default=0),
            "elapsed_seconds": sum(int(r["ElapsedRaw"] or 0) for r in runs),
            "steps": [{"step": r["JobID"], "nodes": int(r["NNodes"] or 0), "elapsed_seconds": int(r["ElapsedRaw"] or 0),
                       "state": r["State"].split()[0]} for r in steps]}


def _sacct(sacct: str | None, job_id: str, cluster: str) -> list[dict] | str:
    """sacct's rows for the job (every run and step), or why there are none."""
    exe = shutil.which(sacct) if sacct else None
    if exe is None:
        return "sacct is not on PATH here (analyse where Slurm's sacct answers, once; the result is kept)"
    cmd = [exe, "-j", job_id, "-D", "-n", "-P", "-o", ",".join(FIELDS)] + (["--clusters", cluster] if cluster else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "sacct did not answer within 60 s"
    if out.returncode != 0:
        err = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        return f"sacct failed: {err}"
    rows = [dict(zip(FIELDS, line.split("|"))) for line in out.stdout.splitlines() if line.count("|") == len(FIELDS) - 1]
    return rows or "sacct knows no such job (another cluster, or accounting not kept here)"


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def markdown(runs: list[Run], bills: list[dict]) -> str:
    """summary.md's section: each run's jobs, their runs and steps, and the bill beside the cost model."""
    lines = ["", "## Billed by the scheduler", "",
             "What the centre charges: each batch job's allocation, nodes x elapsed seconds from `sacct` "
             "(every run of a requeued job), times the site's charge factor. The cost rows above are the cost "
             "model's views (active rank-seconds, or every rank for the wall-clock); the allocation is billed this.",
             "", "| run | job | state | runs | nodes | elapsed (s) | node-seconds | steps |", "|---|---|---|---|---|---|---|---|"]
    for run, bill in zip(runs, bills):
        if not bill["jobs"] or not any("node_seconds" in j for j in bill["jobs"]):
            lines.append(f"| {run.label} | - | {bill['note'] or '-'} | | | | | |")
            continue
        for job in bill["jobs"]:
            if "node_seconds" not in job:
                continue
            steps = ", ".join(f"{s['step']} ({s['nodes']} x {s['elapsed_seconds']} s)" for s in job["steps"]) or "-"
            lines.append(f"| {run.label} | {job['job_id']} | {job['state']} | {job['runs']} | {job['nodes']} | "
                         f"{job['elapsed_seconds']:,} | {job['node_seconds']:,.0f} | {steps} |")
        if bill["note"]:
            lines.append(f"| {run.label} | | {bill['note']} | | | | | |")
    return "\n".join(lines) + "\n"
