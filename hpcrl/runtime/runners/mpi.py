"""Per-rank entry point: ``python -m hpcrl.runtime.runners.mpi RUN_DIR [--resume] [--progress MODE]``.

Every rank reads the resolved ``RUN_DIR/config.yaml`` (nothing else: no environment
variables, no argv below this file), splits COMM_WORLD into roles, creates the shared RMA
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
from typing import TYPE_CHECKING, Any, Callable

from hpcrl.runtime.runners import RunResult

if TYPE_CHECKING:  # runners.job imports torch: not before the signal handlers are in place
    from hpcrl.runtime.runners.job import Job

CONFIG_FILE = "config.yaml"


def main(argv: list[str] | None = None) -> int:
    """Run this rank: in a child of the prestart server when the launcher started one, else here."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from hpcrl.runtime.runners.prestart import hand_over

    code = hand_over(argv)
    return run_rank(argv) if code is None else code


def run_rank(argv: list[str]) -> int:
    """This process is the rank: read RUN_DIR/config.yaml and run the job."""
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
    from hpcrl.config import load_config

    run_dir = Path(args.run_dir).resolve()
    cfg = load_config(run_dir / CONFIG_FILE)
    if args.fit_actors:
        cfg = fit_actors(cfg, run_dir)
    return run_job(cfg, run_dir, resume=args.resume, progress=args.progress).exit_code


def fit_actors(cfg, run_dir: Path):
    """The config with ``actors.count`` fitted to this job's size (every rank computes the same); rank 0 says so
    in one line and rewrites RUN_DIR/config.yaml (atomically: a rank still reading it sees the old or the new)."""
    from mpi4py import MPI

    from hpcrl.config import load_config

    comm = MPI.COMM_WORLD
    try:
        actors = cfg.actors_for(comm.Get_size(), "--fit-actors: this job's size,")
    except ValueError:
        _abort(comm, f"rank {comm.Get_rank()} (fitting the actors to the job)")
    if actors == cfg.actors.count:
        return cfg
    fitted = load_config(run_dir / CONFIG_FILE, [f"actors.count={actors}"])
    if comm.Get_rank() == 0:
        print(f"hpcrl: this job has {comm.Get_size()} ranks: actors.count {cfg.actors.count} -> {actors}", flush=True)
        tmp = run_dir / f".{CONFIG_FILE}.fit"
        tmp.write_text(fitted.to_yaml())
        os.replace(tmp, run_dir / CONFIG_FILE)
    return fitted


def start_inside_job(config_for: Callable[[int], Any], run_dir: Path | None, resume: bool,
                     make_run_dir: Callable[[Any], Path], progress: str = "plain") -> RunResult:
    """`hpcrl run --inside-mpi`: the config fitted to the job's size; rank 0 makes the run directory.

    ``config_for(size)`` raises ConfigError (the same on every rank) when the job is too small.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    cfg = config_for(comm.Get_size())
    lock = None
    if comm.Get_rank() == 0:
        try:
            if run_dir is None:
                run_dir = make_run_dir(cfg)
            from hpcrl.io.run_lock import RunLock

            lock = RunLock(run_dir).acquire()  # here no launcher holds it for this job
        except Exception:
            _abort(comm, "rank 0 (creating or locking the run directory)")
    run_dir = comm.bcast(str(run_dir) if run_dir is not None else None, root=0)
    try:
        return run_job(cfg, Path(run_dir), resume=resume, progress=progress)
    finally:
        if lock is not None:
            lock.release()


def run_job(cfg, run_dir: Path, resume: bool, progress: str = "plain") -> RunResult:
    """This rank's whole life in the job (collective over COMM_WORLD). On the parameter rank the result holds
    the summary (its exit code EXIT_STOPPED when a signal stopped the run); on the others it is empty (exit 0)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    role, who = None, f"rank {comm.Get_rank()}"
    try:
        import torch

        torch.set_num_threads(1)
        job = _setup(cfg, comm, run_dir, resume, progress)
        who = f"rank {job.rank} ({job.topo.role} on {job.topo.node_name})"
        if job.topo.role != "parameter":
            # the launcher forwards SIGTERM/SIGUSR1 to every rank; only the parameter rank acts
            # on them (checkpoint, then STOP for everyone)
            for s in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(s, signal.SIG_IGN)
        if job.topo.role == "actor" and cfg.launch.actor_nice:
            os.nice(cfg.launch.actor_nice)  # on an oversubscribed node the gradient path gets the cores first
        role = make_role(job)
        if job.topo.role == "parameter":
            role.publish_initial()
            job.startup = role.startup_info()
        job.startup = _polling_bcast(job.topo.comm, job.startup)
        role.run()
        _teardown(job)
    except BaseException:  # noqa: BLE001 - any failure must end the whole job
        if role is not None:
            role.close_on_error()
        _abort(comm, who)
    return RunResult.ended("mpi", run_dir, role.summary if job.topo.role == "parameter" else {})


