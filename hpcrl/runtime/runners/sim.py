"""``launch.runner: sim``: every role of the job in this process, in virtual time on a cluster profile's nodes.

The same role objects, admission policy, stop rule, checkpoints and files as the other runners (built by
runners/job.py ``build_job`` from the Plan); the shared objects are the serial runner's in-memory twins with
virtual-time costs (``runtime/transport/sim.py``), each role's clock is its clock in the SimPy world
(``runtime/virtual_time.py``), and the profile (hpcrl.cluster_profiles) says where each rank runs and what each
operation costs there. Every time in run.h5 is virtual; what the simulation really took is kept apart, in the
file's ``sim_*`` attributes (docs/sim.md).
"""
from __future__ import annotations

import math
import os
import resource
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from hpcrl.cluster_profiles import Profile, Slot, load_profile, place
from hpcrl.errors import ConfigError
from hpcrl.io.schema import RUN_FILE
from hpcrl.runtime import collector
from hpcrl.runtime.backoff import Backoff, window_owner_nap
from hpcrl.runtime.clock import Work
from hpcrl.runtime.placement import node_weight_caches
from hpcrl.runtime.plan import Plan
from hpcrl.runtime.record.node_rows import NodeRows
from hpcrl.runtime.roles.sampler import describe_env
from hpcrl.runtime.roles.node_actors import NodeActors
from hpcrl.runtime.runners import RunResult
from hpcrl.runtime.runners.job import actor_settings, build_jobs, make_role, role_parts
from hpcrl.runtime.runners.serial import LocalWiring
from hpcrl.runtime.runners.threads import one_compute_thread
from hpcrl.runtime.topology import RankMapFacts, Topology, plan_roles
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.control import RankSilent
from hpcrl.runtime.transport.local_node_reports import NodeBuffer
from hpcrl.runtime.transport.report_packing import summary_interval
from hpcrl.runtime.transport.sim import (ActorNap, SimBoard, SimCounters, SimFragments, SimGroupsAllreduce, SimMailbox,
                                         SimNodeGather, SimReports, SimWeightTree, TransportPrices, _Charges)
from hpcrl.runtime.virtual_time import VirtualClock, VirtualWorld


def node_names(slots: list[Slot]) -> list[str]:
    return [f"{s.kind.name}-{s.node:05d}" for s in slots]


def actors_by_node(topos: list[Topology], slots: list[Slot]) -> dict[int, list[int]]:
    """launch.sim_actors=node: the first actor rank of each node -> the actor indices of that node's ranks."""
    out: dict[int, list[int]] = {}
    first: dict[int, int] = {}  # node -> its first actor rank
    for index, rank in enumerate(topos[0].actor_ranks):
        out.setdefault(first.setdefault(slots[rank].node, rank), []).append(index)
    return out


def actor_indices_by_node(actor_ranks: list[int], slots: list[Slot]) -> dict[int, tuple[int, list[int]]]:
    """Each node's first actor rank and the indices of its actors."""
    out: dict[int, tuple[int, list[int]]] = {}
    for index, rank in enumerate(actor_ranks):
        out.setdefault(slots[rank].node, (rank, []))[1].append(index)
    return out


def topologies(plan: Plan, slots: list[Slot]) -> list[Topology]:
    """One Topology per role, on the profile's nodes (no communicators)."""
    roles = plan_roles(plan.num_ranks, plan.groups, plan.ranks_per_group, plan.actors)
    nodes = node_names(slots)
    node_ranks = list(range(len(roles)))  # one list for all (a list per rank is quadratic in the job's size)
    facts = RankMapFacts(roles, nodes)  # and the groups' roots and nodes worked out once
    return [Topology(comm=None, rank=r, size=len(roles), role=x.role, group=x.group, group_rank=x.group_rank,
                     group_comm=None, node_comm=None, groups=plan.groups, ranks_per_group=plan.ranks_per_group,
                     roles=roles, nodes=nodes, node_ranks=node_ranks, facts=facts)
            for r, x in enumerate(roles)]


