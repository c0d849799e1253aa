"""Joining ranks as a one-node batch job of their own (``learners.elastic`` / ``actors.elastic`` = jobs): one backend
per scheduler behind one interface, :class:`JoiningJobs`, picked by :func:`joining_jobs` from the batch job the door
rank runs in.

Each backend's submit command blocks until its job ends and exits with the job's status, so the door's
:class:`~hpcrl.join_launch.Joiner` treats it like the launch of a job step: ``sbatch --wait --parsable ... --wrap
"srun ..."`` on Slurm, ``qsub -V -W block=true WHO-N.pbs`` on PBS Pro (OpenPBS ``qsub(1B)``: with ``block=true``
qsub prints the job id, then "waits for the job to terminate, then returns the job's exit value", 3 when the job
is deleted before it ran). The first line of what the command prints is the job id (:meth:`JoiningJobs.job_id`);
``scancel`` / ``qdel`` end a job the door gives up on (:meth:`JoiningJobs.cancel_argv`); the job becomes an
``allocations`` row that ``hpcrl analyze`` bills (:meth:`JoiningJobs.row`).

The PBS job's script is rendered from ``slurm_templates/join_job.pbs.j2`` into ``RUN_DIR/joins/WHO-N.pbs``. What
it asks PBS for (project, queue, file systems) is what ``hpcrl submit`` gave the run's own job, which its script
exports as HPCRL_JOIN_ACCOUNT, HPCRL_JOIN_QUEUE and HPCRL_JOIN_FILESYSTEMS; its walltime is what the run's job has
left (HPCRL_JOB_ENDS_AT, at least :data:`MIN_WALLTIME` s, the ALCF queues' minimum).
"""
from __future__ import annotations

import time
from pathlib import Path

from hpcrl.join_launch import site_launcher

MIN_WALLTIME = 300
"""Seconds: the shortest walltime a joining PBS job asks for (ALCF's queues take nothing under 5 minutes)."""


class JoiningJobs:
    """A scheduler's joining jobs, for a door rank inside a batch job of ``hpcrl submit`` (``env``: its
    environment; ``setting``: learners.elastic or actors.elastic, named in errors)."""

    scheduler = ""
    id_suffix = ""
    """The file beside the join's .log that receives the submit command's output (its first line: the job id)."""
    cancel = ""
    """The scheduler's cancel command."""

    def __init__(self, env: dict[str, str], setting: str) -> None:
        self.env, self.setting = env, setting

    def submit_argv(self, ranks: int, own_hosts: list[str], command: list[str], log: Path, name: str) -> list[str]:
        """The argv that submits ``command`` on ``ranks`` ranks of one node as job ``name`` (its output in ``log``)
        and returns when the job has ended, with its exit status."""
        raise NotImplementedError

    def job_id(self, printed: str) -> str:
        """The job id from the submit command's output ('' before it printed one, or when it printed an error)."""
        from hpcrl.submit import parse_job_id

        first = printed.strip().splitlines()[0] if printed.strip() else ""
        try:
            return parse_job_id(self.scheduler, first) if first else ""
        except RuntimeError:
            return ""

    def cancel_argv(self, job_id: str) -> list[str]:
        return [self.cancel, job_id]

    def row(self, job_id: str) -> dict | None:
        """The joining job as an ``allocations`` row (one node)."""
        raise NotImplementedError


class SlurmJobs(JoiningJobs):
    """``sbatch --wait`` of one node in this job's partition and account, away from its nodes, running the site's
    srun line (the submitting environment is exported: sbatch's default)."""

    scheduler, id_suffix, cancel = "slurm", ".sbatch", "scancel"

    def submit_argv(self, ranks, own_hosts, command, log, name):
        from hpcrl.launchers import Srun, shell_line

        queue = [f"--partition={self.env['SLURM_JOB_PARTITION']}"] if self.env.get("SLURM_JOB_PARTITION") else []
        account = [f"--account={self.env['SLURM_JOB_ACCOUNT']}"] if self.env.get("SLURM_JOB_ACCOUNT") else []
        # not on the job's own nodes, where a shared partition would pack it beside the job's ranks
        away = f"--exclude={','.join(sorted(set(own_hosts)))}"
        srun = site_launcher(self.env, Srun, self.setting)
        return ["sbatch", "--wait", "--parsable", "--nodes=1", f"--ntasks={ranks}", f"--job-name={name}",
                f"--output={log}", away, *queue, *account, "--wrap", shell_line([*srun.words(ranks, ranks), *command])]

    def row(self, job_id):
        from hpcrl.runtime.record.allocation import batch_job

        return batch_job({**self.env, "SLURM_JOB_ID": job_id, "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_ID": ""})


