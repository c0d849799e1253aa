"""A learner group whose other ranks join the running job while it is active (``learners.elastic: steps | jobs``).

The group's root is in the job's own launch (it takes fragments, prepares batches and pushes, as any
root); its other ``ranks_per_group - 1`` ranks are not. The first time the group has a batch to train
after it was activated (or at the start, for a group active from the start), the root

1. opens an MPI port and writes it to ``RUN_DIR/joins/group-G-N.port``;
2. starts the ranks: with ``steps`` as a new job step, ``srun --nodes=1 --nodelist=<a node of the allocation
   without the job's own ranks> --ntasks=L-1`` inside a Slurm allocation (the site of ``hpcrl submit``'s
   script, HPCRL_SITE), local ``mpiexec -n L-1`` elsewhere; with ``jobs`` as a batch job of its own,
   ``sbatch --wait --nodes=1 --wrap "srun ..."`` in the job's partition, recorded as an ``allocations`` row
   so that ``hpcrl analyze`` bills it; each rank runs ``python -m hpcrl.runtime.runners.join``
   (runtime/runners/join.py);
3. waits, beating and taking fragments, until their first rank writes ``group-G-N.ready`` just before it
   connects, then accepts: ``MPI_Comm_accept`` has no timeout and holds MPICH's lock (the other thread
   of a root waiting in it could not even beat), so the root enters it only once the ranks are there;
   a step that ends first, or is not ready within ``learners.join_timeout_seconds`` (queued, dead), is
   killed and given up: the root computes alone until the group is parked and activated again;
4. merges the intercommunicator into one communicator (the root is rank 0) and works with it as with a
   launched group, in point-to-point messages that the root polls (:class:`JoinedReduce`: shares out, the
   members' share gradients back to the root, which averages them): a joined rank that dies (its job
   cancelled, its node lost) ends its launch, and the root, which checks that launch while it waits, drops
   the joined ranks instead of waiting for ever in a collective. The minibatch in flight is then trained on
   the root's own share; every gradient already pushed stays admitted, and none is pushed twice.

When the group parks (or the run ends) the root releases the joined ranks; they leave (disconnect) and
exit, so their step (job) ends and its node goes back to the allocation (the cluster). Each join, leave and given-up join
is a row of ``elastic_events`` (via the root's activity reports), with its seconds.

Steps 1-3, the disconnect and the launch's end are :class:`Joiner`'s (one join at a time for one door rank); an
actor whose sampler joins while it is active (``actors.elastic``, runtime/roles/joining_sampler.py) uses it too.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.messages import ELASTIC_ACTION, ELASTIC_REASON, GroupEvent, JoiningJob
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.group_reduce import member_work, share_of

if TYPE_CHECKING:
    import torch

JOIN_DIR = "joins"
STEP_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CONF", "SLURM_CLUSTER_NAME", "SLURM_JOB_NODELIST",
                  "SLURM_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_SUBMIT_DIR", "SLURM_JOB_PARTITION",
                  "SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS")
"""The SLURM_ variables a joining step is started with: the allocation's, not the root's own step's (its task
counts, ranks and binding would become the new step's defaults)."""


def step_environment(env: dict[str, str], how: str = "steps") -> dict[str, str]:
    """``env`` without what makes this process a rank of its own launch (PMI, Hydra, its Slurm step; with ``jobs``
    every SLURM_ variable: the new job gets its own)."""
    keep = STEP_VARIABLES if how == "steps" else ()
    out = {k: v for k, v in env.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPI_LOCAL"))
           and (not k.startswith("SLURM_") or k in keep)}
    # no shared-memory transport to the root (UCX's cma reads a peer's memory: a joined rank killed mid-transfer
    # aborts the root on the same host), unless the user chose the transports
    out.setdefault("UCX_TLS", "^sm")
    return out


def join_node(own_hosts: list[str], slot: int, env: dict[str, str], setting: str = "learners.elastic") -> str:
    """The node of the Slurm allocation where joining launch ``slot`` runs: the allocation's nodes that hold none
    of the job's own ranks, one per slot (``hpcrl submit`` asks for one per learner group that can be active at
    once, then one per actor: slots 0 .. G-1 are the groups', G + a actor a's; left to Slurm, two steps would
    queue behind each other on one node)."""
    out = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True,
                         timeout=30)
    spare = [h for h in out.stdout.split() if h not in set(own_hosts)]
    if out.returncode or not spare:
        raise RuntimeError(f"{setting}=steps: no node of allocation {env['SLURM_JOB_NODELIST']} is free of the "
                           f"job's own ranks ({', '.join(sorted(set(own_hosts)))}); submit with hpcrl submit, which "
                           "adds the nodes the joining ranks need")
    return spare[slot % len(spare)]


def joining_refused(how: str, env, setting: str = "learners.elastic") -> str | None:
    """Why ``setting=how`` cannot add ranks where this run starts (one line), or None."""
    slurm = bool(env.get("SLURM_JOB_ID") and env.get("HPCRL_SITE"))
    if how == "jobs" and not slurm:
        return (f"{setting}=jobs: joining ranks are submitted as Slurm batch jobs, and this run is not in a "
                "batch job of hpcrl submit on a Slurm site (no SLURM_JOB_ID / HPCRL_SITE); allowed here: "
                f"{setting}=steps (a second mpiexec on this machine) or park")
    if env.get("PBS_JOBID"):
        return (f"{setting}={how}: this run is in a PBS job, where hpcrl cannot start joining ranks (PALS "
                f"has no job steps on other nodes of the allocation); allowed: {setting}=park")
    return None


def site_srun(env: dict[str, str], setting: str = "learners.elastic"):
    """The Srun launcher of the site this job was submitted to (HPCRL_SITE)."""
    from hpcrl.launchers import Srun, for_site
    from hpcrl.sites import load_site

    launcher = for_site(load_site(env["HPCRL_SITE"]), gpus=True)
    if not isinstance(launcher, Srun):
        raise RuntimeError(f"{setting}: site {env['HPCRL_SITE']} launches with {launcher.kind}; allowed: a "
                           "Slurm site (srun job steps, sbatch jobs)")
    return launcher


def join_command(how: str, ranks: int, own_hosts: list[str], slot: int, env: dict[str, str], launch_cfg,
                 command: list[str], log: Path, who: str = "", setting: str = "learners.elastic") -> list[str]:
    """The argv that starts ``command`` on ``ranks`` joining ranks (``how``: ``setting``'s value, steps or jobs;
    ``slot``: which spare node of the allocation, :func:`join_node`; ``who``: the job name's tail, group<slot>
    by default)."""
    name = f"--job-name=hpcrl-join-{who or f'group{slot}'}"
    if how == "jobs":
        if not (env.get("SLURM_JOB_ID") and env.get("HPCRL_SITE")):
            raise RuntimeError(f"{setting}=jobs: this run is not in a Slurm batch job of hpcrl submit "
                               f"(no SLURM_JOB_ID / HPCRL_SITE); allowed there only, or {setting}=steps")
        from hpcrl.launchers import shell_line

        queue = [f"--partition={env['SLURM_JOB_PARTITION']}"] if env.get("SLURM_JOB_PARTITION") else []
        account = [f"--account={env['SLURM_JOB_ACCOUNT']}"] if env.get("SLURM_JOB_ACCOUNT") else []
        # --wait: this process lives as long as the job does (its exit status is the job's)
        # not on the job's own nodes, where a shared partition would pack it beside the job's ranks
        away = f"--exclude={','.join(sorted(set(own_hosts)))}"
        return ["sbatch", "--wait", "--parsable", "--nodes=1", f"--ntasks={ranks}", name, f"--output={log}", away,
                *queue, *account, "--wrap", shell_line([*site_srun(env, setting).words(ranks, ranks), *command])]
    if env.get("SLURM_JOB_ID") and env.get("HPCRL_SITE"):
        return [*site_srun(env, setting).words(ranks, ranks), "--nodes=1",
                f"--nodelist={join_node(own_hosts, slot, env, setting)}", name, "--kill-on-bad-exit=1", *command]
    from hpcrl.launch import find_mpiexec, mpi_flavour
    from hpcrl.launchers import LocalMpiexec

    mpiexec = find_mpiexec(launch_cfg)
    return [*LocalMpiexec(mpiexec, mpi_flavour(mpiexec), tuple(launch_cfg.mpiexec_args)).words(ranks, ranks),
            *command]


class JoinLost(Exception):
    """The joined ranks' launch ended while the root waited for them."""


def process_gone(host: str, pid: int) -> bool:
    """True once process ``pid`` on ``host`` (this host only; elsewhere False: the launch's end tells) has exited,
    reaped or not. A send to a rank that died crashes MPICH (a segfault in the UCX path, measured), and the launch
    that started it ends only some milliseconds after it, so the sides look at each other's process before each
    send."""
    if host != socket.gethostname():
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # the state, after "(comm)"
    except (OSError, IndexError):
        return True


def sending(requests: Callable[[], list], lost: Callable[[], bool]) -> None:
    """Start ``requests()`` unless ``lost()``, then :func:`wait_or_lost` for them (:class:`JoinLost` either way)."""
    if lost():
        raise JoinLost("the other side of a joined communicator is gone")
    wait_or_lost(requests(), lost)


def wait_or_lost(requests, lost: Callable[[], bool]) -> None:
    """Wait (sleeping) for ``requests``, checking ``lost()`` (the other side's launch or process is gone) between
    polls: :class:`JoinLost` then (the requests stay pending: the communicator is dropped, never freed)."""
    from mpi4py import MPI

    backoff = Backoff(5e-5, 2e-3)
    while not MPI.Request.Testall(requests):
        if lost():
            raise JoinLost("the other side of a joined communicator is gone")
        backoff.sleep()


class JoinedReduce:
    """The root and its joined ranks over their merged communicator, in polled point-to-point messages.

    ``lost()`` (root: the joined ranks' launch has ended; member: the root is gone) is checked between polls;
    the root raises :class:`JoinLost`, a member RuntimeError."""

    def __init__(self, comm, lost: Callable[[], bool]) -> None:
        self.comm, self.lost = comm, lost
        self.size, self.rank = comm.Get_size(), comm.Get_rank()

    def _wait(self, requests: Callable[[], list]) -> None:
        try:
            sending(requests, self.lost)
        except JoinLost:
            if self.rank:
                raise RuntimeError("the root is gone") from None
            raise

    def hand_out(self, weights: np.ndarray, minibatch: dict, window: list[np.ndarray] | None
                 ) -> tuple[dict, list[np.ndarray] | None]:
        self._wait(lambda: [self.comm.isend(member_work(weights, minibatch, window, r, self.size), dest=r,
                                            tag=control.TAG_WORK) for r in range(1, self.size)])
        return share_of(minibatch, window, 0, self.size)

    def average(self, grad: torch.Tensor) -> np.ndarray:
        """Root: the mean of its own and every member's share gradient; member: its share gradient to the root."""
        mine = np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32)
        if self.rank:
            self._wait(lambda: [self.comm.Isend(mine, dest=0, tag=control.TAG_SHARE)])
            return mine
        theirs = [np.empty_like(mine) for _ in range(1, self.size)]
        self._wait(lambda: [self.comm.Irecv(buf, source=r, tag=control.TAG_SHARE) for r, buf in enumerate(theirs, 1)])
        return (mine + sum(theirs)) / self.size

    def release(self) -> None:
        self._wait(lambda: [self.comm.isend(None, dest=r, tag=control.TAG_WORK) for r in range(1, self.size)])

    def serve(self, share, check) -> None:
        """A member's loop: ``share(weights, batch, window)`` for each piece of work, until None."""
        while True:
            work = control.recv_polling(self.comm, 0, control.TAG_WORK, Backoff(5e-5, 2e-3), abandon=self.lost)
            check()
            if work is None:
                if self.lost():
                    raise RuntimeError("the root is gone")
                return
            share(work["weights"], work["batch"], work["window"])


