"""The frozen Plan: what the role loops read instead of working it out from the config tree.

Built once from a resolved :class:`~hpcrl.config.RunConfig` (no torch, no MPI: ``hpcrl run``
builds it before anything is written), by every runner, and handed to every role in its Job.
Each fact comes from the component that owns it, never from a test of another component's name:

- **pacing** (how a learner group paces its gradients) from the admission policy class
  (``hpcrl.staleness``: ``free``; ``lockstep``: each gradient waits until the previous one is
  applied, so every gradient has staleness 0 (sync); ``held``: a group waits while rank 0 holds
  one of its gradients back (SSP));
- **the learning-rate schedule** from the algorithm's config (``lr_schedule``: PPO's linear
  anneal; None: constant), and **what a learner group pushes** (``push``: a gradient per minibatch, or
  one update per batch made with the group's own optimizer, ``learners.push``);
- **the reward discount** the actors' reward normalisation uses (the algorithm's ``gamma``);
- **round length, per-group batch and fragment size** from the algorithm's round regime: a
  batch algorithm's round is ``train_batch_size`` env steps split over the groups, any other's
  ``round_fragments`` actor fragments (one per actor unless set; a group trains each fragment it gets);
- **fragment routing**: an actor sends each fragment to one group with room (``own_group``),
  to every active group (MARL policy learners: ``every_group``) or to the post-processing group
  (``postprocess_first``), which prepares it for the others;
- **the runner** (``mpi``, ``serial``, ``sim`` or ``fused``) from ``launch.runner`` and, for an algorithm
  the fused loop runs (its config's ``fused_loop``), from whether this job fits it; ``runner_reason``
  is the line ``hpcrl run`` prints at start (with why a fused-loop algorithm runs on the roles).

The typed config sections travel in ``Plan.sections`` for the runners, which hand each role only the sections it
owns (``runtime/runners/job.py``: ``make_role``); no role reads ``sections`` (tests/test_runtime_layout.py).
Under MPI rank 0 makes the Plan once and broadcasts it (``runtime/runners/mpi.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from hpcrl.algos.schedules import LinearAnneal
from hpcrl.staleness import POLICY_PACING

if TYPE_CHECKING:
    from hpcrl.config import (ActorsConfig, AggregationConfig, DebugConfig, EnvConfig, EvalConfig, IOConfig,
                              LaunchConfig, LearnersConfig, ModelConfig, StopConfig)
    from hpcrl.config_base import AlgoSection

Pacing = Literal["free", "lockstep", "held"]
Routing = Literal["own_group", "every_group", "postprocess_first"]
Runner = Literal["mpi", "serial", "fused", "sim"]
Push = Literal["gradient", "update", "allreduce"]


@dataclass(frozen=True)
class Sections:
    """The resolved config's sections, typed, for the runners: they build the shared objects from them and give
    each role the ones it owns. Same names as :class:`~hpcrl.config.RunConfig`'s."""

    env: EnvConfig
    model: ModelConfig
    algo: AlgoSection
    actors: ActorsConfig
    learners: LearnersConfig
    aggregation: AggregationConfig
    io: IOConfig
    launch: LaunchConfig
    stop: StopConfig
    eval: EvalConfig
    debug: DebugConfig
    name: str
    """The run's name (part of its directory's and batch jobs' names)."""
    yaml: str = field(repr=False)
    """The resolved config as config.yaml holds it (run.h5 keeps it too)."""