class PbsJobs(JoiningJobs):
    """``qsub -V -W block=true`` of a rendered one-node script in this job's project, queue and file systems,
    exclusive (``place=scatter:excl``: never on a node of the run's own job), not rerunnable, running the site's
    PALS mpiexec line; ``-V`` exports the door's environment to it, as sbatch does by default."""

    scheduler, id_suffix, cancel = "pbs", ".qsub", "qdel"

    def submit_argv(self, ranks, own_hosts, command, log, name):
        script = Path(log).with_suffix(".pbs")
        script.write_text(self.render(ranks, command, Path(log), name))
        return ["qsub", "-V", "-W", "block=true", str(script)]

    def render(self, ranks: int, command: list[str], log: Path, name: str, now: float | None = None) -> str:
        """The joining job's PBS script (``now``: the time it is submitted, for its walltime)."""
        from hpcrl.errors import ConfigError
        from hpcrl.launchers import PalsMpiexec
        from hpcrl.sites import load_site
        from hpcrl.submit import check_name, check_path, render_template

        pals = site_launcher(self.env, PalsMpiexec, self.setting)
        env = self.env
        if not env.get("HPCRL_JOB_ENDS_AT"):
            raise RuntimeError(f"{self.setting}=jobs: this PBS job's script does not say what a joining job asks for "
                               f"(no HPCRL_JOB_ENDS_AT); allowed: a job of hpcrl submit with {self.setting}=jobs")
        try:
            given = {k: env.get(f"HPCRL_JOIN_{k.upper()}") or None for k in ("account", "queue", "filesystems")}
            for key, value in given.items():  # they become #PBS lines: one safe word each (file systems: a:b)
                for word in value.split(":") if value else []:
                    check_name(f"HPCRL_JOIN_{key.upper()}", word)
            job = {**given, "name": check_name("joining job name", name),
                   "walltime": walltime(float(env["HPCRL_JOB_ENDS_AT"]) - (time.time() if now is None else now)),
                   "log": check_path("joining job log", log),
                   "output": check_path("joining job output", log.with_suffix(".out")),
                   "ranks": ranks, "parent": " ".join(env.get("PBS_JOBID", "?").split()), "launch": pals.prefix(ranks, ranks),
                   "argv": command}
        except (ConfigError, ValueError) as exc:
            raise RuntimeError(f"{self.setting}=jobs: {exc}") from None
        return render_template("join_job.pbs.j2", job=job, site=load_site(self.env["HPCRL_SITE"]))

    def row(self, job_id):
        from hpcrl.runtime.record.allocation import batch_job

        row = batch_job({**self.env, "PBS_JOBID": job_id, "PBS_NODEFILE": ""})
        return None if row is None else {**row, "nodes": 1}


def walltime(seconds: float) -> str:
    """HH:MM:SS of ``seconds``, at least :data:`MIN_WALLTIME`."""
    s = max(int(seconds), MIN_WALLTIME)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


BACKENDS = {"SLURM_JOB_ID": SlurmJobs, "PBS_JOBID": PbsJobs}
"""The variable that says which scheduler's batch job this is -> its backend."""


def joining_jobs(env: dict[str, str], setting: str = "learners.elastic") -> JoiningJobs:
    """The backend of the batch job (of ``hpcrl submit``: HPCRL_SITE) this process runs in; a one-line
    RuntimeError outside one."""
    for variable, backend in BACKENDS.items():
        if env.get(variable) and env.get("HPCRL_SITE"):
            return backend(env, setting)
    raise RuntimeError(f"{setting}=jobs: this run is not in a Slurm or PBS batch job of hpcrl submit (no "
                       f"SLURM_JOB_ID / PBS_JOBID with HPCRL_SITE); allowed there only, or {setting}=steps")