class Joiner:
    """A door rank's joining launch, one at a time: its port, its ranks' launch, their connection, their leaving.

    The door (a learner group's root, an actor) is rank 0 of :attr:`comm`, the merged communicator, while the
    ranks are joined. Their files are ``RUN_DIR/joins/WHO-N.*`` for the N-th join (from 0): .port, .ready (host
    and pid of their first rank), .log, .left, and with ``jobs`` .sbatch (the job id)."""

    def __init__(self, run_dir: Path, who: str, slot: int, how: str, ranks: int, timeout: float, launch_cfg,
                 own_hosts: list[str], setting: str) -> None:
        self.run_dir, self.who, self.slot, self.how, self.ranks = Path(run_dir), who, slot, how, ranks
        self.timeout, self.launch_cfg, self.own_hosts, self.setting = timeout, launch_cfg, own_hosts, setting
        self.comm = None  # the door and the joined ranks, while they are here
        self.joins = 0
        self.joined_at = 0.0
        self._port = self._inter = self._proc = None
        self._first: tuple[str, int] | None = None  # host and pid of the joined ranks' first rank
        self._stem: Path | None = None  # RUN_DIR/joins/WHO-N: the current join's files are this with a suffix

    @property
    def folder(self) -> Path:
        return self.run_dir / JOIN_DIR

    def join(self, role: list[str], tick: Callable[[], None]) -> tuple[str | None, float]:
        """Start ``python -m hpcrl.runtime.runners.join RUN_DIR *role`` on the joining ranks, wait for them (calling
        ``tick`` between looks), accept and merge. Returns (None or why it was given up: join_ended, join_timeout;
        seconds waited)."""
        from mpi4py import MPI

        self.folder.mkdir(exist_ok=True)
        self._stem = stem = self.folder / f"{self.who}-{self.joins}"
        self._first = None
        self.joins += 1
        port_file, ready_file = stem.with_suffix(".port"), stem.with_suffix(".ready")
        self._port = MPI.Open_port()
        tmp = stem.with_suffix(".port.tmp")
        tmp.write_text(self._port)
        os.replace(tmp, port_file)
        argv = [sys.executable, "-m", "hpcrl.runtime.runners.join", str(self.run_dir), *role,
                "--port-file", str(port_file), "--ready-file", str(ready_file),
                "--root", f"{socket.gethostname()}:{os.getpid()}"]
        log = stem.with_suffix(".log")
        command = join_command(self.how, self.ranks, self.own_hosts, self.slot, dict(os.environ), self.launch_cfg,
                               argv, log, self.who.replace("-", ""), self.setting)
        # jobs: sbatch's own output (the job id) apart from the job's (--output=log)
        out = stem.with_suffix(".sbatch") if self.how == "jobs" else log
        with open(out, "w") as f:
            self._proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=step_environment(dict(os.environ), self.how), start_new_session=True)
        start = time.monotonic()
        while not ready_file.exists():
            tick()
            ended = self._proc.poll()
            if ended is not None or time.monotonic() - start > self.timeout:
                self._stop_step()
                MPI.Close_port(self._port)
                return ("join_ended" if ended is not None else "join_timeout"), time.monotonic() - start
            time.sleep(0.02)
        host, pid = ready_file.read_text().split()
        self._first = (host, int(pid))
        self._inter = MPI.COMM_SELF.Accept(self._port)
        self.comm = self._inter.Merge(high=False)
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
        analyze bills it from sacct); nothing for steps."""
        if self.how == "jobs" and (row := self.job_row()) is not None:
            reports.send(JoiningJob(time=time.time(), columns=row))

    def lost(self) -> bool:
        """The joined ranks' launch has ended, or (on this host) their first rank's process."""
        return self._proc.poll() is not None or (self._first is not None and process_gone(*self._first))

    def job_row(self) -> dict | None:
        """jobs: the current joining job as an ``allocations`` row (hpcrl analyze bills it from sacct)."""
        from hpcrl.runtime.record.allocation import batch_job

        return batch_job({**os.environ, "SLURM_JOB_ID": self._job_id(), "SLURM_JOB_NUM_NODES": "1",
                          "SLURM_STEP_ID": ""})

    def _job_id(self) -> str:
        """jobs: the current joining job's id, as sbatch --parsable printed it ('' before it did)."""
        return self._stem.with_suffix(".sbatch").read_text().split(";")[0].strip()

    def _stop_step(self) -> int:
        """End the launch's process (it ended by itself, or is killed; a joining job is cancelled): its exit status."""
        if self.how == "jobs" and self._proc.poll() is None and (job := self._job_id()):
            subprocess.run(["scancel", job], capture_output=True, timeout=30)
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
        from mpi4py import MPI

        code = self._stop_step()
        MPI.Close_port(self._port)
        self.comm = None
        return code

    def leave(self) -> int:
        """After the door released them: disconnect and wait until they left and their launch ended (0: cleanly).
        ``MPI_Comm_disconnect`` waits for the other side and has no timeout: the door enters it only once their
        first rank is about to (it writes .leaving); a launch that ends first, or no .leaving within a minute, is
        dropped instead (:meth:`drop`: its exit status, or -1 after the minute)."""
        from mpi4py import MPI

        leaving, left = self._stem.with_suffix(".leaving"), self._stem.with_suffix(".left")
        deadline = time.monotonic() + 60
        while not leaving.exists():
            if self.lost() or time.monotonic() > deadline:
                code = self.drop()
                return code if code else -1
            time.sleep(0.01)
        self.comm.Free()
        self._inter.Disconnect()
        MPI.Close_port(self._port)
        self.comm = None
        deadline = time.monotonic() + 60
        while self._proc.poll() is None and not left.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.how == "jobs" and self._proc.poll() is None and left.exists():
            # sbatch --wait: its job ends by itself now; it would poll for up to half a minute more, and it
            # finishes its poll before it acts on SIGTERM
            self._proc.kill()
            self._proc.wait()
            return 0  # the ranks left cleanly (they write .left after they disconnected)
        try:
            return self._proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            return self._stop_step()


class JoiningGroupReduce:
    """The group root's :class:`protocols.GroupReduce` for a group whose members join and leave."""

    def __init__(self, run_dir: Path, group: int, learners_cfg, launch_cfg, own_hosts: list[str],
                 counters, reports) -> None:
        self.group, self.size = group, learners_cfg.ranks_per_group
        self.joiner = Joiner(run_dir, f"group-{group}", group, learners_cfg.elastic, self.size - 1,
                             learners_cfg.join_timeout_seconds, launch_cfg, own_hosts, "learners.elastic")
        self.counters, self.reports = counters, reports
        self.inner: JoinedReduce | None = None  # over the root and the joined ranks, while they are here
        self.given_up = False  # this activation's join failed: the root computes alone until the next one

    # ---- join and leave ----------------------------------------------------------------------
    def ready(self, tick: Callable[[], None]) -> None:
        if self.inner is None and not self.given_up:
            self._join(tick)

    def _join(self, tick: Callable[[], None]) -> None:
        why, waited = self.joiner.join(["--group", str(self.group)], tick)
        if why is not None:
            self.given_up = True
            self._event("join_given_up", why, waited)
            self.joiner.given_up(why, f"learner group {self.group}: its {self.size - 1} joining rank(s)",
                                 "the group's root computes alone until it is parked")
            return
        self.inner = JoinedReduce(self.joiner.comm, self.joiner.lost)
        self._event("joined", "job_step", waited)
        self.joiner.record_job(self.reports)

    def _lost(self) -> None:
        """The joined ranks' launch ended while the root waited for them: drop them, say so, go on alone."""
        seconds = time.monotonic() - self.joiner.joined_at
        code = self.joiner.drop()
        self.inner = None
        self.given_up = True
        self._event("left", "join_ended", seconds)
        self.joiner.dropped(code, f"learner group {self.group}: its joined ranks",
                            "the group's root computes alone until it is parked")

    def _leave(self) -> None:
        """Release the joined ranks, disconnect; they exit and their step ends."""
        if self.inner is None:
            self.given_up = False  # the next activation tries again
            return
        try:
            self.inner.release()
        except JoinLost:
            self._lost()
            self.given_up = False
            return
        seconds = time.monotonic() - self.joiner.joined_at
        code = self.joiner.leave()
        self.inner = None
        self._event("left", "job_step" if code == 0 else "join_ended", seconds)

    def _event(self, action: str, reason: str, seconds: float) -> None:
        self.reports.send(GroupEvent(time=time.time(), group=self.group, action=ELASTIC_ACTION[action],
                                     reason=ELASTIC_REASON[reason], active_groups=int(self.counters.read(control.ACTIVE)),
                                     parked_seconds=seconds, cpu_seconds=0.0))

    # ---- protocols.GroupReduce ---------------------------------------------------------------
    def hand_out(self, weights: np.ndarray, minibatch: dict, window: list[np.ndarray] | None
                 ) -> tuple[dict, list[np.ndarray] | None]:
        if self.inner is not None:
            try:
                return self.inner.hand_out(weights, minibatch, window)
            except JoinLost:
                self._lost()
        return share_of(minibatch, window, 0, 1)  # given up or lost: the whole minibatch is the root's

    def average(self, grad: torch.Tensor) -> np.ndarray:
        if self.inner is not None:
            try:
                return self.inner.average(grad)
            except JoinLost:  # this minibatch's gradient is the root's own share's
                self._lost()
        return grad.detach().cpu().numpy()

    def park(self) -> None:
        self._leave()

    def release(self) -> None:
        self._leave()

    def serve(self, share, check, beat) -> None:
        raise TypeError("a joining group's members serve in hpcrl.runtime.runners.join, not in the job's launch")

    def close(self) -> None:
        self._leave()
