"""One typed config tree for every hpcrl run, loaded from YAML.

Each component receives its own section (``cfg.actors``, ``cfg.aggregation``...), never the
whole tree. Each algorithm's section is its own config class, next to the algorithm
(:mod:`hpcrl.algos.registry` lists them); the sizes derived from the tree (round length, per-group
batch) are the runtime's Plan (:mod:`hpcrl.runtime.plan`). Every bad value becomes one
:class:`hpcrl.errors.ConfigError` line naming the field.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from hpcrl.algos.ha2c_config import HA2CConfig
from hpcrl.algos.hddpg_config import HDDPGConfig
from hpcrl.algos.impact_config import IMPACTConfig
from hpcrl.algos.ppo_config import PPOConfig
from hpcrl.algos.registry import ALGO_CONFIGS
from hpcrl.config_base import AlgoSection, Section
from hpcrl.envs.registry import MODULE_NAME
from hpcrl.errors import ConfigError
from hpcrl.marl.config import IPPOConfig, IQLConfig, MAPPOConfig, VDNConfig

__all__ = ["RunConfig", "Section", "AlgoSection", "EnvConfig", "ModelConfig", "ActorsConfig", "LearnersConfig",
           "AggregationConfig", "PPOConfig", "IMPACTConfig", "HA2CConfig", "HDDPGConfig", "IPPOConfig", "MAPPOConfig",
           "IQLConfig", "VDNConfig", "IOConfig", "LaunchConfig", "StopConfig", "EvalConfig", "DebugConfig",
           "build_config", "load_config", "ConfigError"]


class EnvConfig(Section):
    id: str = "CartPole-v1"
    """Environment id: a Gymnasium id (a user's own after env.imports, or as module:Id) or one registered by hpcrl.envs."""
    imports: list[str] = Field(default_factory=list)
    """Modules imported before env.id is checked and on every rank before it makes its envs: the modules whose import registers a user's own Gymnasium ids (docs/own-env.md)."""
    num_envs: int = Field(8, ge=1)
    """Envs per actor rank (parallel env: copies, every agent an instance), or a batched algo's instances."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the environment constructor."""
    seed: int = 0
    """Base seed; actor r uses seed + 1000 * r."""
    normalize_obs: bool = False
    """Actors standardise observations with running mean/variance (per actor rank, not synchronised)."""
    normalize_reward: bool = False
    """Actors scale training rewards by the running std of the discounted return (episode returns stay raw)."""
    clip: float = Field(10.0, gt=0)
    """Normalised observations and rewards are clipped to [-clip, clip]."""
    rescale_actions: bool = False
    """Box actions: the policy's sample clipped to [-1, 1] and mapped onto [low, high] (else clipped to it)."""

    @field_validator("imports", mode="before")
    @classmethod
    def _one_module(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v  # env.imports=my_pkg.envs on the command line

    @field_validator("imports")
    @classmethod
    def _module_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.match(MODULE_NAME, name):
                raise ValueError(f"{name!r} is not a module name (a dotted name, e.g. my_pkg.envs)")
        return v


class ModelConfig(Section):
    hidden_sizes: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [64, 64])
    """Widths of the MLP hidden layers (policy and value networks are separate MLPs)."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden-layer nonlinearity."""
    torso: Literal["mlp", "cnn"] = "mlp"
    """mlp: the MLP alone; cnn: Stellaris Table II's Atari CNN on [frames, 84, 84] observations, then the MLP head."""


class ActorsConfig(Section):
    count: int = Field(2, ge=1)
    """Actor ranks."""
    fragment_length: int = Field(128, ge=1)
    """Steps per environment in one trajectory fragment sent to a learner group."""
    max_in_flight: int = Field(2, ge=1)
    """Fragments an actor may have in flight (sent, not yet received) before it waits."""
    on_policy: bool = False
    """Sample each fragment with the weights the learners finished the previous batch with (no policy lag, as single-process PPO): an actor reserves a place in a group's backlog, then pulls weights and samples; rank 0 frees a batch's places once the version that holds its push is published, every group's at once. Off: actors sample the next batch while the learners train (pipelined, one batch of lag)."""
    sync_frac: float = Field(1.0, gt=0, le=1)
    """actors.on_policy: DD-PPO's preemption threshold. A group's backlog takes ceil(places per batch / sync_frac)
    reservations a round and the group trains on the first fragments to arrive; the round's others are dropped
    (runtime/roles/preemption.py). 1: every reserved place's fragment is trained on. DD-PPO uses 0.6."""
    weight_sync: Literal["every_fragment", "aaps"] = "every_fragment"
    """When an actor pulls new weights: before every fragment, or by AAPS (KL on a probe batch > aaps_delta)."""
    aaps_delta: float = Field(0.01, gt=0)
    """AAPS KL threshold (ClusterEnv sweeps 0.001 ... 1.0)."""
    probe_batch: int = Field(64, ge=1)
    """States in the AAPS probe batch the parameter rank evaluates next to each published version."""
    elastic: Literal["park", "steps", "jobs"] = "park"
    """Where a parked actor's environments are (actor scaling). park: on its rank, blocked (the allocation keeps
    the rank). steps: an actor's rank keeps its loop (weights, sends, trajectory file) but its environments and
    policy forward passes run on one rank that joins the running job while the actor is active, as a job step on a
    node of the allocation without the job's own ranks (mpiexec on one machine), and leaves when it parks, so the
    node goes back (runtime/roles/joining_sampler.py). jobs: likewise, each join a one-node batch job of its own
    (an allocations row: hpcrl analyze prices it from sacct)."""
    keep_sampler_seconds: float = Field(0.0, ge=0)
    """actors.elastic=steps/jobs: a parked actor releases its joined sampler once it has been parked this long (0:
    at once); woken before, it samples with the same one (no join: a join costs seconds of start-up)."""
    reports: Literal["fragment", "node", "summary"] = "fragment"
    """How the actors' reports reach rank 0: one message per fragment; node (runners mpi and sim): a node's actors'
    reports batched on the node, one message per node and flush (runtime/transport/node_reports.py); or summary
    (runners mpi and sim): the node writes its fragments' actors and episodes rows to nodes/node-RRRRR.h5 and rank 0
    gets per-actor sums every flush (runtime/record/node_rows.py), for jobs of hundreds of nodes."""
    join_timeout_seconds: float = Field(120.0, gt=0)
    """actors.elastic=steps/jobs: a sampler that has not connected this long after its launch is given up (an
    actor_joins row) and the actor samples on its own rank until it is parked and woken again."""

    @model_validator(mode="after")
    def _sampler_settings_need_joining(self) -> "ActorsConfig":
        if self.elastic == "park" and self.keep_sampler_seconds != 0:
            raise ValueError(f"actors.keep_sampler_seconds={self.keep_sampler_seconds:g} does nothing with "
                             "actors.elastic=park (no sampler joins); set actors.elastic=steps or jobs, or remove it")
        if self.sync_frac < 1 and not self.on_policy:
            raise ValueError(f"actors.sync_frac={self.sync_frac:g} preempts on-policy fragments; it needs "
                             "actors.on_policy=true (pipelined actors already fill a slow actor's places), or remove it")
        return self


class LearnersConfig(Section):
    groups: int = Field(1, ge=1)
    """Learner groups G."""
    ranks_per_group: int = Field(1, ge=1)
    """Ranks per learner group L (they split a batch and allreduce gradients)."""
    min_active: int = Field(1, ge=1)
    """Fewest active learner groups (elasticity lower bound)."""
    max_active: int | None = Field(None, ge=1)
    """Most active learner groups (default: groups)."""
    elastic_headroom: float = Field(0.2, gt=0, lt=1)
    """Hysteresis of the elastic rule (runtime/roles/elastic.py): one more group is activated when the actors'
    sampling rate exceeds the active groups' measured capacity by this fraction (and fragments wait), one is
    parked when the other active groups would still run below 1 - this fraction of their capacity."""
    elastic_seconds: float = Field(2.0, gt=0)
    """Seconds of rate measurements behind each elastic decision, and the least time between two changes."""
    elastic: Literal["park", "steps", "jobs"] = "park"
    """What an inactive learner group holds. park: all its ranks, blocked (they take no core, but the allocation
    keeps them). steps: only its root (one rank beside the others: it takes fragments, prepares batches, pushes);
    its other ranks_per_group - 1 ranks join the running job as a new job step while the group is active (srun
    inside a Slurm allocation, a second PALS mpiexec in a PBS job, away from the job's own nodes; mpiexec on one
    machine), connect through an MPI
    port and leave when it parks, so their step ends and their nodes go back to the allocation
    (hpcrl/join_launch.py, runtime/transport/joining.py). jobs: likewise, but each join is a separate batch job in the site's queue
    (sbatch or qsub, one node: hpcrl/join_jobs.py), so a parked group's node goes back to the cluster and is
    billed only while it is in use (its job is an allocations row: hpcrl analyze prices it from sacct)."""
    join_timeout_seconds: float = Field(120.0, gt=0)
    """learners.elastic=steps: a group's ranks that have not connected this long after their step was started
    are given up (the step is ended, a join_given_up row in elastic_events) and the group's root computes its
    batches alone until the group is parked and activated again."""
    allreduce: Literal["auto", "horovod"] = "auto"
    """How a learner group of several ranks averages its gradients: auto = NCCL (torch.distributed) for CUDA
    learners with a GPU each, else MPI Allreduce; horovod = Horovod's allreduce (horovod must be installed)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where learners compute (and, for ha2c/hddpg, where the batched envs and the whole loop run):
    auto = the GPU given by the node-local rank when CUDA is available, else the CPU."""
    cuda_graphs: bool = True
    """On a CUDA learner, replay each minibatch gradient from a CUDA graph (runtime/roles/cuda_graph.py) when the
    algorithm offers one (PPO) and no IS window is used: small networks are bound by kernel launches. Under
    push=update a single-rank group replays each whole minibatch step, Adam included (runtime/roles/
    cuda_graph_step.py)."""
    overlap_push: bool = False
    """With CUDA graphs: push each minibatch gradient while the GPU computes the next one, so the next one's
    weights lack the gradient just pushed (staleness at least 1): about 1.1x the gradients/s, more env steps
    to a target (docs/results/runtime.md). Not under sync admission (lockstep)."""
    push: Literal["gradient", "update"] = "gradient"
    """What a learner group pushes to the parameter rank. gradient: one gradient per minibatch, each computed on
    the newest weights (Stellaris' design: one round trip through rank 0 per minibatch). update: the group runs the
    algorithm's whole update on its batch itself (every epoch and minibatch, the fused loop's steps, with its own
    optimizer and the algorithm's lr schedule) from the version it pulled, and pushes one update, the weights it
    started from minus the weights it ended with; rank 0 admits it like a gradient (staleness in versions) and
    applies it with the outer step (aggregation.outer_lr, outer_momentum, outer_nesterov)."""
    topology: Literal["server", "allreduce"] = "server"
    """How the learner groups combine their gradients. server: through the parameter rank (learners.push, the
    admission policy). allreduce (DD-PPO's way, Wijmans et al. 2020): the group roots average every minibatch's
    gradient among themselves with one MPI allreduce and each steps its own copy of the optimizer, so every group
    holds the same weights; group 0 alone pushes the batch's resulting weights to rank 0, which publishes them for the
    actors and keeps the record (one push per batch of all groups). Synchronous: needs aggregation.policy=sync and
    every group active (learners.min_active = learners.groups). Every group is at the same version, so Stellaris' IS
    window over the other groups' versions (aggregation.is_truncation) has nothing to add and is not used."""
    combine: Literal["none", "node"] = "none"
    """node: the learner groups whose roots share a node push once for all of them. Each root hands its push (its
    gradient times 1/G) to the node's first group's root, which sums them in group order and pushes the sum, with
    every group's header, to the parameter rank(s): a node's pushes cost rank 0 one receive, and the step is the
    one of separate pushes to the bit (rank 0 sums each node's gradients first, in group order, either way).
    Synchronous: needs aggregation.policy=sync and every group active; the nodes are the ranks MPI says share
    memory (launch.runner=mpi) or the profile's (launch.runner=sim)."""

    @property
    def launched_ranks_per_group(self) -> int:
        """A group's ranks in the job's own launch: all of them, or only its root (elastic=steps)."""
        return self.ranks_per_group if self.elastic == "park" else 1

    @model_validator(mode="after")
    def _active_bounds(self) -> "LearnersConfig":
        top = self.max_active if self.max_active is not None else self.groups
        if top > self.groups:
            raise ValueError(f"learners.max_active={top} exceeds learners.groups={self.groups}")
        if self.min_active > top:
            raise ValueError(f"learners.min_active={self.min_active} exceeds max_active={top}")
        return self

    @property
    def active_range(self) -> tuple[int, int]:
        return self.min_active, self.max_active if self.max_active is not None else self.groups


class AggregationConfig(Section):
    policy: Literal["stellaris", "stellaris_code", "pure_async", "sync", "ssp", "softsync"] = "stellaris"
    """Admission policy on the parameter rank (hpcrl.staleness); ssp and softsync are Stellaris' Fig. 11 baselines."""
    d: float = Field(0.96, ge=0.0, le=1.0)
    """Threshold decay (Stellaris Eq. 3): beta_k = delta_max * d**k; 0 = synchronous; 1 = every gradient on
    arrival, scaled by Eq. 4 (policy pure_async is the same without the scaling)."""
    v: float = Field(3.0, gt=0)
    """Learning-rate staleness exponent (Stellaris Eq. 4): alpha = alpha_0 / delta**(1/v)."""
    delta_max: Literal["first_round", "per_active_groups"] = "first_round"
    """When delta_max (Eq. 3) is observed: first_round (the paper: round 0, kept for the run) or per_active_groups (again, for one unthresholded round, whenever the number of active learner groups changes; beta_k keeps decaying with the round)."""
    rho: float = Field(1.0, gt=0)
    """Importance-sampling truncation level (Stellaris Eq. 2)."""
    is_truncation: bool = True
    """Use R' = min(|min_i pi_i/mu|, rho) over the window's learner policies instead of pi/mu."""
    mailbox_slots: int = Field(2, ge=2)
    """Gradient mailbox slots per learner group (>= 2 so a group can push while one slot is read)."""
    weight_history: int = Field(4, ge=1)
    """Past policy versions the weight board keeps (for the IS truncation over learner policies). With 1, every publish rewrites the slot readers copy from, and they retry until a copy was not overwritten."""
    ssp_s: int = Field(3, ge=0)
    """ssp: a group's gradient waits while the group has had more than s gradients applied beyond the slowest active group."""
    softsync_c: int | None = Field(None, ge=1)
    """softsync: gradients averaged into one step (None: the number of active learner groups)."""
    outer_lr: float = Field(1.0, gt=0.0, le=10.0)
    """learners.push=update: the outer step theta <- theta - outer_lr * d, d the admitted updates' (staleness-scaled)
    mean, with momentum d <- m d_prev + d; 1 with no momentum makes one group at staleness 0 equal the fused loop."""
    outer_momentum: float = Field(0.0, ge=0.0, lt=1.0)
    """learners.push=update: momentum m of the outer step (0: plain)."""
    outer_nesterov: bool = False
    """learners.push=update: Nesterov momentum (the step is d + m * buffer); needs outer_momentum > 0."""
    shards: int = Field(1, ge=1)
    """Parameter ranks that each own a slice of the weights and its optimizer state (ranks 0 .. shards-1; rank 0 decides admission for all). MPI runner only."""

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> "AggregationConfig":
        if self.outer_nesterov and self.outer_momentum == 0.0:
            raise ValueError("aggregation.outer_nesterov=true needs aggregation.outer_momentum > 0 (allowed: 0 < m < 1)")
        return self


ALGO_NAMES = tuple(c.model_fields["name"].default for c in ALGO_CONFIGS)
AlgoConfig = Annotated[Union[ALGO_CONFIGS], Field(discriminator="name")]
"""The algo section: one of the registered algorithms' configs, chosen by its ``name``."""


class IOConfig(Section):
    run_dir: str = "runs/{name}-{time}"
    """Run directory; {name} and {time} (YYYYmmdd-HHMMSS) are filled in."""

    @field_validator("run_dir")
    @classmethod
    def _run_dir_placeholders(cls, value: str) -> str:
        try:
            value.format(name="n", time="t")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"only the placeholders {{name}} and {{time}} are allowed ({exc})") from None
        return value
    flush_seconds: float = Field(5.0, gt=0)
    """HDF5 files are flushed at least this often, so a killed job leaves readable files."""
    checkpoint_every: int = Field(50, ge=1)
    """Aggregation events between checkpoints (also on SIGTERM/SIGUSR1)."""
    checkpoint_min_seconds: float = Field(2.0, ge=0)
    """Least seconds between two periodic checkpoints: each costs the parameter rank a record flush and a
    file write (tens of ms), which at hundreds of updates per second would take a large share of its core."""
    compression: Literal["gzip", "lzf", "none"] = "gzip"
    """HDF5 dataset compression filter."""
    log_seconds: float = Field(10.0, gt=0)
    """Interval of progress lines when stdout is not a terminal."""
    loggers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=lambda: ["tensorboard"])
    """Trackers the parameter rank (or the fused loop) sends the live scalars to, the same scalars to each, x = env
    steps (docs/runtime.md): tensorboard (event files in RUN_DIR/tensorboard/), wandb (a W&B run in RUN_DIR/wandb/,
    offline unless WANDB_MODE is set), mlflow (a run in the file store RUN_DIR/mlruns/ unless MLFLOW_TRACKING_URI is
    set; experiment: the config's name); []: none. wandb and mlflow need `pip install 'hpcrl[trackers]'`."""
    tensorboard: bool = Field(True, exclude=True)
    """The older switch for tensorboard in io.loggers: false removes it, true adds it; as loaded, whether io.loggers
    holds tensorboard (config.yaml keeps io.loggers alone)."""

    @model_validator(mode="before")
    @classmethod
    def _tensorboard_switch(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        loggers = data.get("loggers", ["tensorboard"])
        loggers = [loggers] if isinstance(loggers, str) else loggers  # io.loggers=wandb on the command line
        switch = data.get("tensorboard")
        if not isinstance(loggers, list) or not isinstance(switch, (bool, type(None))):
            return data  # the fields' checks name the bad value
        if switch is False:
            loggers = [name for name in loggers if name != "tensorboard"]
        elif switch is True and "tensorboard" not in loggers:
            loggers = [*loggers, "tensorboard"]
        return {**data, "loggers": loggers, "tensorboard": "tensorboard" in loggers}

    @field_validator("loggers")
    @classmethod
    def _each_logger_once(cls, v: list[str]) -> list[str]:
        twice = [name for i, name in enumerate(v) if name in v[:i]]
        if twice:
            raise ValueError(f"{twice[0]} appears twice")
        return v


class ContainerConfig(Section):
    runtime: Literal["apptainer", "podman-hpc", "shifter"] = "apptainer"
    """Container runtime that wraps each rank."""
    image: str
    """Image path (.sif) for apptainer, image name for podman-hpc and shifter."""
    binds: list[str] = Field(default_factory=list)
    """Host paths to bind into the container (src[:dst])."""
    gpu: bool = False
    """Expose GPUs (apptainer --nv, podman-hpc --gpu, shifter --module=mpich,gpu)."""


class PlacementConfig(Section):
    """Which rank takes which role, by the nodes the launcher put them on (hpcrl/runtime/placement.py)."""

    roles: Literal["in_launch_order", "learners_first"] = "in_launch_order"
    """in_launch_order: rank 0 is the parameter rank, the next G x L ranks the learners, the rest the actors.
    learners_first: the parameter rank first, learner ranks packed onto the first nodes, actors on every other
    rank, node by node (the same under mpiexec, srun, PALS and Parsl: the ranks order themselves by hostname)."""
    learners_per_node: int | None = Field(None, ge=1)
    """learners_first: at most this many learner ranks on a node (a GPU node: its GPU count; each learner takes
    the GPU of its index among its node's learners); None: as many as the node has ranks."""
    parameter: Literal["with_learners", "apart"] = "with_learners"
    """learners_first: with_learners puts learner ranks beside the parameter rank on the first node; apart leaves
    that node's other ranks to actors, and learners start on the next node."""

    @model_validator(mode="after")
    def _options_of_learners_first(self) -> "PlacementConfig":
        if self.roles == "in_launch_order" and (self.learners_per_node is not None or self.parameter != "with_learners"):
            raise ValueError("launch.placement.learners_per_node and .parameter are read only with "
                             "launch.placement.roles=learners_first")
        return self


class LaunchConfig(Section):
    runner: Literal["mpi", "serial", "sim"] = "mpi"
    """Where the roles run: 'mpi' (one MPI rank each, started by mpiexec/srun/PALS), 'serial'
    (all roles in this one process, in-memory transports, no MPI; same record) or 'sim' (all roles in this
    process in virtual time, on the cluster of ``launch.profile``: docs/sim.md)."""
    profile: str = "this-machine"
    """launch.runner=sim: the cluster profile the job runs on in virtual time, a shipped name
    (this-machine, perlmutter, polaris, stellaris-hpc, marless) or a path to a profile YAML (docs/sim.md)."""
    sim_actors: Literal["rank", "node"] = "rank"
    """launch.runner=sim: 'rank' simulates every actor rank as the other runners run it; 'node' runs the actor
    ranks of each simulated node as one role in lockstep, one batched sampler, no trajectory files (jobs of
    hundreds of nodes on one core: docs/sim.md says what it changes; refuses actors.on_policy and
    actors.weight_sync=aaps, and cannot be resumed)."""
    mpiexec: str = "mpiexec"
    """MPI launcher for local runs (the one next to the Python interpreter is preferred)."""
    mpiexec_args: list[str] = Field(default_factory=list)
    """Extra arguments for the local MPI launcher (placed before the rank command)."""
    container: ContainerConfig | None = None
    """Run each rank inside this container (None: on the host)."""
    timeout_seconds: float | None = Field(None, gt=0)
    """Kill the job if it runs longer than this (local runs)."""
    watchdog_warn_seconds: float = Field(300.0, gt=0)
    """A rank whose loop has shown no sign of life for this long is named in a warning."""
    watchdog_seconds: float = Field(1800.0, gt=0)
    """... and after this long the job ends, naming the rank (raise it for solvers slower per step)."""
    startup_seconds: float = Field(600.0, gt=0)
    """Runner mpi: the ranks must report their first progress this long after mpiexec starts, or the
    launcher ends the job (a rank stuck starting: a hung file system, a stopped process)."""
    ranks_per_core: float = Field(4.0, gt=0)
    """A local run (hpcrl run without a scheduler) with more ranks or roles than this many per core is
    refused; `hpcrl run --oversubscribe` lifts the limit."""
    prestart: bool = True
    """Local MPI runs without a container: the ranks are forked from one process that imported torch, h5py,
    gymnasium and mpi4py once (hpcrl.runtime.runners.prestart), instead of each importing them; false: each imports."""
    node_weight_cache: Literal["auto", "on", "off"] = "auto"
    """Runner mpi: a node's actors read the weight board through one shared-memory copy per node, fetched once per
    version from rank 0 (runtime/transport/node_cache.py); auto: when some node holds more than one actor."""
    weight_tree: int = Field(0, ge=0)
    """The node caches fetch through a tree (runtime/transport/weight_tree.py): k >= 2, rank 0 serves each version
    to k nodes and each of those nodes to k more, so rank 0's link carries k copies of a version, not one per node;
    0: every node fetches from rank 0. Needs the node caches (node_weight_cache auto or on: the tree turns them on)."""
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    """Where the parameter rank, the learner groups and the actors go across nodes (docs/sites.md, "Placement")."""
    actor_nice: int = Field(10, ge=0, le=19)
    """Runner mpi: actor ranks lower their scheduling priority by this much (nice). Where ranks outnumber cores, the learner and parameter ranks that every gradient waits on then get a core first (default job, 4 ranks on 2 cores: +8 % env steps/s); actors wait on back-pressure anyway, and where every rank has a core nothing changes. 0: off."""

    @field_validator("node_weight_cache", mode="before")
    @classmethod
    def _on_off_as_yaml_reads_them(cls, value):
        # YAML 1.1 (a config file, or -o launch.node_weight_cache=off) reads a bare on/off as a boolean
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _warning_before_the_end(self) -> "LaunchConfig":
        if self.watchdog_warn_seconds >= self.watchdog_seconds:
            raise ValueError(f"launch.watchdog_warn_seconds={self.watchdog_warn_seconds:g} is not below "
                             f"launch.watchdog_seconds={self.watchdog_seconds:g}: the warning would never come before "
                             "the job ends; lower watchdog_warn_seconds")
        if self.weight_tree == 1:
            raise ValueError("launch.weight_tree=1 would chain the nodes one behind another; allowed: 0 (off) or a "
                             "fanout of 2 or more")
        if self.weight_tree and self.node_weight_cache == "off":
            raise ValueError(f"launch.weight_tree={self.weight_tree} needs the node caches it connects; "
                             "set launch.node_weight_cache to auto or on, or launch.weight_tree to 0")
        return self


class StopConfig(Section):
    total_env_steps: int = Field(500_000, ge=1)
    """Stop once the actors have sampled this many environment steps."""
    target_return: float | None = None
    """Stop early once the mean return of the last return_window episodes reaches this."""
    return_window: int = Field(20, ge=1)
    """Episodes averaged for target_return (and for the reported mean return)."""
    max_wall_seconds: float | None = Field(None, gt=0)
    """Stop after this many seconds of training (summed over resumed jobs)."""
    max_rounds: int | None = Field(None, ge=1)
    """Stop once this many rounds have ended (MARLess compares runs at equal rounds; not the fused batched loop)."""


class EvalConfig(Section):
    """Evaluation episodes: the policy acting greedily on env copies of its own, recorded apart from training."""

    episodes: int = Field(0, ge=0)
    """Episodes per evaluation (0: no evaluation). The last actor rank runs them, between two fragments."""
    every_rounds: int = Field(10, ge=1)
    """Evaluate the newest policy after every this many training rounds."""
    seed: int = 1_000_000
    """Seed of the evaluation env copies: evaluation k resets copy i with seed + k * episodes + i."""


class DebugConfig(Section):
    """Fault injection for tests of the failure path (not needed in normal runs)."""

    raise_on_rank: int | None = Field(None, ge=0)
    """World rank that raises RuntimeError on purpose, to check that the whole job aborts."""
    raise_after_seconds: float = Field(0.0, ge=0)
    """Seconds into its role loop after which that rank raises."""
    learner_delay_seconds: float = Field(0.0, ge=0)
    """Every learner group sleeps this long per gradient (slow learners, e.g. to test elasticity)."""
    learner_delay_until_seconds: float | None = Field(None, ge=0)
    """The learner delay ends this many seconds after the group's first gradient (None: never)."""
    active_groups: list[int] | None = None
    """Learner-group activation without the elastic rule: after round k, groups 0 .. entry min(k, len - 1) - 1 are
    active and the others park (values clipped to learners.min_active .. max_active; tests of parking and joining)."""
    slow_actor: int | None = Field(None, ge=0)
    """Actor index that sleeps ``slow_actor_seconds`` before each fragment (one actor slower than the others)."""
    slow_actor_seconds: float = Field(0.0, ge=0)
    """How long ``slow_actor`` sleeps before each fragment."""
    active_actors: list[int] | None = None
    """Actor parking without an algorithm's demand: after round k, actor ranks 0 .. entry min(k, len - 1) - 1
    sample and the others park (overrides algo.actor_scaling's count; values clipped to 1 .. actors.count)."""


class RunConfig(Section):
    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    """Run name: letters, digits, '.', '_', '-' (it becomes part of paths and job names)."""
    env: EnvConfig = Field(default_factory=EnvConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    actors: ActorsConfig = Field(default_factory=ActorsConfig)
    learners: LearnersConfig = Field(default_factory=LearnersConfig)
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    algo: AlgoConfig = Field(default_factory=PPOConfig)
    io: IOConfig = Field(default_factory=IOConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    stop: StopConfig = Field(default_factory=StopConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    debug: DebugConfig = Field(default_factory=DebugConfig)

    @model_validator(mode="before")
    @classmethod
    def _algo_defaults_to_ppo(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("algo"), dict) and "name" not in data["algo"]:
            data = {**data, "algo": {"name": "ppo", **data["algo"]}}
        return data

    @model_validator(mode="after")
    def _algo_settings_the_run_decides(self) -> "RunConfig":
        self.algo.resolve(self)
        return self

    @model_validator(mode="after")
    def _fields_the_admission_policy_reads(self) -> "RunConfig":
        from hpcrl.staleness import POLICY_FIELDS

        agg = self.aggregation
        for name in dict.fromkeys(f for fields in POLICY_FIELDS.values() for f in fields):  # in declaration order
            if name not in POLICY_FIELDS[agg.policy] and getattr(agg, name) != AggregationConfig.model_fields[name].default:
                users = [p for p, used in POLICY_FIELDS.items() if name in used]
                raise ValueError(f"aggregation.{name}={getattr(agg, name)!r} does nothing under aggregation.policy="
                                 f"{agg.policy}; it is read by {', '.join(users)} (remove it or pick one of those)")
        return self

    @model_validator(mode="after")
    def _what_an_update_push_needs(self) -> "RunConfig":
        outer = {f: getattr(self.aggregation, f) for f in ("outer_lr", "outer_momentum", "outer_nesterov")}
        if self.learners.push == "gradient":
            changed = [f"aggregation.{f}" for f, v in outer.items() if v != AggregationConfig.model_fields[f].default]
            if changed:
                raise ValueError(f"{changed[0]} is read only with learners.push=update (this run pushes gradients)")
            return self
        if self.algo.round_regime != "batch" or self.algo.routing() != "own_group":
            raise ValueError(f"learners.push=update: algo {self.algo.name} has no batch of its own per learner group "
                             "(allowed: an algorithm whose groups each train their own batch, e.g. ppo)")
        return self

    @model_validator(mode="after")
    def _what_an_allreduce_needs(self) -> "RunConfig":
        if self.learners.topology != "allreduce":
            return self
        agg = self.aggregation
        self._refuse("learners.topology=allreduce", [
            (f"aggregation.policy={agg.policy} admits pushes on a parameter rank; the allreduce is synchronous",
             "aggregation.policy=sync", agg.policy != "sync"),
            (f"learners.push={self.learners.push} is the parameter rank's mode", "learners.push=gradient (the default)",
             self.learners.push != "gradient"),
            (f"aggregation.shards={agg.shards} shards a parameter rank the allreduce does not have",
             "aggregation.shards=1", agg.shards != 1),
            *self._what_groups_in_step_cannot_have("the allreduce", "in the allreduce", "a parameter rank's steps")])
        return self

    @model_validator(mode="after")
    def _what_node_combine_needs(self) -> "RunConfig":
        if self.learners.combine != "node":
            return self
        agg = self.aggregation
        self._refuse("learners.combine=node", [
            (f"aggregation.policy={agg.policy} admits each group's push on its own; a node's combined push is "
             "admitted whole", "aggregation.policy=sync", agg.policy != "sync"),
            ("learners.topology=allreduce has no pushes to combine", "learners.topology=server",
             self.learners.topology != "server"),
            (f"launch.runner={self.launch.runner} runs every group in one process, on no node of its own",
             "launch.runner=mpi or sim", self.launch.runner == "serial"),
            *self._what_groups_in_step_cannot_have("their node's push", "on a node of the job's", "each push's step")])
        return self

    def _what_groups_in_step_cannot_have(self, waiting: str, joined: str, probed: str) -> list[tuple[str, str, bool]]:
        """(what, what is allowed, whether this config has it) for a mode whose groups wait for each other (the
        allreduce, node combine): parked groups, ranks that join, AAPS' probe, an algorithm without a batch per
        group."""
        learners = self.learners
        return [
            (f"learners.min_active={learners.min_active} would park groups {waiting} waits for",
             f"learners.min_active={learners.groups} (= learners.groups)", learners.min_active != learners.groups),
            (f"ranks that join (learners.elastic, actors.elastic) are not {joined}",
             "learners.elastic=park and actors.elastic=park", learners.elastic != "park" or self.actors.elastic != "park"),
            (f"actors.weight_sync={self.actors.weight_sync} probes {probed}", "actors.weight_sync=every_fragment",
             self.actors.weight_sync == "aaps"),
            (f"algo {self.algo.name} has no batch of its own per learner group",
             "an algorithm whose groups each train their own batch, e.g. ppo",
             self.algo.round_regime != "batch" or self.algo.routing() != "own_group")]

    @staticmethod
    def _refuse(setting: str, checks: list[tuple[str, str, bool]]) -> None:
        """ValueError naming the first check this config fails (one line: what, and what is allowed)."""
        refused = [(what, allowed) for what, allowed, on in checks if on]
        if refused:
            raise ValueError(f"{setting}: {refused[0][0]} (allowed: {refused[0][1]})")

    @model_validator(mode="after")
    def _what_joining_groups_need(self) -> "RunConfig":
        learners = self.learners
        if learners.elastic == "park":
            return self
        if learners.ranks_per_group < 2:
            raise ValueError(f"learners.elastic={learners.elastic} needs learners.ranks_per_group of 2 or more (the "
                             "group's root stays in the job, its other ranks join while the group is active)")
        if self.launch.runner != "mpi" or learners.allreduce != "auto":
            raise ValueError(f"learners.elastic={learners.elastic} needs launch.runner=mpi and learners.allreduce=auto "
                             f"(ranks join "
                             f"through MPI ports); got launch.runner={self.launch.runner}, "
                             f"learners.allreduce={learners.allreduce}")
        return self

    @model_validator(mode="after")
    def _a_simulated_job_fits_its_profile(self) -> "RunConfig":
        if self.launch.runner != "sim":
            if self.launch.sim_actors != "rank":
                raise ValueError(f"launch.sim_actors={self.launch.sim_actors} needs launch.runner=sim "
                                 f"(got launch.runner={self.launch.runner})")
            return self
        if self.launch.sim_actors == "node":
            refused = [what for what, on in (("actors.on_policy=true", self.actors.on_policy),
                                             ("actors.weight_sync=aaps", self.actors.weight_sync == "aaps")) if on]
            if refused:
                raise ValueError(f"launch.sim_actors=node runs a node's actor ranks in lockstep, which does not "
                                 f"simulate {', '.join(refused)} (use launch.sim_actors=rank)")
        if self.learners.ranks_per_group > 1:
            raise ValueError(f"launch.runner=sim simulates learner groups of one rank; got learners.ranks_per_group="
                             f"{self.learners.ranks_per_group} (use 1, or launch.runner=serial/mpi)")
        from hpcrl.cluster_profiles import ProfileError, load_profile, place

        try:
            place(load_profile(self.launch.profile), self.learners.groups, self.actors.count, self.env.id)
        except ProfileError as exc:
            raise ValueError(str(exc)) from None
        return self

    @model_validator(mode="after")
    def _what_parameter_shards_need(self) -> "RunConfig":
        S = self.aggregation.shards
        refused = [(why, allowed) for why, allowed, on in (
            (f"launch.runner={self.launch.runner} runs one parameter role", "launch.runner=mpi",
             self.launch.runner != "mpi"),
            ("actors.weight_sync=aaps needs the whole model's probe outputs on one rank", "actors.weight_sync=every_fragment",
             self.actors.weight_sync == "aaps"),
            ("ranks that join (learners.elastic, actors.elastic) reach rank 0's windows only",
             "learners.elastic=park and actors.elastic=park",
             self.learners.elastic != "park" or self.actors.elastic != "park"),
            (f"launch.placement.roles={self.launch.placement.roles} places one parameter rank",
             "launch.placement.roles=in_launch_order",
             self.launch.placement.roles != "in_launch_order")) if on]
        if S > 1 and refused:
            raise ValueError(f"aggregation.shards={S}: {refused[0][0]} (allowed: {refused[0][1]}, or "
                             "aggregation.shards=1)")
        return self

    @model_validator(mode="after")
    def _what_node_reports_need(self) -> "RunConfig":
        if self.actors.reports != "fragment" and self.launch.runner == "serial":
            raise ValueError(f"actors.reports={self.actors.reports}: launch.runner=serial runs every actor in one "
                             "process on no node (nothing to batch reports on); allowed: launch.runner=mpi or sim, or "
                             "actors.reports=fragment")
        if self.launch.weight_tree and self.launch.runner == "serial":
            raise ValueError(f"launch.weight_tree={self.launch.weight_tree}: launch.runner=serial runs every actor in "
                             "one process on no node (no node fetches to connect); allowed: launch.runner=mpi or sim, "
                             "or launch.weight_tree=0")
        return self

    @model_validator(mode="after")
    def _what_joining_actors_need(self) -> "RunConfig":
        if self.actors.elastic != "park" and self.launch.runner != "mpi":
            raise ValueError(f"actors.elastic={self.actors.elastic} needs launch.runner=mpi (samplers join through "
                             f"MPI ports); got launch.runner={self.launch.runner}")
        return self

    @model_validator(mode="after")
    def _ppo_batch_sizes(self) -> "RunConfig":
        self.algo.check_run(self)
        if self.algo.round_regime != "batch":
            return self
        from hpcrl.runtime.plan import batch_sizes

        per_group = batch_sizes(self)[2]
        if self.algo.minibatch_size > per_group:
            raise ValueError(
                f"algo.minibatch_size={self.algo.minibatch_size} exceeds the per-group batch "
                f"algo.train_batch_size / learners.groups = {per_group}")
        if self.algo.minibatch_size < self.learners.ranks_per_group:
            raise ValueError(
                f"algo.minibatch_size={self.algo.minibatch_size} is smaller than learners.ranks_per_group="
                f"{self.learners.ranks_per_group} (each learner rank needs a share)")
        return self

    @property
    def uses_mpi(self) -> bool:
        """True when ``hpcrl run`` starts MPI ranks (launch.runner: mpi)."""
        return self.launch.runner == "mpi"

    @property
    def num_ranks(self) -> int:
        """S parameter ranks (aggregation.shards) + G x L learner ranks (G roots with learners.elastic=steps) + actor
        ranks."""
        return self.aggregation.shards + self.learners.groups * self.learners.launched_ranks_per_group + self.actors.count

    def actors_for(self, ranks: int, what: str = "--ranks") -> int:
        """The actor count of a job of ``ranks`` ranks: the ranks beyond the parameter and learner ranks
        (ValueError, one line, when there are too few)."""
        learner_ranks = self.learners.groups * self.learners.launched_ranks_per_group
        S = self.aggregation.shards
        if ranks - S - learner_ranks < 1:
            raise ValueError(f"{what} {ranks}: too few; this config needs {S} parameter (aggregation.shards) + "
                             f"{learner_ranks} learner ranks + at least 1 actor = {S + learner_ranks + 1}")
        return ranks - S - learner_ranks

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _one_line(exc: ValidationError, source: str, overrides: dict[str, str] | None = None) -> str:
    """The first validation error in one line, blamed on the ``-o KEY=VALUE`` that set its key (``overrides``:
    dotted key -> the override's text) or else on ``source``."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    parts = [str(p) for p in err["loc"]]
    algo_tag = parts[1] if len(parts) > 1 and parts[0] == "algo" and parts[1] in ALGO_NAMES else None
    # discriminated unions put the tag in the location: algo.ppo.lr -> algo.lr
    for tag in ALGO_NAMES:
        loc = loc.replace(f"algo.{tag}.", "algo.").replace(f"algo.{tag}", "algo")
    for key, text in (overrides or {}).items():
        if loc == key or loc.startswith(key + "."):
            source = f"-o {text}"
        elif loc and key.startswith(loc + ".") and not source.startswith("-o"):  # a check of the whole section
            source = f"{source} with -o {text}"
    if err["type"] == "extra_forbidden":
        parent = loc.rsplit(".", 1)[0] if "." in loc else ""
        where = f" in {parent}" + (f" (algo.name={algo_tag})" if parent == "algo" and algo_tag else "")
        return f"{source}: unknown key '{loc}'; allowed keys{where if parent else ''}: {_allowed_keys(parent, algo_tag)}"
    if err["type"] == "union_tag_invalid":
        return f"{source}: algo.name: {err['msg']}"
    msg = err["msg"].removeprefix("Value error, ")
    if isinstance(err.get("input"), dict) or not loc:  # a check across a section's fields names them itself
        return f"{source}: {msg}"
    return f"{source}: {loc}: {msg} (got {err.get('input')!r})"


def _allowed_keys(dotted: str, algo_tag: str | None = None) -> str:
    """The fields of the section ``dotted`` names (algo: those of the algorithm ``algo_tag``)."""
    if dotted == "algo" and algo_tag:
        return ", ".join(next(c for c in ALGO_CONFIGS if c.model_fields["name"].default == algo_tag).model_fields)
    model: Any = RunConfig
    for part in [p for p in dotted.split(".") if p]:
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None)
        if ann is None or not isinstance(ann, type) or not issubclass(ann, BaseModel):
            return "see docs/config.md"
        model = ann
    return ", ".join(model.model_fields)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'aggregation.d=0.9' -> (['aggregation', 'd'], 0.9); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. aggregation.d=0.9")
    key, _, value = text.partition("=")
    return key.strip().split("."), yaml.load(value, Loader=_UniqueKeyLoader)


def build_config(data: dict[str, Any] | None = None, overrides: list[str] = (), source: str = "config") -> RunConfig:
    data = dict(data or {})
    set_by: dict[str, str] = {}  # dotted key -> the override that set it (the one to blame for a bad value)
    for item in overrides:
        path, value = parse_override(item)
        set_by[".".join(path)] = item
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        node[path[-1]] = value
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, source, set_by)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


# YAML 1.1 (PyYAML) reads 1e-3 as a string; YAML 1.2 and every user read it as a number.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML config (None: the embedded default, CartPole-v1 on 4 ranks) and apply KEY=VALUE overrides."""
    if path is None:
        path = Path(__file__).parent / "configs" / "cartpole.yaml"
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); save the config as UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        raise ConfigError(f"{path}: the file is empty; give at least one section (env, actors, learners, ...), "
                          "or run `hpcrl run` without CONFIG for the default job")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (env, actors, learners, ...), got {type(data).__name__}")
    return build_config(data, overrides, source=str(path))
