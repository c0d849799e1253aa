"""Batch scripts for a site: plan the job, validate every value that reaches the script, render it.

``plan_job`` turns a config and the ``hpcrl submit`` flags into a :class:`BatchJob` (nodes, ranks per
node, walltime, paths, and the :class:`RankStart`: how each rank starts), checking each value
against a strict pattern: a batch directive line (``#SBATCH``/``#PBS``) is parsed by the
scheduler, not by a shell, so quoting cannot protect it; only values that match are allowed
through, and shell words are quoted again with ``shlex.quote`` in the templates. ``render`` fills
the site's Jinja2 template from ``slurm_templates/`` (the Parsl apps of :mod:`hpcrl.parsl_runs`
share its ``_ranks.sh.j2``); ``write_job`` puts the script and the resolved config in the job
directory; ``submit`` runs sbatch/qsub and returns the job id.
"""
from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
import time as _time
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from hpcrl.config import RunConfig
from hpcrl.errors import ConfigError
from hpcrl.launch import rank_command
from hpcrl.launchers import ShellWord, Srun, for_site
from hpcrl.sites import Site
from hpcrl.templates import template_dir

CHECKPOINT = "checkpoints/latest.pt"
"""Relative to the run directory (hpcrl.runtime.record.checkpoint): its presence means resume."""
JOB_SUFFIX = ".job"
RANKS_NOW = ShellWord('"$RANKS"')
"""With --min-nodes, the ranks of this start (the script sets RANKS from the nodes Slurm gave it)."""
"""The job directory (script, resolved config, scheduler output) sits next to the run directory."""

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PATH = re.compile(r"^/[A-Za-z0-9_./@+=-]*$")
TIME = re.compile(r"^(\d{1,3}):([0-5]\d):([0-5]\d)$")
PATH_CHARS = "letters, digits and _ . / @ + = -"


def check_name(flag: str, value: str) -> str:
    """Job names, accounts, queues, partitions, constraints: one word of safe characters."""
    if not NAME.match(value):
        raise ConfigError(f"{flag}: {value!r} is not allowed; use 1-64 letters, digits, '.', '_', '-' "
                          "(starting with a letter or digit)")
    return value


def check_path(flag: str, value: str | Path) -> str:
    """An absolute path without spaces, quotes or shell characters (it also appears in directives)."""
    text = str(value)
    if not PATH.match(text):
        raise ConfigError(f"{flag}: {text!r} must be an absolute path made of {PATH_CHARS} "
                          "(no spaces or shell characters: it goes into #SBATCH/#PBS lines)")
    return text


def seconds(text: str) -> int:
    m = TIME.match(text)
    return int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) if m else -1


def check_time(flag: str, value: str) -> str:
    if seconds(value) <= 0:
        raise ConfigError(f"{flag}: {value!r} is not a walltime; use HH:MM:SS, e.g. 01:30:00")
    return value


@dataclass(frozen=True)
class RankStart:
    """How every rank of a job starts: what slurm_templates/_ranks.sh.j2 renders (batch scripts, Parsl apps)."""

    start: list[str]
    """argv of one rank starting the run (hpcrl.launch.rank_command)."""
    resume: list[str]
    """argv of one rank resuming it from its last checkpoint."""
    env: dict[str, str] = field(default_factory=dict)
    """The site's exports (values are quoted in the script)."""
    container_runtime: str | None = None
    container_setup: list[str] = field(default_factory=list)
    """The site's shell lines for that runtime (module loads, ABI paths); trusted: they come from this package."""


def plan_rank_start(cfg: RunConfig, site: Site | None, run_dir: str | Path, python: str,
                    fit_actors: bool = False) -> RankStart:
    """How the ranks of ``cfg`` start on ``site`` (None: this machine, no site facts); checks the container first."""
    box = cfg.launch.container
    binds: list[str] = []
    if box is not None and site is not None:
        if box.runtime not in site.containers:
            allowed = ", ".join(site.containers) or "none"
            raise ConfigError(f"launch.container.runtime: {box.runtime!r} is not available on {site.name}; "
                              f"allowed: {allowed}")
        binds = list(site.container_binds)

    def argv(resume: bool) -> list[str]:
        return rank_command(run_dir, python=python, resume=resume, container=box, binds=binds, fit_actors=fit_actors)

    return RankStart(start=argv(False), resume=argv(True), env=dict(site.env) if site else {},
                     container_runtime=box.runtime if box else None,
                     container_setup=list(site.containers.get(box.runtime, [])) if box and site else [])


