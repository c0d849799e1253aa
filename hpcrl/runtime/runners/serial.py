"""``launch.runner: serial``: every role of the job in this one process, no MPI.

The same role objects as an MPI job (:class:`~hpcrl.runtime.roles.parameter.ParameterRank`,
:class:`~hpcrl.runtime.roles.learner.LearnerGroup`, :class:`~hpcrl.runtime.roles.actor.Actor`), the same
admission policy, stop rule, checkpoints and files; only the shared objects are the in-memory
twins of :mod:`hpcrl.runtime.transport.local`. The parameter role runs in the calling (main) thread, so
SIGTERM/SIGUSR1 reach it as in an MPI job; each learner group and actor runs in a thread of its
own, with its own model (a role never touches another's weights except through the board).

A failing role sets the shared abort flag: every other role stops at its next counter read
(:class:`~hpcrl.runtime.transport.local.RunAborted`), files are closed, and the run's result names the
role that failed first, with its traceback. A learner group of several ranks (``learners.ranks_per_group``)
is as many threads: the root hands the others their shares of each minibatch and the group averages the
shares' gradients as the MPI group does (:class:`~hpcrl.runtime.transport.local.LocalGroup`).
"""
from __future__ import annotations

import platform
import signal
import threading
import traceback
from pathlib import Path

from hpcrl.config import RunConfig
from hpcrl.runtime.transport import control
from hpcrl.runtime.runners.job import Job, fragment_layout_for, role_parts, roll_back_record
from hpcrl.runtime.transport.local import (LocalBoard, LocalCounters, LocalFragments, LocalGroup, LocalMailbox,
                                           LocalReports, RunAborted)
from hpcrl.runtime.plan import Plan
from hpcrl.runtime.runners import RunResult
from hpcrl.runtime.roles.sampler import describe_env
from hpcrl.runtime.topology import Topology, plan_roles

JOIN_SECONDS = 30.0
"""How long the parameter role waits for the other roles' threads after the run ends or fails."""


class RoleFailed(RuntimeError):
    """A role of a serial run raised; the message names it, ``details`` holds its traceback."""

    def __init__(self, message: str, details: str):
        super().__init__(message)
        self.details = details


def topologies(cfg: RunConfig) -> list[Topology]:
    """One Topology per role, as an MPI job of ``cfg.num_ranks`` ranks would have (no communicators)."""
    roles = plan_roles(cfg.num_ranks, cfg.learners.groups, cfg.learners.ranks_per_group, cfg.actors.count)
    host = platform.node()
    return [Topology(comm=None, rank=r, size=len(roles), role=x.role, group=x.group, group_rank=x.group_rank,
                     group_comm=None, node_comm=None, groups=cfg.learners.groups,
                     ranks_per_group=cfg.learners.ranks_per_group, roles=roles, nodes=[host] * len(roles),
                     node_ranks=list(range(len(roles))))
            for r, x in enumerate(roles)]


