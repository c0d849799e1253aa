"""Batch launch: the head submits a worker job through hpcrl's site layer, or attaches to a running one.

The head opens its lifeline socket and writes ``{"lifeline": "HOST:PORT"}`` into a rendezvous file
on a shared file system; the workers (``python -m hpcrl.clusterenv.worker --rendezvous FILE``,
started from ``slurm_templates/clusterenv_workers.j2`` by the site's launcher, ``hpcrl.launchers.for_site``)
wait for the file, say hello, receive the MPI port name and connect. With ``site=...`` the head renders and
submits that script (``sbatch``/``qsub``) and cancels the job at ``close()``; with only
``rendezvous=FILE`` it attaches to a job started earlier (``render_workers`` prints its script).
While waiting, the head polls the scheduler: a job that ended first is a one-line error naming
its state and its output file, and so is the timeout.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpcrl.clusterenv.connect import ConnectError, Link, join_port, worker_command
from hpcrl.clusterenv.lifeline import HeadLifeline
from hpcrl.errors import ConfigError
from hpcrl.launchers import for_site

BATCH_KEYS = ("nodes", "time", "account", "queue", "job_dir", "name", "env")
TEMPLATE = "clusterenv_workers.j2"
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED",
         "Q", "R", "H", "W", "B", "E", "T", "S"}
"""Slurm states and PBS one-letter states of a job that may still connect."""


@dataclass(frozen=True)
class WorkerJob:
    site: object
    name: str
    nodes: int
    ranks: int
    ranks_per_node: int
    cpus_per_rank: int | None
    time: str
    account: str | None
    queue: str | None
    job_dir: str
    rendezvous: str
    argv: list[str]
    env: dict = field(default_factory=dict)

    @property
    def script_path(self) -> str:
        return f"{self.job_dir}/workers.{'sbatch' if self.site.scheduler == 'slurm' else 'pbs'}"

    @property
    def launch(self) -> str:
        """The site's launch line for the workers, without their command; the job asks for no GPUs."""
        return for_site(self.site, gpus=False).prefix(self.ranks, self.ranks_per_node, self.cpus_per_rank)


def plan_workers(opts, site_name: str, rendezvous: str | None = None) -> WorkerJob:
    """Validate the batch settings against the site (hpcrl.submit's checks); nothing is written."""
    from hpcrl.sites import load_site
    from hpcrl.submit import check_name, check_path, check_time, layout

    b = dict(opts.batch)
    unknown = set(b) - set(BATCH_KEYS)
    if unknown:
        raise ConfigError(f"batch: unknown setting {sorted(unknown)[0]!r}; allowed: {', '.join(BATCH_KEYS)}")
    site = load_site(site_name)
    nodes, per_node, cpus = layout(opts.workers, site, b.get("nodes"))
    queue = check_name("batch.queue", b["queue"]) if b.get("queue") else site.default_queue
    account = check_name("batch.account", b["account"]) if b.get("account") else None
    if site.account_required and not account:
        raise ConfigError(f"batch.account: {site.name} charges every job to a project; pass batch={{'account': ...}}")
    job_dir = Path(b.get("job_dir") or Path.cwd() / time.strftime("clusterenv-%Y%m%d-%H%M%S")).absolute()
    job_text = check_path("batch.job_dir", job_dir)
    rendezvous = check_path("rendezvous", Path(rendezvous or job_dir / "head.json").absolute())
    python = check_path("python", opts.python)
    env = {str(k): str(v) for k, v in (b.get("env") or {}).items()}
    for key in env:
        check_name("batch.env", key)
    return WorkerJob(site=site, name=check_name("batch.name", b.get("name", "clusterenv-workers")), nodes=nodes,
                     ranks=opts.workers, ranks_per_node=per_node, cpus_per_rank=cpus,
                     time=check_time("batch.time", b.get("time") or site.default_time), account=account,
                     queue=queue, job_dir=job_text, rendezvous=rendezvous,
                     argv=worker_command(python, "--rendezvous", rendezvous, "--timeout", str(int(opts.timeout) + 60)),
                     env=env)


