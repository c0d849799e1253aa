"""The MARL algorithms' settings (``algo: {name: ippo | mappo | iql | vdn}``) and what they check of the run.

MARLess (seed 001): the shared fields of learner sharing (4.3) and actor scaling (4.4), the actor-critic
(IPPO, MAPPO) and value-based (IQL, VDN) learners; the algorithms are :mod:`hpcrl.marl.ppo` and
:mod:`hpcrl.marl.dqn`.
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from hpcrl.config_base import AlgoSection, FragmentRounds, LearningRate, Section


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
    """Scale the active actor ranks each round."""
    actor_scaling_window: int = Field(10, ge=2)
    """W of actor scaling: the rounds of convexity ratios behind each policy's demand (the seed reuses its
    sharing window, 10; here each has its own field)."""
    actor_scaling_beta: float = Field(0.5, gt=0, le=1)
    """beta of Eq. 2: the total is the largest policy demand when the average demand >= beta (I_max - I_min),
    else the average (the seed uses 0.5)."""
    actor_scaling_max: int | None = Field(None, ge=1)
    """I_max, the most active actors (default and upper bound: actors.count; the seed uses 50)."""
    actor_scaling_min: int | None = Field(None, ge=1)
    """I_min, the fewest active actors (default: I_max / agents rounded up, as the seed's section 6.1)."""

    def actor_scaling_range(self, actors: int) -> tuple[int, int]:
        """(I_min, I_max) of MARL actor scaling: I_max = algo.actor_scaling_max capped at actors.count (default
        actors.count), I_min = algo.actor_scaling_min (default I_max / agents rounded up, MARLess section 6.1)."""
        from hpcrl.marl.actor_scaling import scaling_bounds

        return scaling_bounds(self.actor_scaling_max, self.actor_scaling_min, actors, self.agents)


class MARLAgents(AlgoSection):
    """What every MARL algorithm's config declares for the Plan: an env copy's agents are its instances, and
    policy (and post-processing) learners route the fragments."""

    def instances_per_copy(self) -> int:
        return self.agents

    def routing(self) -> str:
        if not getattr(self, "policy_learners", False):
            return "own_group"
        return "postprocess_first" if getattr(self, "postprocess_learner", False) else "every_group"

    def check_run(self, run) -> None:
        """MARL settings the rest of the run must allow (one line each)."""
        if self.name == "vdn":
            from hpcrl.envs.mpe import COMPETITIVE

            if run.env.id in COMPETITIVE:
                raise ValueError(f"algo.name: vdn needs a cooperative env; {run.env.id} is competitive "
                                 "(adversary vs agents); use iql, ippo or mappo")
        if getattr(self, "actor_scaling", False):
            lo, hi = self.actor_scaling_range(run.actors.count)
            if lo > hi:
                raise ValueError(f"algo.actor_scaling_min={lo} exceeds I_max={hi} (algo.actor_scaling_max, at most "
                                 f"actors.count={run.actors.count})")
        if getattr(self, "policy_learners", False):
            if self.name == "vdn":
                raise ValueError("algo.policy_learners: vdn's team TD error couples every agent's Q-value, so one "
                                 "learner must see them all; use iql, ippo or mappo")
            if run.learners.groups < 2:
                raise ValueError("algo.policy_learners: needs learners.groups >= 2 (one group per policy); "
                                 f"got learners.groups={run.learners.groups}")
            if run.actors.on_policy:
                raise ValueError("algo.policy_learners: actors.on_policy is not supported with it; set actors.on_policy=false")
            if getattr(self, "postprocess_learner", False):  # (groups >= 2 is checked above)
                if run.aggregation.policy == "ssp":
                    raise ValueError("algo.postprocess_learner: aggregation.policy ssp keeps a clock per learner group "
                                     "and the post-processing group pushes no gradient; use sync, stellaris, "
                                     "stellaris_code, pure_async or softsync")
        elif getattr(self, "postprocess_learner", False):
            raise ValueError("algo.postprocess_learner: needs algo.policy_learners=true (the post-processing learner "
                             "feeds policy and critic learner groups)")
        elif getattr(self, "critic_learners", False):
            raise ValueError("algo.critic_learners: needs algo.policy_learners=true (critic learners are policy learners' "
                             "other half)")


class MARLPPOFields(MARLAgents):
    """MARLess' actor-critic learners (seed 001, section 6.2.1): PPO per policy with GAE and the clipped
    surrogate; the policies of the agents are the sub-networks of one model (hpcrl.marl.model)."""

    round_regime: ClassVar[str] = "batch"

    agents: int = Field(ge=1)
    """Agents per env copy (must equal the env's number of agents; instance k * agents + j is agent j)."""
    policies: Literal["per_agent", "shared"] = "per_agent"
    """per_agent: one policy (and critic) per agent; shared: one for all (parameter sharing)."""
    lr: LearningRate = 5e-4
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

    def gradient_rows(self, fragment_steps: int) -> int:
        return self.minibatch_size


class IPPOConfig(MARLScalingFields, MARLSharingFields, MARLPPOFields):
    name: Literal["ippo"] = "ippo"
    """IPPO: independent PPO learners, each critic sees its agent's observation."""


class MAPPOConfig(MARLScalingFields, MARLSharingFields, MARLPPOFields):
    name: Literal["mappo"] = "mappo"
    """MAPPO: PPO policies with centralised critics over the joint observation of the env copy (+ agent id)."""


class MARLQFields(FragmentRounds, MARLAgents):
    """MARLess' value-based learners (seed 001, section 6.2.1): DQN per policy with a replay buffer on the
    learner side, target networks in the published weights and an epsilon-greedy schedule."""

    agents: int = Field(ge=1)
    """Agents per env copy (must equal the env's number of agents; instance k * agents + j is agent j)."""
    policies: Literal["per_agent", "shared"] = "per_agent"
    """per_agent: one Q-network per agent; shared: one for all (parameter sharing)."""
    lr: LearningRate = 5e-4
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

    def gradient_rows(self, fragment_steps: int) -> int:
        return self.batch_size * self.agents  # a joint transition is a row per agent


class IQLConfig(MARLScalingFields, MARLSharingFields, MARLQFields):
    name: Literal["iql"] = "iql"
    """IQL: independent DQN learners (each agent's own reward and TD loss)."""


class VDNConfig(MARLScalingFields, MARLSharingFields, MARLQFields):
    name: Literal["vdn"] = "vdn"
    """VDN: Q_tot = sum of the agents' Q-values, one TD loss on the team reward (cooperative envs only)."""