@dataclass(frozen=True)
class BatchJob:
    """One run's batch job (``hpcrl submit``): everything its site template needs, validated."""

    site: Site
    name: str
    nodes: int
    ranks: int
    ranks_per_node: int
    cpus_per_rank: int | None
    time: str
    account: str | None
    queue: str | None
    run_dir: str
    job_dir: str
    rank_start: RankStart
    warning_seconds: int
    """The ranks get SIGUSR1 this long before the walltime, checkpoint, and the job is requeued."""
    max_restarts: int
    container_image: str | None = None
    env_script: str | None = None
    """A user file sourced before launch (module loads, conda activate)."""
    overrides: tuple[str, ...] = ()
    config_yaml: str = ""
    """The resolved config the run starts from (io.run_dir = run_dir). The script carries it and writes it
    to ``job_dir`` on its first start if it is not there, so a script saved from --dry-run runs as saved."""
    min_nodes: int | None = None
    """Slurm ``--nodes=min_nodes-nodes``: a job that lost nodes comes back on as few as this; its ranks are then
    ranks_per_node x the nodes it got, and the actors what is left after the parameter and learner ranks."""
    join_nodes: int = 0
    """learners.elastic / actors.elastic=steps: nodes the allocation holds beyond the ranks' own, one for each
    learner group that can be active at once and one per actor, where the joining ranks run as job steps (Slurm)
    or second PALS mpiexecs (PBS) (hpcrl/join_launch.py)."""
    joining_jobs: bool = False
    """learners.elastic / actors.elastic=jobs: a PBS script exports what each joining job asks for (its project,
    queue, file systems and end: hpcrl/join_jobs.py); Slurm's jobs read the job's own SLURM_ variables."""

    @property
    def allocation_nodes(self) -> int:
        return self.nodes + self.join_nodes

    @property
    def filesystems(self) -> str | None:
        """PBS -l filesystems: the site's defaults plus the one holding the run directory."""
        names = self.site.filesystems.split(":") if self.site.filesystems else []
        for prefix, name in self.site.filesystem_mounts.items():
            if (self.run_dir + "/").startswith(prefix) and name not in names:
                names.append(name)
        return ":".join(names) or None

    @property
    def script_path(self) -> str:
        return f"{self.job_dir}/{self.name}.{'sbatch' if self.site.scheduler == 'slurm' else 'pbs'}"

    @property
    def launch(self) -> str:
        """The site's launch line for the ranks, without the rank command (:func:`hpcrl.launchers.for_site`)."""
        ranks = RANKS_NOW if self.min_nodes else self.ranks
        launcher = for_site(self.site)
        line = launcher.prefix(ranks, self.ranks_per_node, self.cpus_per_rank)
        # the job's own ranks on their nodes only: the others are the joining ranks' (PALS fills the nodefile's
        # first nodes, --ppn ranks each; the joins take the nodes the ranks did not land on, hpcrl.join_launch)
        return f"{line} --nodes={self.nodes}" if self.join_nodes and isinstance(launcher, Srun) else line

    @property
    def walltime_seconds(self) -> int:
        return seconds(self.time)