def render_workers(job: WorkerJob) -> str:
    from hpcrl.submit import render_template

    return render_template(TEMPLATE, job=job, site=job.site)


def submit_workers(job: WorkerJob) -> str:
    from hpcrl.submit import parse_job_id

    Path(job.job_dir).mkdir(parents=True, exist_ok=True)
    path = Path(job.script_path)
    path.write_text(render_workers(job))
    path.chmod(0o750)
    cmd = ["sbatch", "--parsable", str(path)] if job.site.scheduler == "slurm" else ["qsub", str(path)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=job.job_dir)
    except FileNotFoundError:
        raise ConfigError(f"site: {cmd[0]!r} not found; run the head where {job.site.name} jobs can be submitted") from None
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        raise ConfigError(f"{cmd[0]} refused the worker job: {msg[-1] if msg else out.returncode}")
    return parse_job_id(job.site.scheduler, out.stdout)


def job_state(scheduler: str, job_id: str) -> str:
    """The scheduler's state word for a job ('' when it no longer knows the job)."""
    cmd = ["squeue", "-h", "-j", job_id, "-o", "%T"] if scheduler == "slurm" else ["qstat", "-f", "-F", "json", job_id]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "UNKNOWN"
    if scheduler == "slurm":
        return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
    try:
        jobs = json.loads(out.stdout).get("Jobs", {})
        return next(iter(jobs.values())).get("job_state", "") if jobs else ""
    except ValueError:
        return ""


def connect_batch(opts) -> Link:
    """Submit (``site``) or attach to (``rendezvous``) the worker job, then wait for the workers."""
    lifeline = HeadLifeline(opts.host)
    job, job_id = None, None
    try:
        if opts.site:
            job = plan_workers(opts, opts.site, opts.rendezvous)
            rendezvous = Path(job.rendezvous)
        else:
            rendezvous = Path(opts.rendezvous).absolute()
        rendezvous.parent.mkdir(parents=True, exist_ok=True)
        tmp = rendezvous.with_name(rendezvous.name + ".tmp")
        tmp.write_text(json.dumps({"lifeline": lifeline.address, "pid": os.getpid()}))
        tmp.replace(rendezvous)
        if job is not None:
            job_id = submit_workers(job)
        last = {"t": 0.0, "state": "?"}

        def check():
            if job_id is None or time.monotonic() - last["t"] < 3:
                return
            last["t"] = time.monotonic()
            last["state"] = state = job_state(job.site.scheduler, job_id)
            if state not in ALIVE and state != "UNKNOWN":
                raise ConnectError(f"ClusterEnv: worker job {job_id} on {job.site.name} ended ({state or 'gone'}) "
                                   f"before its workers connected; see {job.job_dir}/workers-{job_id}.out")

        what = (f"worker job {job_id} on {job.site.name}, last state {last['state']}; output in {job.job_dir}"
                if job_id else f"attach: no worker job read {rendezvous}")
        comm = join_port(lifeline, opts.workers, opts.timeout, check, what)
    except BaseException:
        lifeline.close()
        if job_id is not None:
            cancel(job.site.scheduler, job_id)
        raise
    link = Link(comm, lifeline)
    if job_id is not None:
        link.cleanup.append(lambda: finish_job(job.site.scheduler, job_id))
    link.cleanup.append(lambda: rendezvous.unlink(missing_ok=True))
    return link


def finish_job(scheduler: str, job_id: str, grace: float = 15.0) -> None:
    """After close(): give the workers ``grace`` seconds to end their job, then cancel what is left."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if job_state(scheduler, job_id) not in ALIVE:
            return
        time.sleep(0.5)
    cancel(scheduler, job_id)


def cancel(scheduler: str, job_id: str) -> None:
    """Cancel the worker job (harmless when it already ended)."""
    cmd = ["scancel", job_id] if scheduler == "slurm" else ["qdel", job_id]
    try:
        subprocess.run(cmd, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass
