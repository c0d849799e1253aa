"""What a role loop is given (:class:`Job`), and the parts both runners build the same way.

A role (parameter, learner group, actor) receives one :class:`Job`: its config, its place in
the rank map, the algorithm object and model, the run directory, and the job's shared objects.
The shared objects are the MPI windows and channels under ``launch.runner: mpi``
(:mod:`hpcrl.runtime.runners.mpi`) and their in-memory twins under ``serial``
(:mod:`hpcrl.runtime.runners.serial`); the role loops use only the methods the two have in common.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
import torch
from torch import nn

from hpcrl.algos import make_algorithm
from hpcrl.algos.base import Algorithm
from hpcrl.config import RunConfig
from hpcrl.io import TrajLayout
from hpcrl.runtime.roles.aaps import Probe
from hpcrl.runtime.plan import Plan
from hpcrl.runtime.record.progress import ProgressEmitter
from hpcrl.runtime.transport.joining import Joiner
from hpcrl.runtime.transport.protocols import Board, Counters, Fragments, GroupReduce, Mailbox, Reports
from hpcrl.runtime.roles.sampler import EnvInfo
from hpcrl.runtime.topology import Topology


@dataclass
class Job:
    """One role's view of the run."""

    cfg: RunConfig
    plan: Plan
    """What the loops read instead of the config tree (hpcrl.runtime.plan)."""
    topo: Topology
    run_dir: Path
    resume: bool
    runner: str
    """'mpi' or 'serial' (recorded in run.h5; nothing else depends on it)."""
    algo: Algorithm
    model: nn.Module
    env: EnvInfo
    traj_layout: TrajLayout
    counters: Counters
    """CounterWindow or LocalCounters (words in hpcrl.runtime.transport.control)."""
    mailbox: Mailbox
    """GradientMailbox or LocalMailbox."""
    board: Board
    """WeightBoard or LocalBoard."""
    reports: Reports
    """MpiReports or LocalReports."""
    fragments: Fragments
    """MpiFragments or LocalFragments."""
    group_reduce: GroupReduce | None = None
    """A learner rank's group: MpiGroupReduce or LocalGroupReduce (None on the parameter rank and actors)."""
    probe: Probe | None = None
    """AAPS probe when actors.weight_sync is aaps."""
    joiner: Joiner | None = None
    """An actor whose sampling joins the job while it is active (actors.elastic steps / jobs, MPI runner)."""
    progress: ProgressEmitter | None = None
    """On the parameter role, None elsewhere."""
    rolled_back: dict | None = None
    """--resume: what was cut from the record back to the checkpoint (rows per table, steps per actor)."""
    startup: dict = field(default_factory=dict)

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
        return self.places_per_batch(self.cfg.actors.count)

    def places_per_batch(self, active_actors: int) -> int:
        """Fragments in a group's batch while ``active_actors`` of the actor ranks sample."""
        steps = self.plan.group_batch_size_for(active_actors)
        return max(-(-steps // (self.cfg.actors.fragment_length * self.env.num_envs)), 1)


def roll_back_record(run_dir: Path) -> dict | None:
    """--resume: cut run.h5 and every trajectory file back to the row counts the checkpoint recorded,
    so no row of the redone work appears twice (one rule for every table and file); what was cut."""
    from hpcrl.io.rollback import truncate_record
    from hpcrl.runtime.record.checkpoint import load_checkpoint

    from hpcrl.io.rollback import trajectory_files

    state = load_checkpoint(run_dir)
    if not state or "record" not in state:
        return None
    # a file the checkpoint does not know was started after it (a resume with more actors): cut to 0
    steps = {**{a: 0 for a in trajectory_files(run_dir)}, **state["record"]["traj_steps"]}
    return truncate_record(run_dir, state["record"]["tables"], steps)


def role_device(learners_cfg, topo: Topology) -> torch.device:
    """Learner ranks use the GPU of their index among their node's learners (when asked or available); others the CPU."""
    if topo.role != "learner":
        return torch.device("cpu")
    return learner_device(learners_cfg, topo.device_index)


def learner_device(learners_cfg, index: int) -> torch.device:
    """A learner's device: the GPU ``index`` (modulo the node's count) when asked or available, else the CPU."""
    if learners_cfg.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if learners_cfg.device == "cuda":
            raise RuntimeError("learners.device=cuda but torch sees no CUDA device on this node")
        return torch.device("cpu")
    index = index % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def role_parts(cfg: RunConfig, env: EnvInfo, topo: Topology | None, device: torch.device | None = None
               ) -> tuple[Algorithm, nn.Module, TrajLayout]:
    """This role's algorithm object, model (same initial weights on every role) and trajectory layout; on
    ``device``, else the role's (``topo``)."""
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    torch.manual_seed(cfg.env.seed)
    model = algo.make_model(env.observation_space, env.action_space,
                            device=device if device is not None else role_device(cfg.learners, topo))
    traj = TrajLayout(obs_shape=tuple(env.observation_space.shape), action_shape=tuple(model.action_shape),
                      obs_dtype=env.obs_dtype.str.lstrip("<>=|"), action_dtype="i8" if model.discrete else "f4",
                      num_envs=env.num_envs)
    return algo, model, traj


def fragment_layout_for(cfg: RunConfig, env: EnvInfo, model: nn.Module):
    from hpcrl.runtime.transport.layout import fragment_layout

    return fragment_layout(env.num_envs, cfg.actors.fragment_length, tuple(env.observation_space.shape),
                           tuple(model.action_shape), model.discrete, obs_dtype=env.obs_dtype)
