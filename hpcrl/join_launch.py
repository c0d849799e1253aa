"""The launch half of ranks that join a running job (``learners.elastic`` / ``actors.elastic``: steps, jobs): the
scheduler's side, beside :mod:`hpcrl.launchers` and the site files.

A door rank (a learner group's root, an actor) has its joining ranks started here: as a job step on a node of the
Slurm allocation that holds none of the job's own ranks (``srun``, the site of ``hpcrl submit``'s script,
HPCRL_SITE), as a one-node batch job of their own (:mod:`hpcrl.join_jobs`: ``sbatch --wait`` or ``qsub -W
block=true``, recorded as an ``allocations`` row so that ``hpcrl analyze`` bills it), or with a second local
``mpiexec`` outside a batch job. In a PBS job (Polaris, Aurora) ``steps`` is a second PALS ``mpiexec --hostfile
WHO-N.hosts`` naming a node of $PBS_NODEFILE that holds none of the job's ranks (ALCF's way to run concurrent
mpiexecs on distinct nodes of one job: its Polaris "Multi-node Ensemble Calculations" example splits
$PBS_NODEFILE into one hostfile per launch, and its Aurora guide gives mpiexec an edited copy of it). Each runs
``python -m hpcrl.runtime.runners.join``; the files of the N-th join of door WHO are ``RUN_DIR/joins/WHO-N.*``:
.port (the MPI port), .ready (host and pid of their first rank, written just before it connects), .log, .leaving,
.left, with PBS steps .hosts, and with ``jobs`` the submit command's output (the job id: .sbatch, .qsub) and on PBS
the job's script (.pbs).

The MPI half (the port, accept and merge, disconnect; :class:`~hpcrl.runtime.transport.joining.JoinedReduce` and
:class:`~hpcrl.runtime.transport.joining.JoiningGroupReduce`) is in ``runtime/transport/joining.py``; the roles see
a :class:`Joiner` only through ``runtime/transport/protocols.py``'s ``Joiner``. The runner builds them
(:func:`group_joiner`, :func:`actor_joiner`).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from hpcrl.runtime.messages import JoiningJob
from hpcrl.runtime.transport.joining import JoiningGroupReduce, JoinPort, process_gone

JOIN_DIR = "joins"

STEP_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CONF", "SLURM_CLUSTER_NAME", "SLURM_JOB_NODELIST",
                  "SLURM_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_SUBMIT_DIR", "SLURM_JOB_PARTITION",
                  "SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS")
"""The SLURM_ variables a joining step is started with: the allocation's, not the root's own step's (its task
counts, ranks and binding would become the new step's defaults)."""


def step_environment(env: dict[str, str], how: str = "steps") -> dict[str, str]:
    """``env`` without what makes this process a rank of its own launch (PMI, Hydra, its Slurm step; with ``jobs``
    every SLURM_ and PBS_ variable: the new job gets its own)."""
    keep = STEP_VARIABLES if how == "steps" else ()
    scheduler = ("SLURM_",) if how == "steps" else ("SLURM_", "PBS_")  # a PALS step runs in this PBS job: keep PBS_
    out = {k: v for k, v in env.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPI_LOCAL"))
           and (not k.startswith(scheduler) or k in keep)}
    # no shared-memory transport to the root (UCX's cma reads a peer's memory: a joined rank killed mid-transfer
    # aborts the root on the same host), unless the user chose the transports
    out.setdefault("UCX_TLS", "^sm")
    return out


def allocation_nodes(env: dict[str, str]) -> tuple[str, list[str]]:
    """The batch job's nodes, each once, in the scheduler's order, and where they came from (a PBS job's
    $PBS_NODEFILE, one line per rank slot; else Slurm's SLURM_JOB_NODELIST through ``scontrol show hostnames``)."""
    if env.get("PBS_NODEFILE"):
        lines = Path(env["PBS_NODEFILE"]).read_text().split()
        return env["PBS_NODEFILE"], list(dict.fromkeys(lines))
    out = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True,
                         timeout=30)
    return env["SLURM_JOB_NODELIST"], [] if out.returncode else out.stdout.split()