class Machine:
    """The profile's nodes as the world sees them: a core resource per node in use, the links' times, and each
    rank's prices (``price(rank)``: its clock's cost of a Work)."""

    def __init__(self, profile: Profile, plan: Plan, slots: list[Slot], world: VirtualWorld, num_params: int) -> None:
        self.profile, self.plan, self.slots, self.world, self.P = profile, plan, slots, world, num_params
        self.cores: dict[int, object] = {}
        s = plan.sections
        self.env_step = profile.env_step(s.env.id)
        self.minibatch_rows = s.algo.gradient_rows(plan.fragment_steps)
        stragglers = profile.stragglers
        slow_draw = np.random.default_rng([plan.seed, 7]).random(plan.actors)
        self.slow = slow_draw < stragglers.slow_share  # actors slow throughout

    def core(self, rank: int):
        node = self.slots[rank].node
        if node not in self.cores:
            self.cores[node] = self.world.cores(self.slots[rank].kind.cores, self.profile.time_slice_seconds)
        return self.cores[node]

    def link_times(self, a: int, b: int, nbytes: int) -> tuple[float, float]:
        """(latency, seconds the bytes take at the slower end's rate) between ranks ``a`` and ``b``; none on a node."""
        sa, sb = self.slots[a], self.slots[b]
        if sa.node == sb.node:
            return 0.0, 0.0
        net = self.profile.network
        rate = min(sa.kind.nic_bytes_per_second or net.bytes_per_second,
                   sb.kind.nic_bytes_per_second or net.bytes_per_second)
        return net.latency_seconds, nbytes / rate

    def allreduce_seconds(self, nbytes: int) -> float:
        """The learner group roots' allreduce of ``nbytes`` (learners.topology=allreduce) across their n nodes:
        Rabenseifner's reduce-scatter and allgather, ``2 ceil(log2 n)`` latencies and ``2 (n - 1) / n`` of the bytes
        at the slowest learner node's rate (Thakur, Rabenseifner and Gropp 2005), as ``hpcrl bench scale-model``
        prices it; the sum on one node is left out (NVLink), as there."""
        roots = [1 + g * self.plan.ranks_per_group for g in range(self.plan.groups)]
        kinds = {self.slots[r].node: self.slots[r].kind for r in roots}
        n = len(kinds)
        if n < 2:
            return 0.0
        net = self.profile.network
        rate = min(kind.nic_bytes_per_second or net.bytes_per_second for kind in kinds.values())
        return 2 * math.ceil(math.log2(n)) * net.latency_seconds + 2 * (n - 1) / n * nbytes / rate

    def transport_prices(self) -> TransportPrices:
        c = self.profile.costs
        return TransportPrices(push=c.push.at, receive=c.receive.at, publish=c.publish.at, fetch=c.fetch.at,
                               fragment_send=c.fragment_send, report=c.report, link_times=self.link_times)

    def price(self, rank: int, topo: Topology):
        """The cost of each Work on rank ``rank``: CPU work at its node's core speed, a gradient on its GPU (if it
        has one), an actor's env steps times its straggler factors."""
        c, slot, P = self.profile.costs, self.slots[rank], self.P
        speed = slot.kind.cpu_speed
        gradient = (c.gpu_gradient if slot.gpu is not None and c.gpu_gradient is not None else c.gradient)
        gradient_seconds = gradient.at(self.minibatch_rows, P) / (1.0 if slot.gpu is not None else speed)
        # rank 0's step: Adam on a gradient, or a few vector operations (update push's outer step; the allreduce's
        # copy of the groups' weights, priced alike)
        apply = (c.apply_gradient if self.plan.push == "gradient" else c.apply_update).at(P) / speed
        inner_step = c.apply_gradient.at(P) / speed  # a group's own optimizer step (learners.push=update)
        combine = c.apply_update.at(P) / speed  # a vector added to the node's sum: the outer step's few vector ops
        stragglers = self.profile.stragglers
        actor = topo.actor_index if topo.role == "actor" else None
        slow = stragglers.slow_factor if actor is not None and self.slow[actor] else 1.0
        rng = np.random.default_rng([self.plan.seed, 11, rank])

        def seconds(work: Work, count: float) -> float:
            if work is Work.ENV_STEPS:
                factor = slow * (math.exp(rng.normal(0.0, stragglers.sigma)) if stragglers.sigma else 1.0)
                return count * self.env_step / speed * factor
            if work is Work.GRADIENT:
                return count * gradient_seconds
            if work is Work.INNER_STEP:
                return count * inner_step
            if work is Work.COMBINE:
                return count * combine
            if work is Work.PREPARE:
                return count * c.prepare_per_step / speed
            if work is Work.RECORD:
                return count * c.record_per_step / speed
            if work is Work.ADMIT:
                return count * c.admit / speed
            return count * apply  # Work.APPLY

        return seconds


