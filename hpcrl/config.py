"""One typed config tree for every hpcrl run, loaded from YAML.

Each component receives its own section (``cfg.actors``, ``cfg.aggregation``...), never the
whole tree. Derived sizes (rank count, per-group batch) are computed here and nowhere else.
Every bad value becomes one :class:`hpcrl.errors.ConfigError` line naming the field.
"""
from __future__ import annotations

import re

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpcrl.errors import ConfigError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True, strict=True,
                              allow_inf_nan=False)


class EnvConfig(Section):
    id: str = "CartPole-v1"
    """Environment id: a Gymnasium id or one registered by hpcrl.envs."""
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
    """Sample each fragment with the weights the learners finished the previous batch with (no policy lag, as single-process PPO): an actor reserves a place in a group's backlog, then pulls weights and samples; the group frees the places after training the batch. Off: actors sample the next batch while the learners train (pipelined, one batch of lag)."""
    weight_sync: Literal["every_fragment", "aaps"] = "every_fragment"
    """When an actor pulls new weights: before every fragment, or by AAPS (KL on a probe batch > aaps_delta)."""
    aaps_delta: float = Field(0.01, gt=0)
    """AAPS KL threshold (ClusterEnv sweeps 0.001 ... 1.0)."""
    probe_batch: int = Field(64, ge=1)
    """States in the AAPS probe batch the parameter rank evaluates next to each published version."""


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
    """Hysteresis of the elastic rule (runtime/elastic.py): one more group is activated when the actors'
    sampling rate exceeds the active groups' measured capacity by this fraction (and fragments wait), one is
    parked when the other active groups would still run below 1 - this fraction of their capacity."""
    elastic_seconds: float = Field(2.0, gt=0)
    """Seconds of rate measurements behind each elastic decision, and the least time between two changes."""
    allreduce: Literal["auto", "horovod"] = "auto"
    """How a learner group of several ranks averages its gradients: auto = NCCL (torch.distributed) for CUDA
    learners with a GPU each, else MPI Allreduce; horovod = Horovod's allreduce (horovod must be installed)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where learners compute (and, for ha2c/hddpg, where the batched envs and the whole loop run):
    auto = the GPU given by the node-local rank when CUDA is available, else the CPU."""
    cuda_graphs: bool = True
    """On a CUDA learner, replay each minibatch gradient from a CUDA graph (runtime/cuda_graph.py) when the
    algorithm offers one (PPO) and no IS window is used: small networks are bound by kernel launches."""
    overlap_push: bool = False
    """With CUDA graphs: push each minibatch gradient while the GPU computes the next one, so the next one's
    weights lack the gradient just pushed (staleness at least 1): about 1.1x the gradients/s, more env steps
    to a target (docs/results/runtime.md). Not under sync admission (lockstep)."""

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


class AlgoSection(Section):
    """Base of every algorithm's config: the facts it declares for the runtime's Plan (hpcrl.runtime.plan)."""

    round_regime: ClassVar[str] = "fragment"
    """batch: a round is algo.train_batch_size env steps, split over the learner groups; fragment: a round is one
    fragment of every actor, and a learner group trains each fragment it gets."""

    def instances_per_copy(self) -> int:
        """Instances in one env copy (a fragment's steps are fragment_length x num_envs x this)."""
        return 1

    def routing(self) -> str:
        """Where actors send fragments: own_group, every_group or postprocess_first (hpcrl.runtime.plan)."""
        return "own_group"

    def lr_schedule(self, horizon_steps: int):
        """The rate rank 0 sets before each step (hpcrl.algos.schedules), or None: the optimiser's constant lr."""
        return None

    def reward_discount(self) -> float:
        """The discount of the return whose std normalises rewards (env.normalize_reward)."""
        return self.gamma


