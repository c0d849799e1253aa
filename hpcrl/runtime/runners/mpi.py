"""Per-rank entry point: ``python -m hpcrl.runtime.runners.mpi RUN_DIR [--resume] [--progress MODE]``.

Rank 0 reads the resolved ``RUN_DIR/config.yaml`` (nothing else: no environment variables, no argv below
this file) and hands its Plan to every rank; each splits COMM_WORLD into roles, creates the shared RMA
windows (collective, same order everywhere), runs its role loop and takes part in the
shutdown. An exception on any rank prints its traceback with the rank, flushes that rank's
HDF5 file and calls ``MPI_Abort`` so the whole job ends within seconds instead of hanging.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from hpcrl.runtime import collector
from hpcrl.runtime.backoff import Backoff, window_owner_nap
from hpcrl.runtime.clock import WALL
from hpcrl.runtime.runners import RunResult

if TYPE_CHECKING:  # runners.job imports torch: not before the signal handlers are in place
    from hpcrl.runtime.plan import Plan
    from hpcrl.runtime.runners.job import Job

CONFIG_FILE = "config.yaml"


def main(argv: list[str] | None = None) -> int:
    """Run this rank: in a child of the prestart server when the launcher started one, else here."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from hpcrl.runtime.runners.prestart import hand_over

    code = hand_over(argv)
    return run_rank(argv) if code is None else code