def build_jobs(plan: Plan, run_dir: Path, resume: bool, progress: str, abort: threading.Event) -> list[Job]:
    """A Job per role, sharing one set of in-memory counters, mailbox, board, reports and fragment queues; a
    learner rank's Job holds its rank of its group's LocalGroup."""
    from hpcrl.runtime.record.progress import ProgressEmitter

    cfg = plan.config
    rolled_back = roll_back_record(run_dir) if resume else None  # before any role opens a file
    env = describe_env(cfg.env)
    G, A = cfg.learners.groups, cfg.actors.count
    topos = topologies(cfg)
    parts = [role_parts(cfg, env, topo) for topo in topos]
    model0 = parts[0][1]
    probes = [None] * len(parts)
    if cfg.actors.weight_sync == "aaps":  # one probe per role (each evaluates its own model), one set of states
        from hpcrl.runtime.roles.aaps import Probe, probe_states

        states = probe_states(cfg.env, cfg.actors.probe_batch)
        probes = [Probe(states, model, cfg.actors.aaps_delta) for _, model, _ in parts]
    probe_size = 0 if probes[0] is None else probes[0].size
    P = model0.flat.num_params
    counters = LocalCounters(control.num_counters(G, cfg.num_ranks), abort)
    mailbox = LocalMailbox(G, cfg.aggregation.mailbox_slots, P, stats_capacity=len(control.GRAD_STATS))
    board = LocalBoard(P, history=max(2, cfg.aggregation.weight_history), probe_size=probe_size)
    reports = LocalReports()
    fragments = LocalFragments(fragment_layout_for(cfg, env, model0), G, A, cfg.actors.max_in_flight, abort)
    groups = [LocalGroup(cfg.learners.ranks_per_group, abort) for _ in range(G)]
    jobs = []
    for topo, (algo, model, traj_layout), probe in zip(topos, parts, probes):
        jobs.append(Job(cfg=cfg, plan=plan, topo=topo, run_dir=run_dir, resume=resume, runner="serial", algo=algo,
                        model=model, env=env, traj_layout=traj_layout, counters=counters, mailbox=mailbox,
                        board=board, reports=reports, fragments=fragments, probe=probe, rolled_back=rolled_back,
                        group_reduce=groups[topo.group].rank(topo.group_rank) if topo.role == "learner" else None,
                        progress=ProgressEmitter(progress, cfg.io.log_seconds) if topo.role == "parameter"
                        else None))
    return jobs


def run(plan: Plan, run_dir: Path, resume: bool = False, progress: str = "plain") -> RunResult:
    """Run the plan's whole job in this process. The result holds the summary (why it stopped: the stop rule or
    a signal, after a checkpoint), or names the role that failed first (EXIT_FAILED; its traceback in details)."""
    import torch

    from hpcrl.runtime.runners.mpi import make_role

    torch.set_num_threads(1)
    abort = threading.Event()
    run_dir = Path(run_dir)
    jobs = build_jobs(plan, run_dir, resume, progress, abort)
    roles = [make_role(job) for job in jobs]
    failures: list[tuple[Job, BaseException, str]] = []

    def guarded(job: Job, body) -> None:
        try:
            body()
        except RunAborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - any failure ends the run
            failures.append((job, exc, traceback.format_exc()))
            abort.set()

    parameter = roles[0]

    def interrupt(signum, _frame):  # first Ctrl-C: stop and checkpoint as SIGTERM does; second: now
        if parameter.signals.received is not None:
            raise KeyboardInterrupt
        parameter.signals.received = signum

    old_handler = signal.signal(signal.SIGINT, interrupt)
    try:
        _run_roles(jobs, roles, failures, guarded, abort)
    except RoleFailed as exc:
        return RunResult.failed("serial", run_dir, f"{exc}; run directory {run_dir}", details=exc.details)
    finally:
        signal.signal(signal.SIGINT, old_handler)
    return RunResult.ended("serial", run_dir, parameter.summary)


def _run_roles(jobs, roles, failures, guarded, abort) -> None:
    parameter = roles[0]
    guarded(jobs[0], parameter.publish_initial)
    startup = parameter.startup_info() if not failures else {}
    threads = []
    for job, role in zip(jobs[1:], roles[1:]):
        job.startup = startup
        t = threading.Thread(target=guarded, args=(job, role.run), name=f"hpcrl-{job.topo.role}-{job.rank}",
                             daemon=True)
        threads.append(t)
    if not failures:
        for t in threads:
            t.start()
        guarded(jobs[0], parameter.run)
    for t in threads:
        if t.is_alive():
            t.join(JOIN_SECONDS)
    if failures or any(t.is_alive() for t in threads):
        abort.set()
        for role in roles:
            role.close_on_error()
        if not failures:
            raise RoleFailed(f"serial run: roles still running {JOIN_SECONDS:.0f} s after the end: "
                             f"{', '.join(t.name for t in threads if t.is_alive())}", "")
        job, exc, details = failures[0]
        raise RoleFailed(f"rank {job.rank} ({job.topo.role}) failed: {type(exc).__name__}: {exc}", details)