def _setup(cfg, comm, run_dir: Path, resume: bool, progress: str) -> Job:
    """This rank's Job over MPI: rank map, env spaces (from rank 0), model, windows (collective)."""
    from hpcrl.runtime.transport import control
    from hpcrl.runtime.runners.job import Job, fragment_layout_for, role_parts, roll_back_record
    from hpcrl.runtime.plan import make_plan
    from hpcrl.runtime.record.progress import ProgressEmitter
    from hpcrl.runtime.roles.sampler import describe_env
    from hpcrl.runtime.topology import Topology
    from hpcrl.runtime.transport.links import MpiFragments, MpiReports
    from hpcrl.runtime.transport.windows import CounterWindow, GradientMailbox

    topo = Topology.from_config(comm, cfg.learners, cfg.actors.count, cfg.launch.placement)
    comm = topo.comm  # the ranks in role order (launch.placement): everything below runs on it
    # rank 0 cuts the record back to the checkpoint before any rank opens a file (actors wait in the bcast)
    rolled_back = roll_back_record(run_dir) if resume and topo.rank == 0 else None
    env = _polling_bcast(comm, describe_env(cfg.env) if topo.rank == 0 else None)
    algo, model, traj_layout = role_parts(cfg, env, topo)
    probe = None
    if cfg.actors.weight_sync == "aaps":
        from hpcrl.runtime.roles.aaps import Probe, probe_states

        states = probe_states(cfg.env, cfg.actors.probe_batch) if topo.rank == 0 else None
        probe = Probe(_polling_bcast(comm, states), model, cfg.actors.aaps_delta)
    P, G = model.flat.num_params, cfg.learners.groups
    layout = fragment_layout_for(cfg, env, model)
    counters = CounterWindow(comm, 0, control.num_counters(G, topo.size), initial=0)
    reports = MpiReports(comm)
    return Job(
        cfg=cfg, plan=make_plan(cfg), topo=topo, run_dir=run_dir, resume=resume, runner="mpi", algo=algo, model=model, env=env,
        traj_layout=traj_layout, probe=probe, rolled_back=rolled_back,
        counters=counters,
        mailbox=GradientMailbox(comm, 0, G, cfg.aggregation.mailbox_slots, P, stats_capacity=len(control.GRAD_STATS)),
        board=_weight_board(cfg, comm, topo, P, 0 if probe is None else probe.size),
        reports=reports,
        fragments=MpiFragments(comm, layout, cfg.actors.max_in_flight, topo.learner_roots, topo.actor_ranks),
        # a learner group's collectives (NCCL or Horovod set-up) run after the windows', as the role's did
        group_reduce=_group_reduce(cfg, topo, run_dir, model.device, counters, reports),
        joiner=_actor_joiner(cfg, topo, run_dir),
        progress=ProgressEmitter(progress, cfg.io.log_seconds) if topo.role == "parameter" else None,
    )


def _group_reduce(cfg, topo, run_dir: Path, device, counters, reports):
    """A learner rank's group: over its communicator, or (learners.elastic steps / jobs) the root with ranks that
    join."""
    if topo.role != "learner":
        return None
    if cfg.learners.elastic != "park":
        from hpcrl.runtime.transport.joining import JoiningGroupReduce

        return JoiningGroupReduce(run_dir, topo.group, cfg.learners, cfg.launch, topo.nodes, counters, reports)
    from hpcrl.runtime.transport.group_reduce import MpiGroupReduce

    return MpiGroupReduce(topo.group_comm, cfg.learners.allreduce, device)


def _actor_joiner(cfg, topo, run_dir: Path):
    """An actor's Joiner when its sampling joins the job (actors.elastic steps / jobs), else None. Its node slot
    comes after the joining learner groups' (hpcrl submit asks for one node per group that can be active, then one
    per actor)."""
    if topo.role != "actor" or cfg.actors.elastic == "park":
        return None
    from hpcrl.runtime.transport.joining import Joiner

    slot = (cfg.learners.active_range[1] if cfg.learners.elastic == "steps" else 0) + topo.actor_index
    return Joiner(run_dir, f"actor-{topo.actor_index}", slot, cfg.actors.elastic, 1, cfg.actors.join_timeout_seconds,
                  cfg.launch, topo.nodes, "actors.elastic")


def _weight_board(cfg, comm, topo, num_params: int, probe_size: int):
    """The weight board (collective); an actor's is its node's cache of it (one fetch from rank 0 per node and
    version) when ``launch.node_weight_cache`` (auto: a node holds several actors) says so."""
    from hpcrl.runtime.transport import node_cache
    from hpcrl.runtime.transport.windows import WeightBoard

    board = WeightBoard(comm, 0, num_params, history=max(2, cfg.aggregation.weight_history), probe_size=probe_size,
                        reader="learner" if topo.role == "learner" else "actor")
    if not node_cache.wanted(cfg.launch.node_weight_cache, [topo.nodes[r] for r in topo.actor_ranks]):
        return board
    return node_cache.for_actors(board, comm, topo.role == "actor")


def make_role(job: Job):
    """The role object of ``job.topo.role`` (both runners)."""
    role = job.topo.role
    if role == "parameter":
        from hpcrl.runtime.roles.parameter import ParameterRank

        return ParameterRank(job)
    if role == "learner":
        from hpcrl.runtime.roles.learner import LearnerGroup

        return LearnerGroup(job)
    from hpcrl.runtime.roles.actor import Actor

    return Actor(job)


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


def _abort(comm, who: str) -> None:
    """Print this rank's failure (one line naming rank, role and host, then the traceback) and end the job."""
    rank = comm.Get_rank()
    lines = traceback.format_exc().rstrip().splitlines()
    text = "\n".join(f"[rank {rank}] {line}" for line in lines)
    sys.stderr.write(f"[rank {rank}] hpcrl: {who} failed: {lines[-1] if lines else '?'}; aborting the job\n{text}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(0.2)  # let the launcher forward the message before the job is torn down
    comm.Abort(1)


if __name__ == "__main__":
    sys.exit(main())