def run_rank(argv: list[str]) -> int:
    """This process is the rank: rank 0 reads RUN_DIR/config.yaml and makes the job's Plan, every rank runs it."""
    from hpcrl.runtime.signals import remember_stop_signals

    remember_stop_signals()  # a cancel or walltime warning during start-up is acted on, not fatal
    parser = argparse.ArgumentParser(prog="python -m hpcrl.runtime.runners.mpi", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--progress", choices=("pipe", "plain", "tty"), default="plain")
    parser.add_argument("--fit-actors", action="store_true",
                        help="the ranks beyond the parameter and learner ranks are the actors (a batch job whose "
                             "node count varies between restarts: hpcrl submit --min-nodes)")
    args = parser.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    run_dir = Path(args.run_dir).resolve()
    plan = None
    if comm.Get_rank() == 0:
        try:
            plan = job_plan(run_dir, comm.Get_size() if args.fit_actors else None)
        except Exception:  # noqa: BLE001 - the other ranks wait in the bcast: end the job
            _abort(comm, "rank 0 (reading the run's config)")
    return run_job(_polling_bcast(comm, plan), run_dir, resume=args.resume, progress=args.progress).exit_code


def job_plan(run_dir: Path, fit_to: int | None = None) -> Plan:
    """The Plan of RUN_DIR/config.yaml (made once per job, on rank 0); ``fit_to``: with ``actors.count`` fitted to a
    job of this many ranks, said in one line and written back to config.yaml (atomically: a reader sees the old or
    the new)."""
    from hpcrl.config import load_config
    from hpcrl.runtime.plan import make_plan

    cfg = load_config(run_dir / CONFIG_FILE)
    if fit_to is not None and (actors := cfg.actors_for(fit_to, "--fit-actors: this job's size,")) != cfg.actors.count:
        print(f"hpcrl: this job has {fit_to} ranks: actors.count {cfg.actors.count} -> {actors}", flush=True)
        cfg = load_config(run_dir / CONFIG_FILE, [f"actors.count={actors}"])
        tmp = run_dir / f".{CONFIG_FILE}.fit"
        tmp.write_text(cfg.to_yaml())
        os.replace(tmp, run_dir / CONFIG_FILE)
    return make_plan(cfg)


def start_inside_job(plan_for: Callable[[int], Plan], run_dir: Path | None, resume: bool,
                     make_run_dir: Callable[[], Path], progress: str = "plain") -> RunResult:
    """`hpcrl run --inside-mpi`: rank 0 makes the Plan fitted to the job's size and the run directory, and hands
    both to every rank.

    ``plan_for(size)`` raises ConfigError when the job is too small; ``make_run_dir()`` makes the directory of that
    plan's config.
    """
    from mpi4py import MPI

    from hpcrl.errors import ConfigError

    comm = MPI.COMM_WORLD
    lock = plan = mistake = None
    if comm.Get_rank() == 0:
        try:
            plan = plan_for(comm.Get_size())
            if run_dir is None:
                run_dir = make_run_dir()
            from hpcrl.io.run_lock import RunLock

            lock = RunLock(run_dir).acquire()  # here no launcher holds it for this job
        except ConfigError as exc:  # the user's mistake: one line and exit 2 on every rank, no abort
            mistake = str(exc)
        except Exception:
            _abort(comm, "rank 0 (resolving the config, creating or locking the run directory)")
    plan, run_dir, mistake = _polling_bcast(comm, (plan, str(run_dir) if run_dir is not None else None, mistake))
    if mistake is not None:
        raise ConfigError(mistake)
    try:
        return run_job(plan, Path(run_dir), resume=resume, progress=progress)
    finally:
        if lock is not None:
            lock.release()


def run_job(plan: Plan, run_dir: Path, resume: bool, progress: str = "plain") -> RunResult:
    """This rank's whole life in the job (collective over COMM_WORLD). On the parameter rank the result holds
    the summary (its exit code EXIT_STOPPED when a signal stopped the run); on the others it is empty (exit 0)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    role, who = None, f"rank {comm.Get_rank()}"
    try:
        from hpcrl.runtime.runners.job import make_role
        from hpcrl.runtime.runners.threads import one_compute_thread
        from hpcrl.runtime.transport import control

        one_compute_thread()
        job = _setup(plan, comm, run_dir, resume, progress)
        who = f"rank {job.rank} ({job.topo.role} on {job.topo.node_name})"
        if job.topo.role != "parameter":
            # the launcher forwards SIGTERM/SIGUSR1 to every rank; only the parameter rank acts
            # on them (checkpoint, then STOP for everyone)
            for s in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(s, signal.SIG_IGN)
        if job.topo.role == "actor" and plan.sections.launch.actor_nice:
            os.nice(plan.sections.launch.actor_nice)  # on an oversubscribed node the gradient path gets the cores first
        role = make_role(job)
        if job.topo.role in ("parameter", "shard"):  # every shard's first version before any rank reads one
            role.publish_initial()
        if job.topo.role == "parameter":
            job.startup = role.startup_info()
        job.startup = _polling_bcast(job.topo.comm, job.startup)
        collector.resume()  # this rank's role is built (runtime/collector.py)
        role.run()
        if job.topo.role != "parameter":
            control.mark_finished(job.counters, plan.groups, job.rank)
        _teardown(job)
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        if role is not None:
            role.close_on_error()
        _abort(comm, who, brief=_is_watchdog_end(exc), one_line=_is_record_file_error(exc))
    return RunResult.ended("mpi", run_dir, role.summary if job.topo.role == "parameter" else {})


def _setup(plan: Plan, comm, run_dir: Path, resume: bool, progress: str) -> Job:
    """This rank's Job over MPI: rank map, env spaces and AAPS probe states (from rank 0), the windows (collective)."""
    from hpcrl.runtime.runners.job import build_job, roll_back_record
    from hpcrl.runtime.roles.sampler import describe_env
    from hpcrl.runtime.topology import Topology

    s = plan.sections
    topo = Topology.from_config(comm, s.learners, plan.actors, s.launch.placement, plan.shards)
    comm = topo.comm  # the ranks in role order (launch.placement): everything below runs on it
    # rank 0 cuts the record back to the checkpoint before any rank opens a file (actors wait in the bcast)
    rolled_back = roll_back_record(run_dir) if resume and topo.rank == 0 else None
    env = _polling_bcast(comm, describe_env(s.env) if topo.rank == 0 else None)
    states = None
    if s.actors.weight_sync == "aaps":
        from hpcrl.runtime.roles.aaps import probe_states

        states = _polling_bcast(comm, probe_states(s.env, s.actors.probe_batch) if topo.rank == 0 else None)
    return build_job(plan, topo, run_dir, resume, "mpi", env, MpiWiring(plan, comm, run_dir), progress,
                     rolled_back, states)


class MpiWiring:
    """The MPI runner's shared objects (runners/job.py ``Wiring``): windows owned by rank 0 (collective, asked in
    the same order on every rank), point-to-point links, a learner group's communicator or joining ranks."""

    def __init__(self, plan: Plan, comm, run_dir: Path) -> None:
        self.plan, self.comm, self.run_dir = plan, comm, run_dir
        self.bounds: list[int] | None = None  # the shards' floats (aggregation.shards > 1)
        self._counters = None  # the counter window, asked first (an actor's node cache beats its heartbeat word)

    def split_weights(self, bounds: list[int]) -> None:
        """The floats of each parameter shard: its windows hold those (ranks 0 .. S-1 own them)."""
        self.bounds = list(bounds)

    def counters(self, words: int):
        from hpcrl.runtime.transport.windows import CounterWindow

        self._counters = CounterWindow(self.comm, 0, words, initial=0)
        return self._counters

    def mailbox(self, groups: int, slots: int, num_params: int, stats: int):
        """Rank 0's mailbox; with parameter shards, one per shard over its floats (collective, shard by shard)."""
        from hpcrl.runtime.transport.windows import GradientMailbox

        if self.plan.shards == 1:
            return GradientMailbox(self.comm, 0, groups, slots, num_params, stats_capacity=stats)
        from hpcrl.runtime.transport.sharded import ShardedMailbox

        b, owners = self.bounds, self._shard_ranks()
        parts = [GradientMailbox(self.comm, owner, groups, slots, b[s + 1] - b[s], stats_capacity=stats)
                 for s, owner in enumerate(owners)]
        return ShardedMailbox(parts, b, self._my_shard(owners))

    def _shard_ranks(self) -> list[int]:
        return list(range(self.plan.shards))  # ranks 0 .. S-1 (runtime/topology.py)

    def _my_shard(self, owners: list[int]) -> int:
        rank = self.comm.Get_rank()
        return owners.index(rank) if rank in owners else -1

    def shard_link(self, topo):
        from hpcrl.runtime.transport.shard_link import MpiShardLink

        return MpiShardLink(self.comm, topo.shard_ranks)

    def board(self, num_params: int, history: int, probe_size: int, topo):
        """The weight board (collective); an actor's is its node's cache of it (one fetch from rank 0 per node and
        version) when ``launch.node_weight_cache`` (auto: a node holds several actors) says so, fetched through the
        tree of ``launch.weight_tree`` when it is on."""
        from hpcrl.runtime.placement import node_weight_caches
        from hpcrl.runtime.transport import node_cache
        from hpcrl.runtime.transport.windows import WeightBoard

        reader = "learner" if topo.role == "learner" else "actor"
        if self.plan.shards == 1:
            board = WeightBoard(self.comm, 0, num_params, history=history, probe_size=probe_size, reader=reader)
        else:
            from hpcrl.runtime.transport.sharded import ShardedBoard

            b, owners = self.bounds, topo.shard_ranks
            board = ShardedBoard([WeightBoard(self.comm, owner, b[s + 1] - b[s], history=history, reader=reader)
                                  for s, owner in enumerate(owners)], b, self._my_shard(owners))
        launch = self.plan.sections.launch
        actor_nodes = [topo.nodes[r] for r in topo.actor_ranks]
        if not node_weight_caches(launch.node_weight_cache, actor_nodes, launch.weight_tree):
            return board
        from hpcrl.runtime.transport.control import Heartbeat

        beat = Heartbeat(self._counters, self.plan.groups, topo.rank).beat  # the actor's word, while it waits
        return node_cache.for_actors(board, self.comm, topo.role == "actor", beat, launch.weight_tree)

    def reports(self, topo, run_dir, counters):
        """Reports to rank 0 (collective): an actor's go through its node's relay when ``actors.reports`` is node
        or summary (then the relay writes the node's rows to its own file: runtime/record/node_rows.py)."""
        from hpcrl.runtime.record.node_rows import NodeRows
        from hpcrl.runtime.transport import control, node_reports
        from hpcrl.runtime.transport.report_packing import summary_interval

        beat = control.Heartbeat(self._counters, self.plan.groups, topo.rank).beat  # an actor's word, while it waits
        s = self.plan.sections
        return node_reports.for_rank(
            s.actors.reports, self.comm, topo.role == "actor", beat,
            summary=lambda relay, relays: NodeRows(run_dir, relay, s.io.compression,
                                                   lambda: counters.read(control.ENV_STEPS), WALL,
                                                   summary_interval(relays)))

    def fragments(self, layout, max_in_flight: int, topo):
        from hpcrl.runtime.transport.links import MpiFragments

        return MpiFragments(self.comm, layout, max_in_flight, topo.learner_roots, topo.actor_ranks)

    def group_reduce(self, topo, device, counters, reports):
        """A learner rank's group: over its communicator, or (learners.elastic steps / jobs) the root with ranks
        that join."""
        learners = self.plan.sections.learners
        if learners.elastic != "park":
            from hpcrl.join_launch import group_joiner

            return group_joiner(self.run_dir, topo.group, learners, self.plan.sections.launch, topo.nodes, counters,
                                reports)
        from hpcrl.runtime.transport.group_reduce import MpiGroupReduce

        return MpiGroupReduce(topo.group_comm, learners.allreduce, device)

    def groups_allreduce(self, topo):
        from hpcrl.runtime.transport.groups_allreduce import MpiGroupsAllreduce

        return MpiGroupsAllreduce(topo.roots_comm)

    def node_gather(self, topo, meta_size: int, num_params: int):
        from hpcrl.runtime.transport.node_combine import MpiNodeGather

        return MpiNodeGather(topo.combine_comm, meta_size, num_params)

    def joiner(self, topo):
        """An actor's Joiner when its sampling joins the job (actors.elastic steps / jobs), else None."""
        s = self.plan.sections
        if s.actors.elastic == "park":
            return None
        from hpcrl.join_launch import actor_joiner

        return actor_joiner(self.run_dir, topo.actor_index, s.learners, s.actors, s.launch, topo.nodes)

    def clock(self, topo):
        return WALL

    def parameter_nap(self, topo):
        return window_owner_nap(WALL)

    def learner_nap(self, topo):
        return Backoff(5e-5, 2e-3, WALL)  # fragments arrive by polling their receives

    def actor_nap(self, topo):
        return lambda: Backoff(5e-5, 5e-3, WALL)  # the counters are read by RMA

    def learner_cpu_time(self, topo):
        return None  # a rank's own process: its busy time is wall time less its waits

    def between_steps(self, topo):
        return None  # a rank has its own interpreter


def _polling_bcast(comm, value):
    """bcast from rank 0 after a sleeping barrier (MPICH's blocking collectives spin)."""
    from hpcrl.runtime.transport.control import wait_request

    wait_request(comm.Ibarrier())
    return comm.bcast(value, root=0)


def _teardown(job: Job) -> None:
    from hpcrl.runtime.transport.control import wait_request

    wait_request(job.topo.comm.Ibarrier())
    for win in (job.mailbox, job.board, job.counters):
        win.free()
    job.topo.free()


def _is_watchdog_end(exc: BaseException) -> bool:
    from hpcrl.runtime.transport.control import RankSilent

    return isinstance(exc, RankSilent)


def _is_record_file_error(exc: BaseException) -> bool:
    """A record file that cannot be read, cut back or written (a full disk): its one line says it all."""
    from hpcrl.io.errors import RecordWriteError, RunFileError

    return isinstance(exc, (RunFileError, RecordWriteError))


def _abort(comm, who: str, brief: bool = False, one_line: bool = False) -> None:
    """Print this rank's failure (one line naming rank, role and host, then the traceback; ``brief``: the watchdog
    ended the job, and its one line names the silent rank; ``one_line``: a record file that cannot be read, cut
    back or written, whose one line says what is wrong and the way on) and end the job."""
    rank = comm.Get_rank()
    if brief:
        sys.stderr.write(f"[rank {rank}] hpcrl: {sys.exc_info()[1]}\n")
    elif one_line:
        sys.stderr.write(f"[rank {rank}] hpcrl: {who} failed: {sys.exc_info()[1]}; aborting the job\n")
    else:
        lines = traceback.format_exc().rstrip().splitlines()
        text = "\n".join(f"[rank {rank}] {line}" for line in lines)
        sys.stderr.write(f"[rank {rank}] hpcrl: {who} failed: {lines[-1] if lines else '?'}; aborting the job\n"
                         f"{text}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(0.2)  # let the launcher forward the message before the job is torn down
    comm.Abort(1)


if __name__ == "__main__":
    collector.pause()  # until the role is built
    sys.exit(main())