class SimWiring(LocalWiring):
    """The sim runner's shared objects (runners/job.py ``Wiring``): the serial runner's, made once and handed to
    every role, but with the virtual-time twins and each rank's virtual clock. Its abort flag is never set: a
    failed role ends the world (runtime/virtual_time.py), which ends the others."""

    def __init__(self, plan: Plan, world: VirtualWorld, machine: Machine) -> None:
        super().__init__(plan, threading.Event())
        self.world, self.machine = world, machine
        self.charges = _Charges(world, machine.transport_prices())
        self.clocks: dict[int, VirtualClock] = {}

    def counters(self, words: int):
        return self._once("counters", lambda: SimCounters(words, self.world, self.charges.news, self.charges.actor_news,
                                                          control.base_word(self.plan.groups, 0)))

    def mailbox(self, groups: int, slots: int, num_params: int, stats: int):
        return self._once("mailbox", lambda: SimMailbox(self.charges, groups, slots, num_params, stats))

    def board(self, num_params: int, history: int, probe_size: int, topo: Topology):
        return self._once("board", lambda: SimBoard(self.charges, num_params, history, probe_size, self._tree(topo),
                                                    self._cache_node(topo)))

    def _cache_node(self, topo: Topology) -> Callable[[int], str | None] | None:
        """launch.node_weight_cache, as the MPI runner decides it: an actor rank's node."""
        launch = self.plan.sections.launch
        nodes = {r: self.machine.slots[r].node for r in topo.actor_ranks}
        if not node_weight_caches(launch.node_weight_cache, list(nodes.values()), launch.weight_tree):
            return None
        return nodes.get

    def _tree(self, topo: Topology) -> SimWeightTree | None:
        """launch.weight_tree: the actors' nodes numbered by their first actor rank, as the MPI tree numbers them."""
        fanout = self.plan.sections.launch.weight_tree
        if not fanout:
            return None
        first = {node: relay for node, (relay, _) in
                 actor_indices_by_node(topo.actor_ranks, self.machine.slots).items()}
        leaders = sorted(first.values())
        number = {relay: i for i, relay in enumerate(leaders)}
        node_of = {r: number[first[self.machine.slots[r].node]] for r in topo.actor_ranks}
        return SimWeightTree(self.charges, fanout, leaders, node_of)

    def reports(self, topo: Topology, run_dir, counters):
        """Rank 0's queue (a drain costs ``report`` per message); an actor's, with ``actors.reports: node`` or
        ``summary``, its node's buffer, which puts the node's reports in the queue as one message
        (transport/local_node_reports.py; with summary the node's rows go to its file: runtime/record/node_rows.py)."""
        up = self._once("reports", lambda: SimReports(self.charges))
        s = self.plan.sections
        if topo.role != "actor" or s.actors.reports == "fragment":
            return up
        node = self.machine.slots[topo.rank].node
        on_node = self._once("actors by node", lambda: actor_indices_by_node(topo.actor_ranks, self.machine.slots))
        relay, actors = on_node[node][0], on_node[node][1]

        def buffer() -> NodeBuffer:
            clock = self.clock(topo)
            packing = (NodeRows(run_dir, relay, s.io.compression, lambda: counters.read(control.ENV_STEPS), clock,
                                summary_interval(len(on_node))) if s.actors.reports == "summary" else None)
            return NodeBuffer(up, actors, relay, clock, packing=packing)

        return self._once(("node reports", node), buffer).member(topo.actor_index)

    def fragments(self, layout, max_in_flight: int, topo: Topology):
        L = self.plan.ranks_per_group
        return self._once("fragments", lambda: SimFragments(self.charges, layout, self.plan.groups, self.plan.actors,
                                                            max_in_flight, root_of_group=lambda g: 1 + g * L))

    def clock(self, topo: Topology) -> VirtualClock:
        if topo.rank not in self.clocks:
            self.clocks[topo.rank] = VirtualClock(self.world, self.machine.price(topo.rank, topo))
        return self.clocks[topo.rank]

    def parameter_nap(self, topo: Topology) -> Backoff:
        return window_owner_nap(self.clock(topo))  # the MPI runner's (virtual naps cost no CPU)

    def learner_nap(self, topo: Topology) -> Backoff:
        return Backoff(5e-5, 2e-3, self.clock(topo))  # the MPI runner's, in virtual time

    def actor_nap(self, topo: Topology):
        """The MPI runner's back-off in virtual time, without the ticks at which nothing an actor looks at changed
        (ActorNap). With actors.reports node or summary every tick: a relay's poll passes its node's reports on
        by the time."""
        clock = self.clock(topo)
        if self.plan.sections.actors.reports != "fragment":
            return lambda: Backoff(5e-5, 5e-3, clock)
        return lambda: ActorNap(clock, self.charges.actor_news)

    def node_gather(self, topo: Topology, meta_size: int, num_params: int):
        node = self.machine.slots[topo.rank].node
        gather = lambda: SimNodeGather(self.world, self.charges.news, topo.node_mates(topo.group))  # noqa: E731
        return self._once(("node gather", node), gather).for_group(topo.group)

    def groups_allreduce(self, topo: Topology):
        allreduce = lambda: SimGroupsAllreduce(self.world, self.charges.news, self.plan.groups,  # noqa: E731
                                               self.machine.allreduce_seconds)
        shared = self._once("groups_allreduce", allreduce)
        return shared.for_group(topo.group)

    def learner_cpu_time(self, topo: Topology):
        return None  # busy time in virtual time, as the MPI runner's in wall time

    def between_steps(self, topo: Topology):
        return None  # virtual time: nothing waits for the lock


