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


def join_node(own_hosts: list[str], group: int, env: dict[str, str]) -> str:
    """The node of the Slurm allocation where ``group``'s joining ranks run: the allocation's nodes that hold none of
    the job's own ranks, one per group (``hpcrl submit`` asks for one per group that can be active at once; left to
    Slurm, two steps queued behind each other on one node)."""
    out = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True,
                         timeout=30)
    spare = [h for h in out.stdout.split() if h not in set(own_hosts)]
    if out.returncode or not spare:
        raise RuntimeError(f"learners.elastic=steps: no node of allocation {env['SLURM_JOB_NODELIST']} is free of the "
                           f"job's own ranks ({', '.join(sorted(set(own_hosts)))}); submit with hpcrl submit, which "
                           "adds one node per learner group that can be active")
    return spare[group % len(spare)]


def joining_refused(how: str, env) -> str | None:
    """Why ``learners.elastic=how`` cannot add ranks where this run starts (one line), or None."""
    slurm = bool(env.get("SLURM_JOB_ID") and env.get("HPCRL_SITE"))
    if how == "jobs" and not slurm:
        return ("learners.elastic=jobs: joining ranks are submitted as Slurm batch jobs, and this run is not in a "
                "batch job of hpcrl submit on a Slurm site (no SLURM_JOB_ID / HPCRL_SITE); allowed here: "
                "learners.elastic=steps (a second mpiexec on this machine) or park")
    if env.get("PBS_JOBID"):
        return (f"learners.elastic={how}: this run is in a PBS job, where hpcrl cannot start joining ranks (PALS "
                "has no job steps on other nodes of the allocation); allowed: learners.elastic=park")
    return None


def site_srun(env: dict[str, str]):
    """The Srun launcher of the site this job was submitted to (HPCRL_SITE)."""
    from hpcrl.launchers import Srun, for_site
    from hpcrl.sites import load_site

    launcher = for_site(load_site(env["HPCRL_SITE"]), gpus=True)
    if not isinstance(launcher, Srun):
        raise RuntimeError(f"learners.elastic: site {env['HPCRL_SITE']} launches with {launcher.kind}; allowed: a "
                           "Slurm site (srun job steps, sbatch jobs)")
    return launcher


def join_command(how: str, ranks: int, own_hosts: list[str], group: int, env: dict[str, str], launch_cfg,
                 command: list[str], log: Path) -> list[str]:
    """The argv that starts ``command`` on ``ranks`` joining ranks (``how``: learners.elastic, steps or jobs)."""
    name = f"--job-name=hpcrl-join-group{group}"
    if how == "jobs":
        if not (env.get("SLURM_JOB_ID") and env.get("HPCRL_SITE")):
            raise RuntimeError("learners.elastic=jobs: this run is not in a Slurm batch job of hpcrl submit "
                               "(no SLURM_JOB_ID / HPCRL_SITE); allowed there only, or learners.elastic=steps")
        from hpcrl.launchers import shell_line

        queue = [f"--partition={env['SLURM_JOB_PARTITION']}"] if env.get("SLURM_JOB_PARTITION") else []
        account = [f"--account={env['SLURM_JOB_ACCOUNT']}"] if env.get("SLURM_JOB_ACCOUNT") else []
        # --wait: this process lives as long as the job does (its exit status is the job's)
        # not on the job's own nodes, where a shared partition would pack it beside the job's ranks
        away = f"--exclude={','.join(sorted(set(own_hosts)))}"
        return ["sbatch", "--wait", "--parsable", "--nodes=1", f"--ntasks={ranks}", name, f"--output={log}", away,
                *queue, *account, "--wrap", shell_line([*site_srun(env).words(ranks, ranks), *command])]
    if env.get("SLURM_JOB_ID") and env.get("HPCRL_SITE"):
        return [*site_srun(env).words(ranks, ranks), "--nodes=1", f"--nodelist={join_node(own_hosts, group, env)}",
                name, "--kill-on-bad-exit=1", *command]
    from hpcrl.launch import find_mpiexec, mpi_flavour
    from hpcrl.launchers import LocalMpiexec

    mpiexec = find_mpiexec(launch_cfg)
    return [*LocalMpiexec(mpiexec, mpi_flavour(mpiexec), tuple(launch_cfg.mpiexec_args)).words(ranks, ranks),
            *command]
    from hpcrl.launch import find_mpiexec, mpi_flavour
    from hpcrl.launchers import LocalMpiexec



class JoinLost(Exception):
    """The joined ranks' launch ended while the root waited for them."""


class JoinedReduce:
    """The root and its joined ranks over their merged communicator, in polled point-to-point messages.

    ``lost()`` (root: the joined ranks' launch has ended; member: the root is gone) is checked between polls;
    the root raises :class:`JoinLost`, a member RuntimeError."""

    def __init__(self, comm, lost: Callable[[], bool]) -> None:
        self.comm, self.lost = comm, lost
        self.size, self.rank = comm.Get_size(), comm.Get_rank()

    def _wait(self, requests) -> None:
        from mpi4py import MPI

        backoff = Backoff(5e-5, 2e-3)
        while not MPI.Request.Testall(requests):
            if self.lost():  # the requests stay pending: the communicator is dropped, never freed
                raise JoinLost("the joined ranks' launch ended") if self.rank == 0 else RuntimeError("the root is gone")
            backoff.sleep()

    def hand_out(self, weights: np.ndarray, minibatch: dict, window: list[np.ndarray] | None
                 ) -> tuple[dict, list[np.ndarray] | None]:
        self._wait([self.comm.isend(member_work(weights, minibatch, window, r, self.size), dest=r, tag=control.TAG_WORK)
                    for r in range(1, self.size)])
        return share_of(minibatch, window, 0, self.size)

    def average(self, grad: torch.Tensor) -> np.ndarray:
        """Root: the mean of its own and every member's share gradient; member: its share gradient to the root."""
        mine = np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32)
        if self.rank:
            self._wait([self.comm.Isend(mine, dest=0, tag=control.TAG_SHARE)])
            return mine
        theirs = [np.empty_like(mine) for _ in range(1, self.size)]
        self._wait([self.comm.Irecv(buf, source=r, tag=control.TAG_SHARE) for r, buf in enumerate(theirs, 1)])
        return (mine + sum(theirs)) / self.size

    def release(self) -> None:
        self._wait([self.comm.isend(None, dest=r, tag=control.TAG_WORK) for r in range(1, self.size)])

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