@dataclass(frozen=True)
class Plan:
    actors: int
    """Actor ranks."""
    groups: int
    """Learner groups."""
    ranks_per_group: int
    """Ranks of a learner group (learners.ranks_per_group; with learners.elastic steps or jobs all but the root
    join)."""
    num_ranks: int
    """Ranks the job launches: 1 parameter + the learner groups' launched ranks + the actors."""
    seed: int
    """The run's seed (env.seed): the initial weights, each actor's env seeds, each group's minibatch order."""
    fragment_length: int
    """Steps per env instance in one fragment (actors.fragment_length)."""
    fragment_steps: int
    """Env steps in one fragment (fragment_length x num_envs, x agents for MARL instances)."""
    round_steps: int
    """Env steps the learners consume per round with every actor sampling (Stellaris k, an RLlib iteration)."""
    group_batch_size: int
    """Env steps a learner group gathers before it trains, with every actor sampling."""
    routing: Routing
    pacing: Pacing
    on_policy: bool
    """Each batch is sampled with the weights the previous batch made (actors.on_policy)."""
    sync_frac: float
    """On-policy: the share of a round's reserved places whose fragments make a batch (actors.sync_frac: DD-PPO's
    preemption threshold; 1 with pipelined actors)."""
    lr_schedule: LinearAnneal | None
    """The rate set before each step from the env steps consumed (by rank 0 before each gradient step; by a learner
    group before each batch it updates on with push=update); None: the optimiser's own."""
    push: Push
    """What a learner group pushes: one gradient per minibatch, or one update per batch (learners.push); allreduce
    (learners.topology=allreduce): the groups average each minibatch's gradient among themselves and group 0 pushes
    the weights they all hold after the batch."""
    combine: bool
    """The groups of a node push once for all of them (learners.combine=node: transport/node_combine.py)."""
    shards: int
    """Parameter ranks that own a slice of the weights each (aggregation.shards; rank 0 is shard 0 and decides)."""
    reward_gamma: float
    """Discount of the discounted return whose std normalises rewards (env.normalize_reward)."""
    runner: Runner
    """What runs the job: mpi (a rank per role), serial (every role in this process), fused (one device loop)."""
    runner_reason: str
    """One line saying where the job runs and, for a fused-loop algorithm on the roles, why (printed at start)."""
    trajectory_files: bool
    """Each actor rank writes traj/actor-NNNNN.h5 (false only for a simulation's node actors, launch.sim_actors=node:
    run.h5 then has no trajectories/ view)."""
    sections: Sections = field(repr=False, compare=False)
    """The config's typed sections (for the runners; roles get theirs from runners/job.py's make_role)."""

    @property
    def postprocess_groups(self) -> int:
        """Groups at the front of the rank map that prepare batches for the others (0 or 1)."""
        return int(self.routing == "postprocess_first")

    @property
    def fragments_to_every_group(self) -> bool:
        return self.routing == "every_group"

    def round_steps_for(self, active_actors: int) -> int:
        """Env steps of a round while ``active_actors`` of the actor ranks sample (MARL actor scaling)."""
        return max(1, -(-self.round_steps * min(active_actors, self.actors) // self.actors))

    def group_batch_size_for(self, active_actors: int) -> int:
        """A group's batch while ``active_actors`` of the actor ranks sample (it takes whole fragments)."""
        return max(1, -(-self.group_batch_size * min(active_actors, self.actors) // self.actors))


def make_plan(cfg: Any) -> Plan:
    """The Plan of a resolved RunConfig."""
    algo = cfg.algo
    fragment_steps, round_steps, group_batch = batch_sizes(cfg)
    runner, reason = _runner(cfg)
    sections = Sections(env=cfg.env, model=cfg.model, algo=algo, actors=cfg.actors, learners=cfg.learners,
                        aggregation=cfg.aggregation, io=cfg.io, launch=cfg.launch, stop=cfg.stop, eval=cfg.eval,
                        debug=cfg.debug, name=cfg.name, yaml=cfg.to_yaml())
    return Plan(actors=cfg.actors.count, groups=cfg.learners.groups, ranks_per_group=cfg.learners.ranks_per_group,
                num_ranks=cfg.num_ranks, seed=cfg.env.seed, fragment_length=cfg.actors.fragment_length,
                fragment_steps=fragment_steps, round_steps=round_steps, group_batch_size=group_batch,
                routing=algo.routing(), pacing=POLICY_PACING[cfg.aggregation.policy], on_policy=cfg.actors.on_policy,
                sync_frac=cfg.actors.sync_frac,
                lr_schedule=algo.lr_schedule(),
                push="allreduce" if cfg.learners.topology == "allreduce" else cfg.learners.push,
                combine=cfg.learners.combine == "node", shards=cfg.aggregation.shards,
                reward_gamma=algo.reward_discount(),
                runner=runner, runner_reason=reason, sections=sections,
                trajectory_files=not (runner == "sim" and cfg.launch.sim_actors == "node"))


def batch_sizes(cfg: Any) -> tuple[int, int, int]:
    """Env steps of a fragment, of a round and of a learner group's batch (the config's validation checks the
    minibatch against the last)."""
    algo = cfg.algo
    fragment_steps = cfg.actors.fragment_length * cfg.env.num_envs * algo.instances_per_copy()
    if algo.round_regime != "batch":
        return fragment_steps, fragment_steps * algo.round_fragments, fragment_steps
    whole = algo.routing() != "own_group"  # every group (or the post-processing group) takes the whole batch
    group_batch = algo.train_batch_size if whole else max(1, algo.train_batch_size // cfg.learners.groups)
    return fragment_steps, algo.train_batch_size, group_batch


def _runner(cfg) -> tuple[Runner, str]:
    """The runner and its line. The fused loop runs an algorithm whose config says ``fused_loop`` (HA2C, HDDPG)
    on a batched tensor env with one actor and one learner group of one rank under launch.runner=serial and no
    evaluation episodes; otherwise the roles run it as usual, and the line says why."""
    on_roles = ""
    if cfg.algo.fused_loop:
        why = _why_not_fused(cfg)
        if not why:
            return "fused", (f"{cfg.algo.name} on {cfg.env.num_envs} x {cfg.env.id} in this process "
                             "(launch.runner=serial, fused loop)")
        on_roles = f"; {cfg.algo.name} runs on the roles, not the fused loop: {why}"
    if cfg.launch.runner == "serial":
        return "serial", f"{cfg.num_ranks} roles in this process (launch.runner=serial){on_roles}"
    if cfg.launch.runner == "sim":
        return "sim", (f"{cfg.num_ranks} roles in this process in virtual time on cluster profile "
                       f"{cfg.launch.profile} (launch.runner=sim){on_roles}")
    return "mpi", f"{cfg.num_ranks} ranks (launch.runner=mpi){on_roles}"


def _why_not_fused(cfg) -> str:
    """For an algorithm the fused loop runs: why this config runs it on the roles instead ('' when it fuses)."""
    from hpcrl.envs import registry

    spec = registry.spec(cfg.env.id)
    for reason, holds in (
            (f"launch.runner={cfg.launch.runner}", cfg.launch.runner != "serial"),
            (f"env.id={cfg.env.id} is not a batched tensor env", spec is None or spec.kind != "batched"),
            (f"actors.count={cfg.actors.count}", cfg.actors.count != 1),
            (f"learners.groups={cfg.learners.groups}", cfg.learners.groups != 1),
            (f"learners.ranks_per_group={cfg.learners.ranks_per_group}", cfg.learners.ranks_per_group != 1),
            (f"eval.episodes={cfg.eval.episodes}: the fused loop has no actor to evaluate on", cfg.eval.episodes != 0)):
        if holds:
            return reason
    return ""