def run(plan: Plan, run_dir: Path, resume: bool = False, progress: str = "plain") -> RunResult:
    """Run the plan's whole job in virtual time. The result holds the summary (why it stopped), or names the role
    that failed first (its traceback in details)."""
    import torch

    one_compute_thread()
    real_start, cpu_start = time.monotonic(), time.process_time()
    s = plan.sections
    run_dir = Path(run_dir)
    profile = load_profile(s.launch.profile)
    slots = place(profile, plan.groups * plan.ranks_per_group, plan.actors, s.env.id)
    world = VirtualWorld()
    env = describe_env(s.env)
    # the prices of the weights' size, before any rank's Job: one model built for its size alone
    num_params = role_parts(plan, env, torch.device("cpu"))[1].flat.num_params
    machine = Machine(profile, plan, slots, world, num_params)
    wiring = SimWiring(plan, world, machine)
    topos = topologies(plan, slots)
    # launch.sim_actors=node: a node's actor ranks as one role, run by the Job of the node's first rank
    per_node = actors_by_node(topos, slots) if s.launch.sim_actors == "node" else {}
    if per_node and resume:
        raise ConfigError(f"--resume: {run_dir} ran with launch.sim_actors=node, which keeps no trajectory "
                          "files to resume from; start the run again")
    built = [t for t in topos if t.role != "actor" or not per_node or t.rank in per_node]
    jobs = build_jobs(plan, built, env, run_dir, resume, "sim", wiring, progress)
    settings = actor_settings(plan)
    roles = [NodeActors(job, settings, per_node[job.rank]) if job.rank in per_node else make_role(job)
             for job in jobs]
    parameter = roles[0]
    parameter.publish_initial()  # before any role's turn: costs nothing, as the other runners' start
    startup = parameter.startup_info()
    for job, role in zip(jobs, roles):
        job.startup = startup
        world.spawn(job.rank, f"{job.topo.role}-{job.rank}", role.run, wiring.clock(job.topo), machine.core(job.rank),
                    start=profile.start_seconds if job.rank else 0.0)

    def interrupt(signum, _frame):  # first Ctrl-C: stop and checkpoint; second: now
        if parameter.signals.received is not None:
            raise KeyboardInterrupt
        parameter.signals.received = signum

    old_handler = signal.signal(signal.SIGINT, interrupt)
    collector.resume()  # every role is built (runtime/collector.py)
    setup_seconds = time.monotonic() - real_start
    try:
        world.run()
    except Exception as exc:  # noqa: BLE001 - a deadlock: the roles were ended, files closed below
        for role in roles:
            role.close_on_error()
        return RunResult.failed("sim", run_dir, f"{exc}; run directory {run_dir}")
    finally:
        signal.signal(signal.SIGINT, old_handler)
    failed = world.first_failure
    if failed is not None:
        for role in roles:
            role.close_on_error()
        exc, details = failed.failure
        if isinstance(exc, RankSilent):
            return RunResult.failed("sim", run_dir, f"{exc}; run directory {run_dir}")
        return RunResult.failed("sim", run_dir, f"rank {failed.rank} ({failed.name}) failed: {type(exc).__name__}: "
                                f"{exc}; run directory {run_dir}", details=details)
    _note_real_cost(run_dir, profile, world, real_start, cpu_start, setup_seconds)
    return RunResult.ended("sim", run_dir, parameter.summary)


def _note_real_cost(run_dir: Path, profile: Profile, world: VirtualWorld, real_start: float, cpu_start: float,
                    setup_seconds: float) -> None:
    """What simulating took, kept apart from the record's virtual times: run.h5's ``sim_*`` attributes."""
    real = time.monotonic() - real_start
    with h5py.File(run_dir / RUN_FILE, "a", locking=False) as f:
        f.attrs["sim_profile"] = profile.name
        f.attrs["sim_virtual_seconds"] = float(world.env.now)
        f.attrs["sim_real_seconds"] = real
        f.attrs["sim_setup_seconds"] = setup_seconds  # of sim_real_seconds: building the roles
        f.attrs["sim_cpu_seconds"] = time.process_time() - cpu_start
        f.attrs["sim_max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        f.attrs["sim_ran_at_unix"] = time.time() - real
        f.attrs["sim_host_pid"] = f"{os.uname().nodename}:{os.getpid()}"