class PPOConfig(AlgoSection):
    name: Literal["ppo"] = "ppo"
    """PPO with Stellaris' IS truncation (runs on the runtime's roles, either runner)."""
    lr: float = Field(3e-4, gt=0)
    """Base learning rate alpha_0 (Stellaris Eq. 4 scales it per gradient)."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """GAE lambda."""
    clip: float = Field(0.2, gt=0)
    """Clip range of the PPO surrogate ratio (1 +- clip)."""
    kl_coeff: float = Field(0.0, ge=0)
    """Initial KL penalty coefficient; > 0 turns on RLlib's adaptive rule (x1.5 / x0.5 per round)."""
    kl_target: float = Field(0.01, gt=0)
    """Target KL for the adaptive coefficient."""
    entropy_coeff: float = Field(0.0, ge=0)
    """Weight of the entropy bonus."""
    vf_coeff: float = Field(0.5, ge=0)
    """Weight of the value loss."""
    max_grad_norm: float = Field(0.5, gt=0)
    """Each minibatch gradient is clipped to this global norm before it is pushed."""
    normalize_advantages: bool = True
    """Standardise advantages within each minibatch."""
    vf_clip: float | None = Field(None, gt=0)
    """Value clipping: the value loss takes the larger of the errors of V and of V clipped to within this of the acting policy's value (CleanRL's clip_vloss uses the surrogate's clip); null: plain squared error."""
    train_batch_size: int = Field(4096, ge=1)
    """Environment steps that make one round (Stellaris/RLlib training iteration)."""
    minibatch_size: int = Field(512, ge=1)
    """Rows per minibatch; one gradient push each."""
    num_sgd_iter: int = Field(4, ge=1)
    """Passes over each learner batch."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Optimizer on the parameter rank."""
    lr_anneal: bool = False
    """Anneal the learning rate linearly from lr to 0 over lr_anneal_steps (CleanRL's PPO); the parameter rank sets it before each step from the env steps the learners have consumed."""
    lr_anneal_steps: int | None = Field(None, ge=1)
    """Env steps over which lr_anneal takes the rate to 0; null: the run's stop.total_env_steps, written into the run's config.yaml, so a resume that changes the budget keeps the schedule."""

    round_regime: ClassVar[str] = "batch"

    def lr_schedule(self, horizon_steps: int):
        from hpcrl.algos.schedules import LinearAnneal

        return LinearAnneal(self.lr, self.lr_anneal_steps or horizon_steps) if self.lr_anneal else None


class HA2CConfig(AlgoSection):
    """Seed 003, Algorithm 1: A2C over N batched environments, one update per rollout."""

    name: Literal["ha2c"] = "ha2c"
    """HA2C (batched envs, one process, learners.device)."""
    lr: float = Field(1e-3, gt=0)
    """Adam learning rate."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """GAE lambda (1: the discounted returns of Algorithm 1)."""
    entropy_coeff: float = Field(0.01, ge=0)
    """Weight of the entropy bonus."""
    vf_coeff: float = Field(0.5, ge=0)
    """Weight of the value loss."""
    max_grad_norm: float = Field(0.5, gt=0)
    """Gradient norm clip."""
    normalize_advantages: bool = True
    """Scale the batch's advantages to zero mean and unit variance before the policy gradient."""
    stats_every: int = Field(10, ge=1)
    """Fused loop: iterations between fetches of episode statistics and losses from the device (none in between)."""


