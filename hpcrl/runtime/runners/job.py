"""What a role loop is given (:class:`Job`), built the same way by every runner (:func:`build_job`), and the role
object each rank runs (:func:`make_role`).

A role (parameter, learner group, actor) receives one :class:`Job`: the Plan, its place in the rank map, the
algorithm object and model, the run directory and the job's shared objects; and, from :func:`make_role`, only the
typed config sections it owns (``ParameterSettings``, ``LearnerSettings``, ``ActorSettings``, declared beside each
role). The shared objects come from the runner's :class:`Wiring`: the MPI windows and channels under ``launch.runner:
mpi`` (:mod:`hpcrl.runtime.runners.mpi`) and their in-memory twins under ``serial``
(:mod:`hpcrl.runtime.runners.serial`); the role loops use only the methods the two have in common
(``runtime/transport/protocols.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np
import torch
from torch import nn

from hpcrl.algos import make_algorithm
from hpcrl.algos.base import Algorithm
from hpcrl.io import TrajLayout
from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.clock import WALL, Clock
from hpcrl.runtime.messages import CombinedPush, Startup
from hpcrl.runtime.plan import Plan
from hpcrl.runtime import shards
from hpcrl.runtime.record.progress import ProgressEmitter
from hpcrl.runtime.roles.aaps import Probe
from hpcrl.runtime.roles.sampler import EnvInfo
from hpcrl.runtime.topology import Topology
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.layout import FragmentLayout, fragment_layout
from hpcrl.runtime.transport.node_combine import CombiningOutbox
from hpcrl.runtime.transport.protocols import (Board, Counters, Fragments, GroupReduce, GroupsAllreduce, Mailbox,
                                               NodeGather, Outbox, Reports)

if TYPE_CHECKING:
    from hpcrl.runtime.transport.protocols import Joiner


@dataclass
class Job:
    """One role's view of the run."""

    plan: Plan
    """What the loops read instead of the config tree (hpcrl.runtime.plan)."""
    topo: Topology
    run_dir: Path
    resume: bool
    runner: str
    """'mpi', 'serial' or 'sim' (recorded in run.h5; nothing else depends on it)."""
    algo: Algorithm
    model: nn.Module
    env: EnvInfo
    traj_layout: TrajLayout
    counters: Counters
    """CounterWindow or LocalCounters (words in hpcrl.runtime.transport.control)."""
    mailbox: Mailbox
    """GradientMailbox or LocalMailbox."""
    outbox: Outbox
    """Where a group root pushes: the mailbox, or with learners.combine=node its node's CombiningOutbox."""
    board: Board
    """WeightBoard or LocalBoard."""
    reports: Reports
    """MpiReports or LocalReports; an actor's under actors.reports=node: its node's ReportRelay or a ReportMember."""
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
    startup: Startup | None = None
    """What rank 0 told every rank at start (set by the runner before the role runs)."""
    clock: Clock = WALL
    """The role's time (runtime/clock.py): the wall clock, or its clock in the virtual-time world (launch.runner=sim)."""
    parameter_nap: Backoff | None = None
    """How the parameter role waits with nothing to do: the MPI runner's short back-off, or the serial runner's
    Doorbell (runtime/backoff.py); None on the other roles."""
    learner_nap: Backoff | None = None
    """How a learner group's root waits for a batch: the MPI runner's back-off (its fragments arrive by polling),
    or its group's Doorbell under the serial runner, rung by each fragment or batch sent to the group; None on the
    other roles."""
    actor_nap: Callable[[], Backoff] | None = None
    """A new nap for each wait of an actor (for room in a group's backlog, for new weights): the MPI runner's
    back-off, or under the serial runner a ChangeNap that ends when the shared state changes; None on the other
    roles."""
    between_steps: Callable[[], None] | None = None
    """What an actor's sampler calls after each env step: under the serial runner ``os.sched_yield()``, which hands
    the interpreter lock to a waiting role (the numpy policy call and the env step never release it, and a
    learner's torch ops, which do, would otherwise wait the 5 ms switch interval for it, op after op); None
    elsewhere."""
    learner_cpu_time: Callable[[], float] | None = None
    """A group root's CPU clock for its busy time (the elastic rule's capacity), where the roles share one
    interpreter: the serial runner's ``time.thread_time``, whose seconds leave out the waits for the interpreter
    lock that wall time would count; None elsewhere (busy time is the cycle's wall time less its waits)."""
    groups_allreduce: GroupsAllreduce | None = None
    """A group root's allreduce with the other groups' roots (learners.topology=allreduce; None otherwise)."""
    shard_link: object | None = None
    """Rank 0's decisions to the other parameter shards (transport/shard_link.py; aggregation.shards > 1 only)."""

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
        """Fragments a group may hold before actors wait: one batch's worth (one batch queued while one trains);
        on-policy with a preemption threshold, the places a round reserves (``places_reserved``)."""
        return self.places_reserved(self.plan.actors)

    def places_reserved(self, active_actors: int) -> int:
        """The places a group's backlog takes per batch: its fragments, over ``actors.sync_frac`` (on-policy)."""
        return math.ceil(round(self.places_per_batch(active_actors) / self.plan.sync_frac, 9))

    def places_per_batch(self, active_actors: int) -> int:
        """Fragments in a group's batch while ``active_actors`` of the actor ranks sample."""
        steps = self.plan.group_batch_size_for(active_actors)
        return max(-(-steps // (self.plan.fragment_length * self.env.num_envs)), 1)


class Wiring(Protocol):
    """A runner's shared objects for :func:`build_job`, asked in this order on every rank (the MPI runner's are
    collective: every rank asks for every object, the same order everywhere); the serial runner's make each once
    and hand every role the same. A job with parameter shards (``plan.shards`` > 1, the MPI runner only) first tells it
    ``split_weights(bounds)`` and asks ``shard_link(topo)`` after the others."""

    def counters(self, words: int) -> Counters: ...
    def mailbox(self, groups: int, slots: int, num_params: int, stats: int) -> Mailbox: ...
    def board(self, num_params: int, history: int, probe_size: int, topo: Topology) -> Board: ...
    def reports(self, topo: Topology, run_dir: Path, counters: Counters) -> Reports: ...
    def fragments(self, layout: FragmentLayout, max_in_flight: int, topo: Topology) -> Fragments: ...
    def group_reduce(self, topo: Topology, device: torch.device, counters: Counters, reports: Reports
                     ) -> GroupReduce | None: ...
    def groups_allreduce(self, topo: Topology) -> GroupsAllreduce: ...
    def node_gather(self, topo: Topology, meta_size: int, num_params: int) -> NodeGather: ...
    def joiner(self, topo: Topology) -> Joiner | None: ...
    def clock(self, topo: Topology) -> Clock: ...
    def parameter_nap(self, topo: Topology) -> Backoff: ...
    def learner_nap(self, topo: Topology) -> Backoff: ...
    def actor_nap(self, topo: Topology) -> Callable[[], Backoff]: ...
    def between_steps(self, topo: Topology) -> Callable[[], None] | None: ...
    def learner_cpu_time(self, topo: Topology) -> Callable[[], float] | None: ...


def build_job(plan: Plan, topo: Topology, run_dir: Path, resume: bool, runner: str, env: EnvInfo, wiring: Wiring,
              progress: str, rolled_back: dict | None = None, probe_states: np.ndarray | None = None) -> Job:
    """The Job of the rank ``topo`` places, every runner alike: its algorithm, model (the same initial weights on
    every rank) and trajectory layout, its AAPS probe (``probe_states``: made once per job, actors.weight_sync=aaps)
    and the runner's shared objects (``wiring``)."""
    s = plan.sections
    algo, model, traj_layout = role_parts(plan, env, role_device(s.learners, topo))
    probe = None if probe_states is None else Probe(probe_states, model, s.actors.aaps_delta)
    P, G = model.flat.num_params, plan.groups
    if plan.shards > 1:  # the MPI wiring's windows are made per shard, over these floats (runtime/shards.py)
        wiring.split_weights(shards.bounds(shards.param_sizes(model), plan.shards))
    counters = wiring.counters(control.num_counters(G, topo.size))
    stats = len(control.GRAD_STATS)
    mailbox = wiring.mailbox(G, s.aggregation.mailbox_slots, P,  # a node's push: its groups' headers as statistics
                             CombinedPush.capacity(topo.most_groups_on_a_node, stats) if plan.combine
                             else stats)
    board = wiring.board(P, max(2, s.aggregation.weight_history), 0 if probe is None else probe.size, topo)
    reports = wiring.reports(topo, run_dir, counters)
    fragments = wiring.fragments(fragment_layout_for(plan, env, model), s.actors.max_in_flight, topo)
    # a learner group's collectives (NCCL or Horovod set-up) run after the windows'
    group_reduce = wiring.group_reduce(topo, model.device, counters, reports) if topo.role == "learner" else None
    shard_link = wiring.shard_link(topo) if plan.shards > 1 else None
    groups_allreduce = wiring.groups_allreduce(topo) if plan.push == "allreduce" and topo.is_group_root else None
    outbox = mailbox
    if plan.combine and topo.is_group_root:
        gather = wiring.node_gather(topo, CombinedPush.ROW + stats, P)
        outbox = CombiningOutbox(mailbox, gather, G, stats, wiring.clock(topo))
    return Job(plan=plan, topo=topo, run_dir=run_dir, resume=resume, runner=runner, algo=algo, model=model, env=env,
               traj_layout=traj_layout, counters=counters, mailbox=mailbox, outbox=outbox, board=board, reports=reports,
               fragments=fragments, group_reduce=group_reduce, probe=probe, clock=wiring.clock(topo),
               joiner=wiring.joiner(topo) if topo.role == "actor" else None,
               progress=ProgressEmitter(progress, s.io.log_seconds) if topo.role == "parameter" else None,
               rolled_back=rolled_back, shard_link=shard_link, groups_allreduce=groups_allreduce,
               parameter_nap=wiring.parameter_nap(topo) if topo.role == "parameter" else None,
               learner_nap=wiring.learner_nap(topo) if topo.role == "learner" else None,
               actor_nap=wiring.actor_nap(topo) if topo.role == "actor" else None,
               between_steps=wiring.between_steps(topo) if topo.role == "actor" else None,
               learner_cpu_time=wiring.learner_cpu_time(topo) if topo.role == "learner" else None)


def build_jobs(plan: Plan, topos: list[Topology], env: EnvInfo, run_dir: Path, resume: bool, runner: str,
               wiring: Wiring, progress: str) -> list[Job]:
    """The Job of every rank ``topos`` places, in this one process (the serial and sim runners): the record cut
    back to its checkpoint first (``resume``), one set of AAPS probe states, the wiring's shared objects."""
    s = plan.sections
    rolled_back = roll_back_record(run_dir) if resume else None  # before any role opens a file
    states = None
    if s.actors.weight_sync == "aaps":  # one set of states; each role's probe evaluates its own model
        from hpcrl.runtime.roles.aaps import probe_states

        states = probe_states(s.env, s.actors.probe_batch)
    return [build_job(plan, topo, run_dir, resume, runner, env, wiring, progress, rolled_back, states)
            for topo in topos]


def make_role(job: Job):
    """The role object of ``job.topo.role`` (every runner), given the config sections it owns and no others."""
    s = job.plan.sections
    role = job.topo.role
    if role == "parameter":
        from hpcrl.runtime.roles.parameter import ParameterRank, ParameterSettings

        return ParameterRank(job, ParameterSettings(aggregation=s.aggregation, learners=s.learners, stop=s.stop,
                                                    io=s.io, eval=s.eval, launch=s.launch, debug=s.debug,
                                                    config_yaml=s.yaml, name=s.name))
    if role == "learner":
        from hpcrl.runtime.roles.learner import LearnerGroup, LearnerSettings

        return LearnerGroup(job, LearnerSettings(learners=s.learners, debug=s.debug))
    if role == "shard":
        from hpcrl.runtime.roles.shard import ShardRank, ShardSettings

        return ShardRank(job, ShardSettings(aggregation=s.aggregation, debug=s.debug))
    from hpcrl.runtime.roles.actor import Actor

    return Actor(job, actor_settings(job.plan))


def actor_settings(plan: Plan):
    """The config sections an actor owns (roles/actor.py ``ActorSettings``)."""
    from hpcrl.runtime.roles.actor import ActorSettings

    s = plan.sections
    return ActorSettings(env=s.env, actors=s.actors, eval=s.eval, io=s.io, debug=s.debug)


def roll_back_record(run_dir: Path) -> dict | None:
    """--resume: cut run.h5, every node file and every trajectory file back to the row counts the checkpoint
    recorded, so no row of the redone work appears twice (one rule for every table and file); what was cut."""
    from hpcrl.io.rollback import trajectory_files, truncate_record
    from hpcrl.runtime.record.checkpoint import load_checkpoint

    state = load_checkpoint(run_dir)
    if not state or "record" not in state:
        return None
    # a file the checkpoint does not know was started after it (a resume with more actors): cut to 0
    steps = {**{a: 0 for a in trajectory_files(run_dir)}, **state["record"]["traj_steps"]}
    # a node file the checkpoint does not list is cut to 0 rows by truncate_record
    return truncate_record(run_dir, state["record"]["tables"], steps, nodes=state["record"].get("nodes", {}))


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


def role_parts(plan: Plan, env: EnvInfo, device: torch.device) -> tuple[Algorithm, nn.Module, TrajLayout]:
    """A role's algorithm object, model (the same initial weights on every role: seeded by the run's seed) on
    ``device``, and trajectory layout."""
    s = plan.sections
    algo = make_algorithm(s.algo, s.model, s.aggregation)
    torch.manual_seed(plan.seed)
    model = algo.make_model(env.observation_space, env.action_space, device=device)
    traj = TrajLayout(obs_shape=tuple(env.observation_space.shape), action_shape=tuple(model.action_shape),
                      obs_dtype=env.obs_dtype.str.lstrip("<>=|"), action_dtype="i8" if model.discrete else "f4",
                      num_envs=env.num_envs)
    return algo, model, traj


def fragment_layout_for(plan: Plan, env: EnvInfo, model: nn.Module) -> FragmentLayout:
    return fragment_layout(env.num_envs, plan.fragment_length, tuple(env.observation_space.shape),
                           tuple(model.action_shape), model.discrete, obs_dtype=env.obs_dtype)