class JoiningGroupReduce:
    """The group root's :class:`protocols.GroupReduce` for a group whose members join and leave."""

    def __init__(self, run_dir: Path, group: int, learners_cfg, launch_cfg, own_hosts: list[str],
                 counters, reports) -> None:
        self.run_dir, self.group, self.size = Path(run_dir), group, learners_cfg.ranks_per_group
        self.timeout, self.launch_cfg, self.own_hosts = learners_cfg.join_timeout_seconds, launch_cfg, own_hosts
        self.how = learners_cfg.elastic  # steps or jobs
        self.counters, self.reports = counters, reports
        self.inner: JoinedReduce | None = None  # over the root and the joined ranks, while they are here
        self.given_up = False  # this activation's join failed: the root computes alone until the next one
        self.joins = 0
        self._port = self._inter = self._proc = None
        self._stem: Path | None = None  # RUN_DIR/joins/group-G-N: the current join's files are this with a suffix
        self._joined_at = 0.0

    # ---- join and leave ----------------------------------------------------------------------
    def ready(self, tick: Callable[[], None]) -> None:
        if self.inner is None and not self.given_up:
            self._join(tick)

    def _join(self, tick: Callable[[], None]) -> None:
        from mpi4py import MPI

        folder = self.run_dir / JOIN_DIR
        folder.mkdir(exist_ok=True)
        self._stem = stem = folder / f"group-{self.group}-{self.joins}"
        self.joins += 1
        port_file, ready_file = stem.with_suffix(".port"), stem.with_suffix(".ready")
        self._port = MPI.Open_port()
        tmp = stem.with_suffix(".port.tmp")
        tmp.write_text(self._port)
        os.replace(tmp, port_file)
        ranks = [sys.executable, "-m", "hpcrl.runtime.runners.join", str(self.run_dir), "--group", str(self.group),
                 "--port-file", str(port_file), "--ready-file", str(ready_file),
                 "--root", f"{socket.gethostname()}:{os.getpid()}"]
        log = stem.with_suffix(".log")
        command = join_command(self.how, self.size - 1, self.own_hosts, self.group, dict(os.environ), self.launch_cfg,
                               ranks, log)
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
                self._give_up(start, "join_ended" if ended is not None else "join_timeout")
                return
            time.sleep(0.02)
        self._inter = MPI.COMM_SELF.Accept(self._port)
        self.inner = JoinedReduce(self._inter.Merge(high=False), lambda: self._proc.poll() is not None)
        self._joined_at = time.monotonic()
        self._event("joined", "job_step", time.monotonic() - start)
        if self.how == "jobs":
            self._record_job()

    def _job_id(self) -> str:
        """jobs: the current joining job's id, as sbatch --parsable printed it ('' before it did)."""
        return self._stem.with_suffix(".sbatch").read_text().split(";")[0].strip()

    def _record_job(self) -> None:
        """The joining job as an allocations row (rank 0 writes it): hpcrl analyze bills it from sacct."""
        from hpcrl.runtime.record.allocation import batch_job

        row = batch_job({**os.environ, "SLURM_JOB_ID": self._job_id(), "SLURM_JOB_NUM_NODES": "1",
                         "SLURM_STEP_ID": ""})
        if row is not None:
            self.reports.send("activity", {"allocation": {"time": time.time(), **row}})

    def _give_up(self, start: float, reason: str) -> None:
        from mpi4py import MPI

        self._stop_step()
        MPI.Close_port(self._port)
        self.given_up = True
        self._event("join_given_up", reason, time.monotonic() - start)
        print(f"hpcrl: learner group {self.group}: its {self.size - 1} joining rank(s) "
              + ("ended before they connected" if reason == "join_ended" else
                 f"did not connect within learners.join_timeout_seconds={self.timeout:g}")
              + f" (log: {self.run_dir / JOIN_DIR}); the group's root computes alone until it is parked", flush=True)

    def _stop_step(self) -> int | None:
        """End the step's process (it ended by itself, or is killed; a joining job is cancelled): its exit status."""
        if self.how == "jobs" and self._proc.poll() is None and (job := self._job_id()):
            subprocess.run(["scancel", job], capture_output=True, timeout=30)
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
                return self._proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self._proc.pid, signal.SIGKILL)
        return self._proc.wait()

    def _lost(self) -> None:
        """The joined ranks' launch ended while the root waited for them: drop them, say so, go on alone."""
        from mpi4py import MPI

        code = self._stop_step()
        MPI.Close_port(self._port)  # their communicators are not freed: a disconnect would wait for the dead
        self.inner = None
        self.given_up = True
        self._event("left", "join_ended", time.monotonic() - self._joined_at)
        print(f"hpcrl: learner group {self.group}: its joined ranks ended (launch exit {code}; log: "
              f"{self.run_dir / JOIN_DIR}); the group's root computes alone until it is parked", flush=True)

    def _leave(self) -> None:
        """Release the joined ranks, disconnect; they exit and their step ends."""
        from mpi4py import MPI

        if self.inner is None:
            self.given_up = False  # the next activation tries again
            return
        try:
            self.inner.release()
        except JoinLost:
            self._lost()
            self.given_up = False
            return
        self.inner.comm.Free()
        self._inter.Disconnect()
        MPI.Close_port(self._port)
        left = self._stem.with_suffix(".left")
        deadline = time.monotonic() + 60
        while self._proc.poll() is None and not left.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.how == "jobs" and self._proc.poll() is None and left.exists():
            # sbatch --wait: its job ends by itself now; it would poll for up to half a minute more, and it
            # finishes its poll before it acts on SIGTERM
            self._proc.kill()
            self._proc.wait()
            code = 0  # the ranks left cleanly (they write .left after they disconnected)
        else:
            try:
                code = self._proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                code = self._stop_step()
        self.inner = None
        self._event("left", "job_step" if code == 0 else "join_ended", time.monotonic() - self._joined_at)

    def _event(self, action: str, reason: str, seconds: float) -> None:
        from hpcrl.runtime.roles.elastic import ACTION, REASON

        self.reports.send("activity", {"parked": {
            "time": time.time(), "group": self.group, "action": ACTION[action], "reason": REASON[reason],
            "active_groups": int(self.counters.read(control.ACTIVE)), "parked_seconds": seconds, "cpu_seconds": 0.0}})

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
