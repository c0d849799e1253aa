"""Per-rank entry point: ``python -m hpcrl.runtime.main RUN_DIR [--resume] [--progress MODE]``.

Every rank reads the resolved ``RUN_DIR/config.yaml`` (nothing else: no environment
variables, no argv below this file), splits COMM_WORLD into roles, creates the shared RMA
windows (collective, same order everywhere), runs its role loop and takes part in the
shutdown. An exception on any rank prints its traceback with the rank, flushes that rank's
HDF5 file and calls ``MPI_Abort`` so the whole job ends within seconds instead of hanging.
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

CONFIG_FILE = "config.yaml"


@dataclass
class Job:
    """What a role loop needs: its config, its place, the shared windows, and where to write."""

    cfg: Any
    comm: Any
    topo: Any
    run_dir: Path
    resume: bool
    progress: Any
    obs_space: Any = None
    action_space: Any = None
    traj_layout: Any = None
    mailbox: Any = None
    board: Any = None
    counters: Any = None
    startup: dict = field(default_factory=dict)
    probe: Any = None
    model: Any = None
    layout: Any = None

    @property
    def rank(self) -> int:
        return self.topo.rank

    @property
    def probe_size(self) -> int:
        return 0 if self.probe is None else self.probe.size

    def probe_outputs(self, model):
        return self.probe.outputs(model)

    def probe_drifted(self, model) -> bool:
        return self.probe.drifted(model, self.board)

    @property
    def max_backlog(self) -> int:
        """Fragments a group may hold before actors wait: one batch's worth (one batch queued while one trains)."""
        per_batch = -(-self.cfg.group_batch_size // self.cfg.fragment_steps)
        return max(per_batch, 1)

    def make_sender(self):
        from hpcrl.runtime.transport import ActorLink

        return ActorLink(self.comm, self.layout, self.cfg.actors.max_in_flight, self.topo.learner_roots)

    def make_receiver(self):
        from hpcrl.runtime.transport import LearnerLink

        return LearnerLink(self.comm, self.layout, self.topo.actor_ranks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcrl.runtime.main", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--progress", choices=("pipe", "plain", "tty"), default="plain")
    args = parser.parse_args(argv)
    from hpcrl.config import load_config

    run_dir = Path(args.run_dir).resolve()
    cfg = load_config(run_dir / CONFIG_FILE)
    return run_job(cfg, run_dir, resume=args.resume, progress=args.progress)


def start_inside_job(config_for: Callable[[int], Any], run_dir: Path | None, resume: bool,
                     make_run_dir: Callable[[Any], Path], progress: str = "plain") -> int:
    """`hpcrl run --inside-mpi`: the config fitted to the job's size; rank 0 makes the run directory.

    ``config_for(size)`` raises ConfigError (the same on every rank) when the job is too small.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    cfg = config_for(comm.Get_size())
    if comm.Get_rank() == 0 and run_dir is None:
        try:
            run_dir = make_run_dir(cfg)
        except Exception:
            _abort(comm, "creating the run directory")
    run_dir = comm.bcast(str(run_dir) if run_dir is not None else None, root=0)
    return run_job(cfg, Path(run_dir), resume=resume, progress=progress)


def run_job(cfg, run_dir: Path, resume: bool, progress: str = "plain") -> int:
    """This rank's whole life in the job (collective over COMM_WORLD)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    role = None
    try:
        import torch

        torch.set_num_threads(1)
        job = _setup(cfg, comm, run_dir, resume, progress)
        if job.topo.role != "parameter":
            # the launcher forwards SIGTERM/SIGUSR1 to every rank; only the parameter rank acts
            # on them (checkpoint, then STOP for everyone)
            for s in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(s, signal.SIG_IGN)
        role = _make_role(job)
        if job.topo.role == "parameter":
            role.publish_initial()
            job.startup = role.startup_info()
        job.startup = _polling_bcast(comm, job.startup)
        role.run()
        _teardown(job)
    except BaseException:  # noqa: BLE001 - any failure must end the whole job
        if role is not None:
            role.close_on_error()
        _abort(comm, "")
    return 0


def _setup(cfg, comm, run_dir: Path, resume: bool, progress: str) -> Job:
    from hpcrl.io import TrajLayout
    from hpcrl.models import ActorCritic
    from hpcrl.runtime import control
    from hpcrl.runtime.progress import ProgressEmitter
    from hpcrl.runtime.topology import Topology
    from hpcrl.runtime.windows import CounterWindow, GradientMailbox, WeightBoard

    import torch

    topo = Topology.from_config(comm, cfg.learners, cfg.actors.count)
    emitter = ProgressEmitter(progress, cfg.io.log_seconds) if topo.role == "parameter" else None
    job = Job(cfg=cfg, comm=comm, topo=topo, run_dir=run_dir, resume=resume, progress=emitter)
    spaces = None
    if topo.rank == 0:
        from hpcrl.envs import make

        env = make(cfg.env.id, **cfg.env.kwargs)
        spaces = (env.observation_space, env.action_space)
        env.close()
    job.obs_space, job.action_space = _polling_bcast(comm, spaces)
    torch.manual_seed(cfg.env.seed)
    model = ActorCritic(job.obs_space, job.action_space, cfg.model, device=_device(cfg.learners, topo))
    discrete = model.discrete
    job.traj_layout = TrajLayout(obs_shape=tuple(job.obs_space.shape), action_shape=tuple(model.action_shape),
                                 obs_dtype="f4", action_dtype="i8" if discrete else "f4", num_envs=cfg.env.num_envs)
    from hpcrl.runtime.transport import fragment_layout

    job.layout = fragment_layout(cfg, tuple(job.obs_space.shape), tuple(model.action_shape), discrete)
    if cfg.actors.weight_sync == "aaps":
        from hpcrl.runtime.aaps import Probe, probe_states

        states = probe_states(cfg.env, cfg.actors.probe_batch) if topo.rank == 0 else None
        job.probe = Probe(_polling_bcast(comm, states), model, cfg.actors.aaps_delta)
    P = model.flat.num_params
    G = cfg.learners.groups
    job.mailbox = GradientMailbox(comm, 0, G, cfg.aggregation.mailbox_slots, P, stats_capacity=len(control.GRAD_STATS))
    job.board = WeightBoard(comm, 0, P, history=max(2, cfg.aggregation.weight_history), probe_size=job.probe_size)
    job.counters = CounterWindow(comm, 0, control.num_counters(G), initial=0)
    job.model = model
    return job


def _device(learners_cfg, topo):
    """Learner ranks use the GPU given by their node-local rank (when asked or available); others the CPU."""
    import torch

    if topo.role != "learner" or learners_cfg.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if learners_cfg.device == "cuda":
            raise RuntimeError("learners.device=cuda but torch sees no CUDA device on this node")
        return torch.device("cpu")
    index = topo.node_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _make_role(job: Job):
    role = job.topo.role
    if role == "parameter":
        from hpcrl.runtime.parameter import ParameterRank

        return ParameterRank(job, job.model)
    if role == "learner":
        from hpcrl.runtime.learner import LearnerGroup

        return LearnerGroup(job, job.model)
    from hpcrl.runtime.actor import Actor

    return Actor(job, job.model)


def _polling_bcast(comm, value):
    """bcast from rank 0 after a sleeping barrier (MPICH's blocking collectives spin)."""
    from hpcrl.runtime.control import wait_request

    wait_request(comm.Ibarrier())
    return comm.bcast(value, root=0)


def _teardown(job: Job) -> None:
    from hpcrl.runtime.control import wait_request

    wait_request(job.comm.Ibarrier())
    for win in (job.mailbox, job.board, job.counters):
        win.free()
    job.topo.free()


def _abort(comm, what: str) -> None:
    rank = comm.Get_rank()
    lines = traceback.format_exc().rstrip().splitlines()
    text = "\n".join(f"[rank {rank}] {line}" for line in lines)
    sys.stderr.write(f"[rank {rank}] hpcrl: failed{' ' + what if what else ''}; aborting the job\n{text}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(0.2)  # let the launcher forward the message before the job is torn down
    comm.Abort(1)


if __name__ == "__main__":
    sys.exit(main())
