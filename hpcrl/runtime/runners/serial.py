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

import os
import platform
import signal
import threading
import time
import traceback
from pathlib import Path

from hpcrl.io.errors import RecordWriteError
from hpcrl.runtime import collector
from hpcrl.runtime.backoff import ChangeNap, Changes, Doorbell
from hpcrl.runtime.clock import WALL
from hpcrl.runtime.runners.job import Job, make_role
from hpcrl.runtime.runners.job import build_jobs as jobs_in_process
from hpcrl.runtime.runners.threads import one_compute_thread
from hpcrl.runtime.transport.control import RankSilent, mark_finished
from hpcrl.runtime.transport.groups_allreduce import LocalGroupsAllreduce
from hpcrl.runtime.transport.local import (LocalBoard, LocalCounters, LocalFragments, LocalGroup, LocalMailbox,
                                           LocalReports, RunAborted)
from hpcrl.runtime.plan import Plan
from hpcrl.runtime.runners import RunResult
from hpcrl.runtime.roles.sampler import describe_env
from hpcrl.runtime.topology import RankMapFacts, Topology, plan_roles

JOIN_SECONDS = 30.0
"""How long the parameter role waits for the other roles' threads after the run ends or fails."""


class RoleFailed(RuntimeError):
    """A role of a serial run raised; the message names it, ``details`` holds its traceback."""

    def __init__(self, message: str, details: str):
        super().__init__(message)
        self.details = details


def topologies(plan: Plan) -> list[Topology]:
    """One Topology per role, as an MPI job of ``plan.num_ranks`` ranks would have (no communicators)."""
    roles = plan_roles(plan.num_ranks, plan.groups, plan.ranks_per_group, plan.actors)
    nodes = [platform.node()] * len(roles)
    node_ranks, facts = list(range(len(roles))), RankMapFacts(roles, nodes)  # one of each for every rank
    return [Topology(comm=None, rank=r, size=len(roles), role=x.role, group=x.group, group_rank=x.group_rank,
                     group_comm=None, node_comm=None, groups=plan.groups, ranks_per_group=plan.ranks_per_group,
                     roles=roles, nodes=nodes, node_ranks=node_ranks, facts=facts)
            for r, x in enumerate(roles)]


class LocalWiring:
    """The serial runner's shared objects (runners/job.py ``Wiring``): one in-memory twin of each, made at the
    first role's ask and handed to every role; a learner rank gets its rank of its group's LocalGroup."""

    def __init__(self, plan: Plan, abort: threading.Event) -> None:
        self.plan, self.abort = plan, abort
        self.groups = [LocalGroup(plan.ranks_per_group, abort) for _ in range(plan.groups)]
        self.bell = Doorbell()  # rank 0's: pushes and reports ring it
        # each learner group's root's: a fragment or prepared batch sent to the group rings it (the root sleeps
        # while its actors sample instead of taking the interpreter lock 500 times a second)
        self.learner_bells = [Doorbell(5e-5, 5e-3) for _ in range(plan.groups)]
        self.changes = Changes()  # moved by counters, weights and fragment queues: an actor's waits end on it
        self._made: dict[str, object] = {}

    def _once(self, name: str, make):
        if name not in self._made:
            self._made[name] = make()
        return self._made[name]

    def counters(self, words: int):
        return self._once("counters", lambda: LocalCounters(words, self.abort, changes=self.changes))

    def mailbox(self, groups: int, slots: int, num_params: int, stats: int):
        return self._once("mailbox", lambda: LocalMailbox(groups, slots, num_params, stats_capacity=stats,
                                                                bell=self.bell))

    def board(self, num_params: int, history: int, probe_size: int, topo: Topology):
        return self._once("board", lambda: LocalBoard(num_params, history=history, probe_size=probe_size,
                                                      changes=self.changes))

    def reports(self, topo: Topology, run_dir, counters):
        return self._once("reports", lambda: LocalReports(self.bell))

    def fragments(self, layout, max_in_flight: int, topo: Topology):
        return self._once("fragments", lambda: LocalFragments(layout, self.plan.groups, self.plan.actors,
                                                              max_in_flight, self.abort, self.learner_bells,
                                                              self.changes))

    def group_reduce(self, topo: Topology, device, counters, reports):
        return self.groups[topo.group].rank(topo.group_rank)

    def groups_allreduce(self, topo: Topology):
        shared = self._once("groups_allreduce", lambda: LocalGroupsAllreduce(self.plan.groups, self.abort))
        return shared.for_group(topo.group)

    def joiner(self, topo: Topology):
        return None  # joining samplers need MPI ports (the config refuses actors.elastic with launch.runner=serial)

    def clock(self, topo: Topology):
        return WALL

    def parameter_nap(self, topo: Topology):
        return self.bell

    def learner_nap(self, topo: Topology):
        return self.learner_bells[topo.group]

    def actor_nap(self, topo: Topology):
        # up to 0.1 s with nothing changed: the heartbeat and the stop rule look far less often
        return lambda: ChangeNap(self.changes, 5e-5, 0.1)

    def between_steps(self, topo: Topology):
        # the roles share one interpreter lock: hand it to a waiting thread (a learner between two torch ops).
        # sched_yield releases it for a 1 us system call; time.sleep(0) took 97 us here (the kernel's timer slack)
        return os.sched_yield

    def learner_cpu_time(self, topo: Topology):
        # a group's busy time as its thread's CPU seconds: its wall time here includes the waits for the interpreter
        # lock while actors step, which made one group's capacity look too small to park the other
        return time.thread_time


def build_jobs(plan: Plan, run_dir: Path, resume: bool, progress: str, abort: threading.Event) -> list[Job]:
    """A Job per role, sharing one set of in-memory counters, mailbox, board, reports and fragment queues; a
    learner rank's Job holds its rank of its group's LocalGroup."""
    return jobs_in_process(plan, topologies(plan), describe_env(plan.sections.env), run_dir, resume, "serial",
                           LocalWiring(plan, abort), progress)


def run(plan: Plan, run_dir: Path, resume: bool = False, progress: str = "plain") -> RunResult:
    """Run the plan's whole job in this process. The result holds the summary (why it stopped: the stop rule or
    a signal, after a checkpoint), or names the role that failed first (EXIT_FAILED; its traceback in details)."""
    one_compute_thread()
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


def _then_finished(job: Job, run):
    """``run``, then the role's heartbeat word says it returned (the watchdog stops watching it)."""
    def body() -> None:
        run()
        mark_finished(job.counters, job.plan.groups, job.rank)
    return body


def _run_roles(jobs, roles, failures, guarded, abort) -> None:
    parameter = roles[0]
    guarded(jobs[0], parameter.publish_initial)
    startup = parameter.startup_info() if not failures else None
    threads = []
    for job, role in zip(jobs[1:], roles[1:]):
        job.startup = startup
        t = threading.Thread(target=guarded, args=(job, _then_finished(job, role.run)),
                             name=f"hpcrl-{job.topo.role}-{job.rank}", daemon=True)
        threads.append(t)
    collector.resume()  # every role is built (runtime/collector.py)
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
        if isinstance(exc, RankSilent):  # the watchdog's line names the silent role; no traceback of its own
            raise RoleFailed(str(exc), "")
        if isinstance(exc, RecordWriteError):  # a full disk: its one line says so, the traceback adds nothing
            raise RoleFailed(f"rank {job.rank} ({job.topo.role}) failed: {exc}", "")
        raise RoleFailed(f"rank {job.rank} ({job.topo.role}) failed: {type(exc).__name__}: {exc}", details)