def join_node(own_hosts: list[str], slot: int, env: dict[str, str], setting: str = "learners.elastic") -> str:
    """The node of the Slurm or PBS allocation where joining launch ``slot`` runs: the allocation's nodes that hold none
    of the job's own ranks, one per slot (``hpcrl submit`` asks for one per learner group that can be active at
    once, then one per actor: slots 0 .. G-1 are the groups', G + a actor a's; left to Slurm, two steps would
    queue behind each other on one node)."""
    where, nodes = allocation_nodes(env)
    own = {h.split(".")[0] for h in own_hosts}  # PBS_NODEFILE has full names, gethostname() may not
    spare = [h for h in nodes if h.split(".")[0] not in own]
    if not spare:
        raise RuntimeError(f"{setting}=steps: no node of allocation {where} is free of the "
                           f"job's own ranks ({', '.join(sorted(set(own_hosts)))}); submit with hpcrl submit, which "
                           "adds the nodes the joining ranks need")
    return spare[slot % len(spare)]


def joining_refused(how: str, env, setting: str = "learners.elastic") -> str | None:
    """Why ``setting=how`` cannot add ranks where this run starts (one line), or None."""
    submitted = bool((env.get("SLURM_JOB_ID") or env.get("PBS_JOBID")) and env.get("HPCRL_SITE"))
    if how == "jobs" and not submitted:
        return (f"{setting}=jobs: joining ranks are submitted as batch jobs (sbatch, qsub), and this run is not in "
                "a batch job of hpcrl submit (no SLURM_JOB_ID or PBS_JOBID with HPCRL_SITE); allowed here: "
                f"{setting}=steps (a second mpiexec on this machine) or park")
    if how == "steps" and env.get("PBS_JOBID") and not (env.get("PBS_NODEFILE") and env.get("HPCRL_SITE")):
        return (f"{setting}=steps: this run is in a PBS job not of hpcrl submit (no PBS_NODEFILE / HPCRL_SITE); "
                "PALS has no job steps, so hpcrl adds ranks as a second mpiexec on a spare node that hpcrl submit "
                f"asked for; allowed: {setting}=steps or jobs in a job of hpcrl submit, or park")
    return None


LAUNCHES = {"Srun": "a Slurm site (srun job steps, sbatch jobs)", "PalsMpiexec": "a PALS site (polaris, aurora)"}


def site_launcher(env: dict[str, str], kind: type, setting: str = "learners.elastic"):
    """The launcher of the site this job was submitted to (HPCRL_SITE), which must be a ``kind``
    (:class:`~hpcrl.launchers.Srun` or :class:`~hpcrl.launchers.PalsMpiexec`); one-line RuntimeError otherwise."""
    from hpcrl.launchers import for_site
    from hpcrl.sites import load_site

    launcher = for_site(load_site(env["HPCRL_SITE"]), gpus=True)
    if not isinstance(launcher, kind):
        raise RuntimeError(f"{setting}: site {env['HPCRL_SITE']} launches with {launcher.kind}; allowed: "
                           f"{LAUNCHES[kind.__name__]}")
    return launcher


def join_command(how: str, ranks: int, own_hosts: list[str], slot: int, env: dict[str, str], launch_cfg,
                 command: list[str], log: Path, who: str = "", setting: str = "learners.elastic") -> list[str]:
    """The argv that starts ``command`` on ``ranks`` joining ranks (``how``: ``setting``'s value, steps or jobs;
    ``slot``: which spare node of the allocation, :func:`join_node`; ``who``: the job name's tail, group<slot>
    by default). PBS steps and jobs write their hostfile (.hosts) or script (.pbs) beside ``log``."""
    job_name = f"hpcrl-join-{who or f'group{slot}'}"
    if how == "jobs":
        from hpcrl.join_jobs import joining_jobs

        # its submit command lives as long as the job does (its exit status is the job's)
        return joining_jobs(env, setting).submit_argv(ranks, own_hosts, command, Path(log), job_name)
    if env.get("PBS_JOBID") and env.get("PBS_NODEFILE") and env.get("HPCRL_SITE"):
        from dataclasses import replace

        from hpcrl.launchers import PalsMpiexec

        hostfile = Path(log).with_suffix(".hosts")
        hostfile.write_text(join_node(own_hosts, slot, env, setting) + "\n")
        pals = replace(site_launcher(env, PalsMpiexec, setting), hostfile=str(hostfile))
        return [*pals.words(ranks, ranks), *command]
    if env.get("SLURM_JOB_ID") and env.get("HPCRL_SITE"):
        from hpcrl.launchers import Srun

        name = f"--job-name={job_name}"
        return [*site_launcher(env, Srun, setting).words(ranks, ranks), "--nodes=1",
                f"--nodelist={join_node(own_hosts, slot, env, setting)}", name, *command]
    from hpcrl.launch import find_mpiexec, mpi_flavour
    from hpcrl.launchers import LocalMpiexec

    mpiexec = find_mpiexec(launch_cfg)
    return [*LocalMpiexec(mpiexec, mpi_flavour(mpiexec), tuple(launch_cfg.mpiexec_args)).words(ranks, ranks),
            *command]