def layout(ranks: int, site: Site, nodes: int | None = None) -> tuple[int, int, int | None]:
    """(nodes, ranks per node, CPUs per rank) for ``ranks`` on ``site``: one rank per core by default.

    CPUs per rank count hardware threads (what srun -c and PALS --depth count); None where the
    site's cores are unknown (generic Slurm), and then no binding is requested.
    """
    if nodes is not None and nodes < 1:
        raise ConfigError(f"--nodes: {nodes} must be at least 1")
    cap = site.max_ranks_per_node or site.cores_per_node
    nodes = nodes or (math.ceil(ranks / cap) if cap else 1)
    if nodes > ranks:
        raise ConfigError(f"--nodes: {nodes} nodes for {ranks} ranks leaves nodes idle; use at most {ranks}")
    per_node = math.ceil(ranks / nodes)
    if not site.cores_per_node:
        return nodes, per_node, None
    if per_node > site.cores_per_node and not site.overcommit:
        raise ConfigError(f"--nodes: {ranks} ranks on {nodes} node(s) is {per_node} per node, more than the "
                          f"{site.cores_per_node} cores of a {site.name} node; use --nodes "
                          f"{math.ceil(ranks / site.cores_per_node)} or more")
    return nodes, per_node, site.threads_per_core * max(1, site.cores_per_node // per_node)


def resolve_run_dir(cfg: RunConfig, run_dir: str | None, cwd: Path, stamp: str) -> Path:
    """The run directory fixed at submit time (absolute), so every restart finds the same one."""
    if run_dir is None:
        pattern = cfg.io.run_dir
        if any(c in pattern.replace("{name}", "").replace("{time}", "") for c in "{}"):
            raise ConfigError(f"io.run_dir: {pattern!r}: the only placeholders are {{name}} and {{time}}")
        run_dir = pattern.replace("{name}", cfg.name).replace("{time}", stamp)
    path = Path(run_dir)
    return path if path.is_absolute() else cwd / path


def check_placement(cfg: RunConfig, site: Site, ranks: int, per_node: int) -> None:
    """launch.placement on the block layout the script asks for: the learners fit, and learners_first on a GPU
    site gives no node more learner ranks than GPUs (each takes the GPU of its index among its node's learners;
    in launch order they share them by node-local rank, as before)."""
    from hpcrl.runtime.placement import block_hosts, role_order

    placement, learners = cfg.launch.placement, cfg.learners.groups * cfg.learners.launched_ranks_per_group
    try:
        order = role_order(block_hosts(ranks, per_node), learners, placement.roles, placement.learners_per_node,
                           placement.parameter)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if placement.roles == "learners_first" and site.gpus_per_node and cfg.learners.device != "cpu":
        hosts = block_hosts(ranks, per_node)
        per_host = {h: sum(1 for r in order[1:1 + learners] if hosts[r] == h) for h in set(hosts)}
        most = max(per_host.values(), default=0)
        if most > site.gpus_per_node:
            raise ConfigError(f"launch.placement: {most} learner ranks on one node of {site.name}, which has "
                              f"{site.gpus_per_node} GPUs a node; allowed: launch.placement.roles=learners_first with "
                              f"learners_per_node <= {site.gpus_per_node}, or learners.device=cpu")


def check_joining(cfg: RunConfig, site: Site, min_nodes: int | None, queue: str | None) -> int:
    """learners.elastic / actors.elastic: the nodes the joining ranks need, with steps one per learner group that
    can be active at once and one per actor (runtime/runners/mpi.py numbers them in that order), without
    --min-nodes; jobs: no node here, and on a site whose ``queue`` limits are known, a queue that takes the
    one-node joining jobs beside the run's own; 0 for park. One-line ConfigError."""
    nodes, jobs = 0, 0
    for setting, how, count in (("learners.elastic", cfg.learners.elastic, cfg.learners.active_range[1]),
                                ("actors.elastic", cfg.actors.elastic, cfg.actors.count)):
        if how == "jobs":
            jobs += count
        elif how == "steps":
            if min_nodes is not None:
                raise ConfigError(f"--min-nodes with {setting}=steps: a job whose node count varies cannot keep "
                                  "nodes for joining ranks; allowed: one of the two")
            nodes += count
    limits = site.queues.get(queue) if queue else None
    if jobs and limits is not None:
        setting = "learners.elastic" if cfg.learners.elastic == "jobs" else "actors.elastic"
        allowed = f"allowed: a queue that takes them ({fitting_queues(site, 1 + jobs)}), or {setting}=steps"
        if limits.min_nodes > 1:
            raise ConfigError(f"{setting}=jobs: each join is a one-node job in --queue {queue}, which takes "
                              f"{limits.min_nodes}-{limits.max_nodes} nodes on {site.name}; {allowed}")
        if limits.max_jobs_per_user is not None and limits.max_jobs_per_user < 1 + jobs:
            raise ConfigError(f"{setting}=jobs: up to {jobs} joining job(s) beside the run's own, and --queue {queue} "
                              f"on {site.name} holds {limits.max_jobs_per_user} job(s) a user; {allowed}")
    return nodes


def fitting_queues(site: Site, jobs: int) -> str:
    """The site's known queues that take one-node jobs, ``jobs`` of them a user at once (a comma list)."""
    names = [n for n, q in site.queues.items()
             if q.min_nodes == 1 and (q.max_jobs_per_user is None or q.max_jobs_per_user >= jobs)]
    return ", ".join(names) or f"none of those hpcrl knows on {site.name}"


def check_min_nodes(cfg: RunConfig, site: Site, min_nodes: int, nodes: int, per_node: int) -> None:
    """--min-nodes: Slurm only, at most --nodes, and as few nodes must still hold the parameter rank, the
    learners and one actor (the placement too)."""
    if site.scheduler != "slurm":
        raise ConfigError(f"--min-nodes: {site.name} schedules with {site.scheduler}, which has no node range; "
                          "allowed on Slurm sites only")
    if not 1 <= min_nodes <= nodes:
        raise ConfigError(f"--min-nodes: {min_nodes}; allowed: 1 to --nodes ({nodes})")
    try:
        cfg.actors_for(min_nodes * per_node, f"--min-nodes {min_nodes}: {min_nodes} node(s) x {per_node} ranks =")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_placement(cfg, site, min_nodes * per_node, per_node)


def check_batch_flags(site: Site, queue: str | None, time: str | None, account: str | None, warning_seconds: int,
                      max_restarts: int, nodes: int, join_nodes: int = 0) -> tuple[str | None, str]:
    """The flags every batch job takes (``hpcrl submit``, a sweep's array) against the site: (queue, walltime),
    the site's defaults filled in; ConfigError (one line) for what the site or queue does not allow."""
    queue = check_name("--queue", queue) if queue else site.default_queue
    time = check_time("--time", time or site.default_time)
    limits = site.queues.get(queue) if queue else None
    if site.only_listed_queues and limits is None:
        raise ConfigError(f"--queue: {site.name} has no partition {queue!r}; it has {', '.join(site.queues)}")
    if limits is not None:
        if seconds(time) > seconds(limits.max_time):
            raise ConfigError(f"--time: {time} exceeds the {site.name} {queue} limit of {limits.max_time}")
        if not limits.min_nodes <= nodes + join_nodes <= limits.max_nodes:
            joining = f" + {join_nodes} for the joining ranks" if join_nodes else ""
            raise ConfigError(f"--nodes: {nodes}{joining} outside the {site.name} {queue} range "
                              f"{limits.min_nodes}-{limits.max_nodes}")
    if account:
        check_name("--account", account)
    elif site.account_required:
        raise ConfigError(f"--account: {site.name} charges every job to a project; pass --account PROJECT")
    if not 0 < warning_seconds < seconds(time):
        raise ConfigError(f"--warning-seconds: {warning_seconds} must be between 1 and the walltime "
                          f"({seconds(time)} s)")
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts: {max_restarts} must be 0 or more")
    return queue, time


def plan_job(cfg: RunConfig, site: Site, *, nodes: int | None = None, time: str | None = None,
             account: str | None = None, queue: str | None = None, run_dir: str | None = None,
             python: str | None = None, warning_seconds: int = 120, max_restarts: int = 10,
             env_script: str | None = None, overrides: tuple[str, ...] = (), cwd: Path | None = None,
             stamp: str | None = None, min_nodes: int | None = None) -> BatchJob:
    """Validate the flags against the site and the config; nothing is written."""
    if not cfg.uses_mpi:
        raise ConfigError("launch.runner: serial runs every role in one process; a batch job starts MPI ranks "
                          "(use -o launch.runner=mpi)")
    ranks = cfg.num_ranks
    nodes, per_node, cpus = layout(ranks, site, nodes)
    join_nodes = check_joining(cfg, site, min_nodes, check_name("--queue", queue) if queue else site.default_queue)
    queue, time = check_batch_flags(site, queue, time, account, warning_seconds, max_restarts, nodes, join_nodes)
    check_placement(cfg, site, ranks, per_node)
    if min_nodes is not None:
        check_min_nodes(cfg, site, min_nodes, nodes, per_node)

    stamp = stamp or _time.strftime("%Y%m%d-%H%M%S")
    run_path = resolve_run_dir(cfg, run_dir, cwd or Path.cwd(), stamp)
    run_text = check_path("--run-dir (or io.run_dir)", run_path)
    python = check_path("--python", python or sys.executable)
    if env_script:
        env_script = check_path("--env-script", Path(env_script).absolute())

    box = cfg.launch.container
    return BatchJob(site=site, name=check_name("name", cfg.name), nodes=nodes, ranks=ranks, ranks_per_node=per_node,
                    cpus_per_rank=cpus, time=time, account=account, queue=queue, run_dir=run_text,
                    job_dir=run_text + JOB_SUFFIX, rank_start=plan_rank_start(cfg, site, run_text, python, fit_actors=min_nodes is not None),
                    warning_seconds=warning_seconds, max_restarts=max_restarts, min_nodes=min_nodes, join_nodes=join_nodes,
                    joining_jobs="jobs" in (cfg.learners.elastic, cfg.actors.elastic),
                    container_image=box.image if box else None, env_script=env_script, overrides=tuple(overrides),
                    config_yaml=run_config(cfg, run_text).to_yaml())


def _environment(folder: Path) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["words"] = lambda seq: " ".join(shlex.quote(str(w)) for w in seq)
    return env


def render_template(name: str, **context) -> str:
    """Fill ``slurm_templates/NAME``; every template also gets ``checkpoint`` (its presence means resume)
    and ``rank_env`` (the variables every rank gets, :data:`hpcrl.launch.RANK_ENV`)."""
    folder = template_dir()
    if not (folder / name).is_file():
        raise ConfigError(f"template {name!r} not found in {folder}; its *.j2 files: "
                          f"{', '.join(sorted(p.name for p in folder.glob('*.j2'))) or 'none'}")
    from hpcrl.launch import RANK_ENV

    text = _environment(folder).get_template(name).render(checkpoint=CHECKPOINT, rank_env=RANK_ENV, **context)
    return text if text.endswith("\n") else text + "\n"


def render(job: BatchJob) -> str:
    """The site's batch script for ``job``."""
    return render_template(job.site.template, job=job, site=job.site, rank_start=job.rank_start,
                           resume_note=" (restart $RESTART)", config_end=CONFIG_END)


def run_config(cfg: RunConfig, run_dir: str | Path) -> RunConfig:
    """``cfg`` with io.run_dir fixed to ``run_dir``: what a batch job's ranks read."""
    return cfg.model_copy(update={"io": cfg.io.model_copy(update={"run_dir": str(run_dir)})})


CONFIG_END = "HPCRL_CONFIG_YAML"
"""The end line of the quoted here-document that carries the config in the script (nothing in it is expanded).
No config line can equal it: the only top-level scalar is ``name`` (letters, digits, '.', '_', '-'), and every
other value is indented under its section."""


def prepare_job_dir(cfg: RunConfig, run_dir: str | Path, job_dir: str | Path) -> Path:
    """Create ``job_dir`` holding the resolved config whose io.run_dir is the fixed ``run_dir``; returns its path."""
    if Path(run_dir).exists() or Path(job_dir).exists():
        raise ConfigError(f"--run-dir: {run_dir} already exists; pick a new one "
                          "(a job resumes its own run after a requeue by itself)")
    Path(job_dir).mkdir(parents=True)
    path = Path(job_dir) / "config.yaml"
    path.write_text(run_config(cfg, run_dir).to_yaml())
    return path


def write_job(job: BatchJob, cfg: RunConfig, script: str) -> Path:
    """Create the job directory with the resolved config (io.run_dir = the fixed run dir) and the script."""
    prepare_job_dir(cfg, job.run_dir, job.job_dir)
    path = Path(job.script_path)
    path.write_text(script)
    path.chmod(0o750)
    return path


def submit_command(job: BatchJob) -> list[str]:
    if job.site.scheduler == "slurm":
        return ["sbatch", "--parsable", job.script_path]
    return ["qsub", job.script_path]


def parse_job_id(scheduler: str, output: str) -> str:
    """sbatch --parsable prints 'ID' or 'ID;CLUSTER'; qsub prints 'ID.SERVER'."""
    text = output.strip().splitlines()[-1].strip() if output.strip() else ""
    m = re.match(r"^(\d+)(;\S+)?$", text) if scheduler == "slurm" else re.match(r"^(\d+(\[\])?\.\S+|\d+)$", text)
    if not m:
        raise RuntimeError(f"could not read a job id from {scheduler} output: {output.strip()!r}")
    return m[1]


def run_submit(cmd: list[str], scheduler: str, cwd: str, what: str = "the job") -> str:
    """Run a submit command (sbatch --parsable / qsub) in ``cwd``; the job id it printed. A missing command or a
    refusal is one ConfigError line with the scheduler's last line."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd)
    except FileNotFoundError:
        raise ConfigError(f"{cmd[0]!r} not found; submit from a login node of the site, or use --dry-run to see "
                          "the script") from None
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        raise ConfigError(f"{cmd[0]} refused {what}: {msg[-1] if msg else 'exit code ' + str(out.returncode)}")
    return parse_job_id(scheduler, out.stdout)


def submit(job: BatchJob) -> str:
    try:
        job_id = run_submit(submit_command(job), job.site.scheduler, job.job_dir)
    except ConfigError as exc:
        raise ConfigError(f"--site {job.site.name}: {exc}") from None
    (Path(job.job_dir) / "job_id").write_text(job_id + "\n")
    return job_id