class HDDPGConfig(AlgoSection):
    """Seed 003, Algorithm 2: DDPG on an on-policy FIFO buffer, n-step returns, no replay."""

    name: Literal["hddpg"] = "hddpg"
    """HDDPG (batched envs, one process, learners.device)."""
    n_step: int = Field(4, ge=1)
    """n of the n-step returns."""
    actor_lr: float = Field(1e-3, gt=0)
    """Adam learning rate of the actor mu."""
    critic_lr: float = Field(1e-3, gt=0)
    """Adam learning rate of the critic Q."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    tau: float = Field(0.005, gt=0, le=1)
    """Soft target update rate."""
    exploration_noise: float = Field(0.1, ge=0)
    """Gaussian action noise, as a fraction of half the action range."""
    buffer_rollouts: int = Field(2, ge=1)
    """Fragments held in the fused loop's FIFO buffer (current policy's data only); on the roles each
    fragment is trained on once."""
    minibatch_envs: int | None = Field(None, ge=1)
    """Instances whose buffered steps make one update (drawn at random each time); None: all of them."""
    critic_hidden_sizes: list[Annotated[int, Field(ge=1)]] | None = None
    """Hidden widths of the critic Q(s, a) (None: model.hidden_sizes); the actor uses model.hidden_sizes."""
    stats_every: int = Field(10, ge=1)
    """Fused loop: iterations between fetches of episode statistics and losses from the device (none in between)."""


class IMPACTConfig(AlgoSection):
    """IMPACT (Luo et al. 2020) as Stellaris trains it; defaults from Stellaris Table III. One learner batch is
    one actor fragment (reused num_sgd_iter times); a round is one fragment of every actor."""

    name: Literal["impact"] = "impact"
    """IMPACT: V-trace targets, a target network, a clipped surrogate against it (runs on the roles, either runner)."""
    lr: float = Field(5e-4, gt=0)
    """Base learning rate alpha_0 (Stellaris Eq. 4 scales it per gradient)."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    clip: float = Field(0.4, gt=0)
    """Clip range of the ratio pi / pi_target in the surrogate (1 +- clip)."""
    kl_coeff: float = Field(1.0, ge=0)
    """Initial weight of KL(pi_target || pi); > 0 turns on RLlib's adaptive rule (x1.5 / x0.5 per round)."""
    kl_target: float = Field(0.01, gt=0)
    """Target KL for the adaptive coefficient."""
    entropy_coeff: float = Field(0.01, ge=0)
    """Weight of the entropy bonus."""
    vf_coeff: float = Field(1.0, ge=0)
    """Weight of the value loss (V-trace targets)."""
    target_update_frequency: int = Field(1, ge=1)
    """Rounds between copies of the policy into the target network."""
    vtrace_rho_bar: float = Field(1.0, gt=0)
    """V-trace truncation of pi_target / mu in the value targets and the policy-gradient advantages."""
    vtrace_c_bar: float = Field(1.0, gt=0)
    """V-trace truncation of the trace coefficients c."""
    max_grad_norm: float = Field(40.0, gt=0)
    """Each minibatch gradient is clipped to this global norm before it is pushed (RLlib IMPALA's grad_clip)."""
    normalize_advantages: bool = False
    """Standardise the V-trace advantages within each minibatch."""
    minibatch_size: int = Field(512, ge=1)
    """Rows per minibatch of a learner batch (a whole fragment when larger); one gradient push each."""
    num_sgd_iter: int = Field(2, ge=1)
    """Passes over each learner batch (IMPACT's circular-buffer reuse)."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Optimizer on the parameter rank."""


class MARLSharingFields(Section):
    """Dynamic learner sharing (MARLess section 4.3; hpcrl.marl.sharing_rank): the agent -> policy map
    changes when the agents' rewards stop rising; each change is a row of run.h5's policy_map table."""

    sharing: bool = False
    """Toggle learner sharing during the run (starts from ``policies``; the model holds one slot per agent)."""
    sharing_window: int = Field(10, ge=2)
    """W: the tolerant window, in rounds of per-agent mean episodic returns (4.3.1)."""
    sharing_gamma: float = 0.1
    """Toggle when the window is full and the slope of the min-max normalised global reward is below this
    (a linear rise over the window has slope 1 / (W - 1); the seed uses 0.1 for MPE)."""
    sharing_samples_per_agent: int = Field(128, ge=3)
    """(observation, action) rows per agent a learner reports per batch for the KDE similarity (4.3.2)."""
    sharing_components: int = Field(3, ge=1)
    """PCA components the samples are compressed to before the KDE (4.3.2)."""
    sharing_lanczos_steps: int = Field(20, ge=2)
    """Lanczos steps on Hessian-vector products for a policy's convexity ratio (4.3.4, Eq. 1)."""


class MARLScalingFields(Section):
    """Cost-aware actor scaling (MARLess section 4.4, Eq. 2; hpcrl.marl.scaling_rank): each round the
    parameter rank turns every policy's window of convexity ratios into an actor demand and sets how many
    actor ranks sample the next round; the others park (block, uncharged). Rows in run.h5's actor_scaling."""

    actor_scaling: bool = False
    """Scale the active actor ranks each round (the window is sharing_window rounds, as the seed reuses it)."""
    actor_scaling_beta: float = Field(0.5, gt=0, le=1)
    """beta of Eq. 2: the total is the largest policy demand when the average demand >= beta (I_max - I_min),
    else the average (the seed uses 0.5)."""
    actor_scaling_max: int | None = Field(None, ge=1)
    """I_max, the most active actors (default and upper bound: actors.count; the seed uses 50)."""
    actor_scaling_min: int | None = Field(None, ge=1)
    """I_min, the fewest active actors (default: I_max / agents rounded up, as the seed's section 6.1)."""