class Joiner:
    """A door rank's joining launch, one at a time: its port, its ranks' launch, their connection, their leaving.

    The door (a learner group's root, an actor) is rank 0 of :attr:`comm`, the merged communicator, while the
    ranks are joined. Their files are ``RUN_DIR/joins/WHO-N.*`` for the N-th join (from 0): .port, .ready (host
    and pid of their first rank), .log, .left, and with ``jobs`` the submit command's output (.sbatch, .qsub: the
    job id; :mod:`hpcrl.join_jobs`)."""

    def __init__(self, run_dir: Path, who: str, slot: int, how: str, ranks: int, timeout: float, launch_cfg,
                 own_hosts: list[str], setting: str) -> None:
        self.run_dir, self.who, self.slot, self.how, self.ranks = Path(run_dir), who, slot, how, ranks
        self.timeout, self.launch_cfg, self.own_hosts, self.setting = timeout, launch_cfg, own_hosts, setting
        self.port = JoinPort()  # the MPI half: the port, the merged communicator
        self.joins = 0
        self.joined_at = 0.0
        self._proc: subprocess.Popen | None = None
        self._first: tuple[str, int] | None = None  # host and pid of the joined ranks' first rank
        self._stem: Path | None = None  # RUN_DIR/joins/WHO-N: the current join's files are this with a suffix
        self._jobs = None  # jobs: the scheduler's JoiningJobs (hpcrl.join_jobs), chosen at the first join

    @property
    def comm(self):
        """The door (rank 0) and the joined ranks, while they are here; None otherwise."""
        return self.port.comm

    @property
    def folder(self) -> Path:
        return self.run_dir / JOIN_DIR

    def join(self, role: list[str], tick: Callable[[], None]) -> tuple[str | None, float]:
        """Start ``python -m hpcrl.runtime.runners.join RUN_DIR *role`` on the joining ranks, wait for them (calling
        ``tick`` between looks), accept and merge. Returns (None or why it was given up: join_ended, join_timeout;
        seconds waited)."""
        self.folder.mkdir(exist_ok=True)
        self._stem = stem = self.folder / f"{self.who}-{self.joins}"
        self._first = None
        self.joins += 1
        port_file, ready_file = stem.with_suffix(".port"), stem.with_suffix(".ready")
        tmp = stem.with_suffix(".port.tmp")
        tmp.write_text(self.port.open())
        os.replace(tmp, port_file)
        argv = [sys.executable, "-m", "hpcrl.runtime.runners.join", str(self.run_dir), *role,
                "--port-file", str(port_file), "--ready-file", str(ready_file),
                "--root", f"{socket.gethostname()}:{os.getpid()}"]
        log = stem.with_suffix(".log")
        env = dict(os.environ)
        command = join_command(self.how, self.ranks, self.own_hosts, self.slot, env, self.launch_cfg,
                               argv, log, self.who.replace("-", ""), self.setting)
        if self.how == "jobs" and self._jobs is None:
            from hpcrl.join_jobs import joining_jobs

            self._jobs = joining_jobs(env, self.setting)
        # jobs: the submit command's own output (the job id) apart from the job's (its log)
        out = stem.with_suffix(self._jobs.id_suffix) if self._jobs else log
        with open(out, "w") as f:
            self._proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=step_environment(dict(os.environ), self.how), start_new_session=True)
        start = time.monotonic()
        while not ready_file.exists():
            tick()
            ended = self._proc.poll()
            if ended is not None or time.monotonic() - start > self.timeout:
                self._stop_step()
                self.port.close()
                return ("join_ended" if ended is not None else "join_timeout"), time.monotonic() - start
            time.sleep(0.02)
        host, pid = ready_file.read_text().split()
        self._first = (host, int(pid))
        self.port.accept()  # MPI_Comm_accept has no timeout: entered only once their first rank is about to connect
        self.joined_at = time.monotonic()
        return None, self.joined_at - start

    def given_up(self, why: str, what: str, meanwhile: str) -> None:
        """Say in one line that ``what`` (the joining ranks) were given up (``why``: join_ended, join_timeout) and
        what the door does ``meanwhile``."""
        print(f"hpcrl: {what} " + ("ended before connecting" if why == "join_ended" else
                                   f"did not connect within {self.setting.rsplit('.', 1)[0]}.join_timeout_seconds="
                                   f"{self.timeout:g}") + f" (log: {self.folder}); {meanwhile}", flush=True)

    def dropped(self, code: int, what: str, meanwhile: str) -> None:
        """Say in one line that ``what`` (the joined ranks) ended while joined (``code``: their launch's exit status)
        and what the door does ``meanwhile``."""
        print(f"hpcrl: {what} ended (launch exit {code}; log: {self.folder}); {meanwhile}", flush=True)

    def record_job(self, reports) -> None:
        """jobs: the joining job as an ``allocations`` row, through the door's reports (rank 0 writes it; hpcrl
        analyze bills it); nothing for steps."""
        if self._jobs and (row := self.job_row()) is not None:
            reports.send(JoiningJob(time=time.time(), columns=row))

    def lost(self) -> bool:
        """The joined ranks' launch has ended, or (on this host) their first rank's process."""
        return self._proc.poll() is not None or (self._first is not None and process_gone(*self._first))

    def job_row(self) -> dict | None:
        """jobs: the current joining job as an ``allocations`` row (hpcrl analyze bills it)."""
        return self._jobs.row(self._job_id())

    def _job_id(self) -> str:
        """jobs: the current joining job's id, as its submit command printed it ('' before it did)."""
        return self._jobs.job_id(self._stem.with_suffix(self._jobs.id_suffix).read_text())

    def _stop_step(self) -> int:
        """End the launch's process (it ended by itself, or is killed; a joining job is cancelled): its exit status."""
        if self._jobs and self._proc.poll() is None and (job := self._job_id()):
            subprocess.run(self._jobs.cancel_argv(job), capture_output=True, timeout=30)
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
                return self._proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self._proc.pid, signal.SIGKILL)
        return self._proc.wait()

    def drop(self) -> int:
        """The joined ranks' launch ended while the door waited for them: end it, forget them (their communicators
        are not freed: a disconnect would wait for the dead). Its exit status."""
        code = self._stop_step()
        self.port.forget()
        return code

    def leave(self) -> int:
        """After the door released them: disconnect and wait until they left and their launch ended (0: cleanly).
        ``MPI_Comm_disconnect`` waits for the other side and has no timeout: the door enters it only once their
        first rank is about to (it writes .leaving); a launch that ends first, or no .leaving within a minute, is
        dropped instead (:meth:`drop`: its exit status, or -1 after the minute)."""
        leaving, left = self._stem.with_suffix(".leaving"), self._stem.with_suffix(".left")
        deadline = time.monotonic() + 60
        while not leaving.exists():
            if self.lost() or time.monotonic() > deadline:
                code = self.drop()
                return code if code else -1
            time.sleep(0.01)
        self.port.disconnect()
        deadline = time.monotonic() + 60
        while self._proc.poll() is None and not left.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._jobs and self._proc.poll() is None and left.exists():
            # the blocking submit command: its job ends by itself now; sbatch --wait would poll for up to half a
            # minute more, and it finishes its poll before it acts on SIGTERM
            self._proc.kill()
            self._proc.wait()
            return 0  # the ranks left cleanly (they write .left after they disconnected)
        try:
            return self._proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            return self._stop_step()


def group_joiner(run_dir: Path, group: int, learners, launch, own_hosts: list[str], counters, reports
                 ) -> JoiningGroupReduce:
    """A learner group root's GroupReduce whose ``learners.ranks_per_group - 1`` other ranks join while the group is
    active (``learners.elastic``: steps or jobs); its node slot is the group's."""
    size = learners.ranks_per_group
    joiner = Joiner(run_dir, f"group-{group}", group, learners.elastic, size - 1, learners.join_timeout_seconds,
                    launch, own_hosts, "learners.elastic")
    return JoiningGroupReduce(group, size, joiner, counters, reports)


def actor_joiner(run_dir: Path, actor: int, learners, actors, launch, own_hosts: list[str]) -> Joiner:
    """The Joiner of an actor whose sampling joins the job while it is active (``actors.elastic``: steps or jobs).
    Its node slot comes after the joining learner groups' (``hpcrl submit`` asks for one node per group that can be
    active, then one per actor)."""
    slot = (learners.active_range[1] if learners.elastic == "steps" else 0) + actor
    return Joiner(run_dir, f"actor-{actor}", slot, actors.elastic, 1, actors.join_timeout_seconds, launch, own_hosts,
                  "actors.elastic")