class MARLAgents(AlgoSection):
    """What every MARL algorithm's config declares for the Plan: an env copy's agents are its instances, and
    policy (and post-processing) learners route the fragments."""

    def instances_per_copy(self) -> int:
        return self.agents

    def routing(self) -> str:
        if not getattr(self, "policy_learners", False):
            return "own_group"
        return "postprocess_first" if getattr(self, "postprocess_learner", False) else "every_group"


class MARLPPOFields(MARLAgents):
    """MARLess' actor-critic learners (seed 001, section 6.2.1): PPO per policy with GAE and the clipped
    surrogate; the policies of the agents are the sub-networks of one model (hpcrl.marl.model)."""

    round_regime: ClassVar[str] = "batch"

    agents: int = Field(ge=1)
    """Agents per env copy (must equal the env's number of agents; instance k * agents + j is agent j)."""
    policies: Literal["per_agent", "shared"] = "per_agent"
    """per_agent: one policy (and critic) per agent; shared: one for all (parameter sharing)."""
    lr: float = Field(5e-4, gt=0)
    """Adam learning rate (fixed, as MARLess)."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """GAE lambda."""
    clip: float = Field(0.2, gt=0)
    """Clip range of the surrogate ratio (1 +- clip)."""
    entropy_coeff: float = Field(0.01, ge=0)
    """Weight of the entropy bonus."""
    vf_coeff: float = Field(0.5, ge=0)
    """Weight of the value loss."""
    max_grad_norm: float = Field(0.5, gt=0)
    """Each minibatch gradient is clipped to this global norm before it is pushed."""
    normalize_advantages: bool = True
    """Standardise advantages within each minibatch."""
    train_batch_size: int = Field(4800, ge=1)
    """Agent steps (all agents' instances) that make one round."""
    minibatch_size: int = Field(1200, ge=1)
    """Rows (agent steps) per minibatch; one gradient push each."""
    num_sgd_iter: int = Field(4, ge=1)
    """Passes over each learner batch."""
    policy_learners: bool = False
    """MARLess' policy learners (section 4.2): learner group g trains only the policies assigned to it (the
    distinct policies of the current agent -> policy map, the k-th to group k mod active) on every fragment,
    which actors send to every active group; one group per policy is active (at most learners.groups), so
    the groups that merged policies no longer fill park, and their time is not charged. Needs
    learners.groups >= 2 and sets the active groups itself (no elastic rule)."""
    critic_learners: bool = False
    """With policy_learners: each policy's critic trains in a critic learner group of its own (MARLess'
    critic learners): half of the active groups (the odd one to policies) train policy networks, the others
    critics, each kind dealt out in turn; one group per policy network and per critic is active."""
    postprocess_learner: bool = False
    """With policy_learners: learner group 0 is MARLess' post-processing learner (section 4.2): actors send
    every fragment to it alone, it computes the batch's returns and advantages (MAPPO: the critics' joint
    observations too) with the newest weights and sends the prepared batch to every active policy and
    critic group (groups 1...), which train on it. It computes no gradient; its seconds are charged as a
    learner's. Needs learners.groups >= 2."""


class IPPOConfig(MARLScalingFields, MARLSharingFields, MARLPPOFields):
    name: Literal["ippo"] = "ippo"
    """IPPO: independent PPO learners, each critic sees its agent's observation."""


class MAPPOConfig(MARLScalingFields, MARLSharingFields, MARLPPOFields):
    name: Literal["mappo"] = "mappo"
    """MAPPO: PPO policies with centralised critics over the joint observation of the env copy (+ agent id)."""


class MARLQFields(MARLAgents):
    """MARLess' value-based learners (seed 001, section 6.2.1): DQN per policy with a replay buffer on the
    learner side, target networks in the published weights and an epsilon-greedy schedule."""

    agents: int = Field(ge=1)
    """Agents per env copy (must equal the env's number of agents; instance k * agents + j is agent j)."""
    policies: Literal["per_agent", "shared"] = "per_agent"
    """per_agent: one Q-network per agent; shared: one for all (parameter sharing)."""
    lr: float = Field(5e-4, gt=0)
    """Adam learning rate (fixed, as MARLess)."""
    gamma: float = Field(0.99, gt=0, le=1)
    """Discount factor."""
    buffer_size: int = Field(50_000, ge=1)
    """Replay capacity of each learner group, in joint transitions (one env copy, one step)."""
    batch_size: int = Field(128, ge=1)
    """Joint transitions per minibatch."""
    updates_per_fragment: int = Field(4, ge=1)
    """Minibatches (gradient pushes) drawn from the replay buffer for each fragment received."""
    policy_learners: bool = False
    """IQL only: MARLess' policy learners (section 4.2): learner group g takes the TD errors of the agents
    whose policies are assigned to it (the k-th distinct policy of the map to group k mod active); every
    active group keeps every fragment in its replay; one group per policy is active, so the groups left
    without one park. Needs learners.groups >= 2 (VDN's team TD error couples every agent: refused)."""
    target_tau: float = Field(0.01, gt=0, le=1)
    """Soft update of the target networks after each applied gradient (theta' <- tau theta + (1 - tau) theta')."""
    epsilon_start: float = Field(1.0, ge=0, le=1)
    """Exploration rate at round 0."""
    epsilon_end: float = Field(0.05, ge=0, le=1)
    """Exploration rate after epsilon_decay_rounds rounds."""
    epsilon_decay_rounds: int = Field(50, ge=1)
    """Rounds of the linear decay from epsilon_start to epsilon_end."""
    max_grad_norm: float = Field(10.0, gt=0)
    """Each minibatch gradient is clipped to this global norm before it is pushed."""


class IQLConfig(MARLScalingFields, MARLSharingFields, MARLQFields):
    name: Literal["iql"] = "iql"
    """IQL: independent DQN learners (each agent's own reward and TD loss)."""


class VDNConfig(MARLScalingFields, MARLSharingFields, MARLQFields):
    name: Literal["vdn"] = "vdn"
    """VDN: Q_tot = sum of the agents' Q-values, one TD loss on the team reward (cooperative envs only)."""


ALGO_CONFIGS = (PPOConfig, HA2CConfig, HDDPGConfig, IMPACTConfig, IPPOConfig, MAPPOConfig, IQLConfig, VDNConfig)
ALGO_NAMES = tuple(c.model_fields["name"].default for c in ALGO_CONFIGS)
AlgoConfig = Annotated[Union[ALGO_CONFIGS], Field(discriminator="name")]


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


class ContainerConfig(Section):
    runtime: Literal["apptainer", "podman-hpc", "shifter"] = "apptainer"
    """Container runtime that wraps each rank."""
    image: str
    """Image path (.sif) for apptainer, image name for podman-hpc and shifter."""
    binds: list[str] = Field(default_factory=list)
    """Host paths to bind into the container (src[:dst])."""
    gpu: bool = False
    """Expose GPUs (apptainer --nv, podman-hpc --gpu, shifter --module=mpich,gpu)."""


class LaunchConfig(Section):
    runner: Literal["mpi", "serial"] = "mpi"
    """Where the roles run: 'mpi' (one MPI rank each, started by mpiexec/srun/PALS) or 'serial'
    (all roles in this one process, in-memory transports, no MPI; same record)."""
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
    gymnasium and mpi4py once (hpcrl.runtime.prestart), instead of each importing them; false: each imports."""
    actor_nice: int = Field(10, ge=0, le=19)
    """Runner mpi: actor ranks lower their scheduling priority by this much (nice). Where ranks outnumber cores, the learner and parameter ranks that every gradient waits on then get a core first (default job, 4 ranks on 2 cores: +8 % env steps/s); actors wait on back-pressure anyway, and where every rank has a core nothing changes. 0: off."""


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
    def _lr_anneal_horizon_fixed(self) -> "RunConfig":
        if getattr(self.algo, "lr_anneal", False) and self.algo.lr_anneal_steps is None:
            self.algo.lr_anneal_steps = self.stop.total_env_steps
        return self

    @model_validator(mode="after")
    def _fields_the_admission_policy_reads(self) -> "RunConfig":
        from hpcrl.staleness import POLICY_FIELDS

        agg = self.aggregation
        for name in ("d", "v", "ssp_s", "softsync_c"):
            if name not in POLICY_FIELDS[agg.policy] and getattr(agg, name) != AggregationConfig.model_fields[name].default:
                users = [p for p, used in POLICY_FIELDS.items() if name in used]
                raise ValueError(f"aggregation.{name}={getattr(agg, name)!r} does nothing under aggregation.policy="
                                 f"{agg.policy}; it is read by {', '.join(users)} (remove it or pick one of those)")
        return self

    @model_validator(mode="after")
    def _ppo_batch_sizes(self) -> "RunConfig":
        if self.algo.name == "vdn":
            from hpcrl.envs.mpe import COMPETITIVE

            if self.env.id in COMPETITIVE:
                raise ValueError(f"algo.name: vdn needs a cooperative env; {self.env.id} is competitive "
                                 "(adversary vs agents); use iql, ippo or mappo")
        if getattr(self.algo, "actor_scaling", False):
            lo, hi = self.actor_scaling_range
            if lo > hi:
                raise ValueError(f"algo.actor_scaling_min={lo} exceeds I_max={hi} (algo.actor_scaling_max, at most "
                                 f"actors.count={self.actors.count})")
        if getattr(self.algo, "policy_learners", False):
            if self.algo.name == "vdn":
                raise ValueError("algo.policy_learners: vdn's team TD error couples every agent's Q-value, so one "
                                 "learner must see them all; use iql, ippo or mappo")
            if self.learners.groups < 2:
                raise ValueError("algo.policy_learners: needs learners.groups >= 2 (one group per policy); "
                                 f"got learners.groups={self.learners.groups}")
            if self.actors.on_policy:
                raise ValueError("algo.policy_learners: actors.on_policy is not supported with it; set actors.on_policy=false")
            if getattr(self.algo, "postprocess_learner", False):  # (groups >= 2 is checked above)
                if self.aggregation.policy == "ssp":
                    raise ValueError("algo.postprocess_learner: aggregation.policy ssp keeps a clock per learner group "
                                     "and the post-processing group pushes no gradient; use sync, stellaris, "
                                     "stellaris_code, pure_async or softsync")
        elif getattr(self.algo, "postprocess_learner", False):
            raise ValueError("algo.postprocess_learner: needs algo.policy_learners=true (the post-processing learner "
                             "feeds policy and critic learner groups)")
        elif getattr(self.algo, "critic_learners", False):
            raise ValueError("algo.critic_learners: needs algo.policy_learners=true (critic learners are policy learners' "
                             "other half)")
        if self.algo.round_regime != "batch":
            return self
        from hpcrl.runtime.plan import make_plan

        per_group = make_plan(self).group_batch_size
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
    def actor_scaling_range(self) -> tuple[int, int]:
        """(I_min, I_max) of MARL actor scaling: I_max = algo.actor_scaling_max capped at actors.count (default
        actors.count), I_min = algo.actor_scaling_min (default I_max / agents rounded up, MARLess section 6.1)."""
        from hpcrl.marl.actor_scaling import scaling_bounds

        return scaling_bounds(self.algo.actor_scaling_max, self.algo.actor_scaling_min, self.actors.count,
                              self.algo.agents)

    @property
    def uses_mpi(self) -> bool:
        """True when ``hpcrl run`` starts MPI ranks (launch.runner: mpi)."""
        return self.launch.runner == "mpi"

    @property
    def num_ranks(self) -> int:
        """1 parameter rank + G x L learner ranks + actor ranks."""
        return 1 + self.learners.groups * self.learners.ranks_per_group + self.actors.count

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _one_line(exc: ValidationError, source: str) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    # discriminated unions put the tag in the location: algo.ppo.lr -> algo.lr
    for tag in ALGO_NAMES:
        loc = loc.replace(f"algo.{tag}.", "algo.").replace(f"algo.{tag}", "algo")
    if err["type"] == "extra_forbidden":
        parent = loc.rsplit(".", 1)[0] if "." in loc else ""
        return f"{source}: unknown key '{loc}'; allowed keys{' in ' + parent if parent else ''}: {_allowed_keys(parent)}"
    if err["type"] == "union_tag_invalid":
        return f"{source}: algo.name: {err['msg']}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{source}: {loc}: {msg} (got {err.get('input')!r})" if loc else f"{source}: {msg}"


def _allowed_keys(dotted: str) -> str:
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
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
        node[path[-1]] = value
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, source)) from None


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
