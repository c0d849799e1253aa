"""IPPO and MAPPO (MARLess section 4.2, Fig. 5 (b) and (d); section 6.2.1) against the algorithm contract.

Both are PPO (GAE, clipped surrogate; :mod:`hpcrl.algos.ppo` and :mod:`hpcrl.algos.returns`
hold the maths once) over a :class:`~hpcrl.marl.model.MultiPolicyActorCritic`: each agent acts
with its policy's sub-network and its rows train only that sub-network, so one flat gradient
carries every policy's update. MARLess' decomposition maps onto the roles:

- post-processing (returns and advantages; MAPPO's joint observation for the critic):
  :meth:`prepare` on the learner;
- policy and critic learners: :meth:`compute_gradient`, the policy loss and the value loss of
  each policy's rows (the gradient's blocks are the policies' and critics' own parameters);
- the optimizer of every policy: the parameter rank's Adam (fixed learning rate).

With ``algo.policy_learners`` each learner group trains only the policies assigned to it
(:mod:`hpcrl.marl.policy_learners`): its minibatches hold its policies' rows, one group per
policy is active, and the parameter rank averages and steps each policy's block on its own.

IPPO: each critic sees its agent's observation. MAPPO: each critic sees the joint observation
of the agent's env copy and a one-hot agent id (a centralised critic, Yu et al. 2022).
"""
from __future__ import annotations

import numpy as np
import torch

from hpcrl.algos import ppo as ppo_maths
from hpcrl.algos.base import Algorithm
from hpcrl.marl import policy_learners
from hpcrl.marl.policy_learners import PolicyLearnerHooks
from hpcrl.marl.model import MultiPolicyActorCritic, initial_map, slot_count
from hpcrl.marl.scaling_rank import ScalingHooks
from hpcrl.marl.sharing_rank import SharingHooks, spread_rows
from hpcrl.marl.similarity import observation_action_samples

STATS = ("loss", "policy_loss", "value_loss", "entropy", "kl")


class MultiAgentPPO(PolicyLearnerHooks, ScalingHooks, SharingHooks, Algorithm):
    """cfg: IPPOConfig or MAPPOConfig; ``central_critic`` picks MAPPO. ``algo.sharing``: dynamic learner
    sharing (:mod:`hpcrl.marl.sharing_rank`)."""

    name = "ippo"
    central_critic = False

    def __init__(self, cfg, model_cfg, aggregation_cfg=None) -> None:
        super().__init__(cfg, model_cfg)
        self.ratio_fn = ppo_maths.ratio_fn_for(aggregation_cfg) if aggregation_cfg is not None else None
        self.uses_window = self.ratio_fn is not None
        self._setup_sharing()
        self._setup_scaling()

    def make_model(self, obs_space, action_space, device="cpu") -> MultiPolicyActorCritic:
        model = MultiPolicyActorCritic(obs_space, action_space, self.model_cfg, self.cfg.agents,
                                       initial_map(self.cfg.policies, self.cfg.agents), self.central_critic, device,
                                       slots=slot_count(self.cfg))
        self.blocks = policy_learners.unit_blocks(model, self.cfg.critic_learners)
        return model

    # ---- learner: post-processing ---------------------------------------------------------
    def prepare(self, fragments, model: MultiPolicyActorCritic) -> dict[str, torch.Tensor]:
        """GAE with the newest weights' values; adds each row's ``agent`` and (MAPPO) ``critic_obs``.
        Fragments are [T, N] with N whole env copies, so the flattened rows are whole copies too."""
        parts = []
        for frag in fragments:
            b = ppo_maths.prepare_batch(frag, self.cfg, device=model.device, policy=model)
            rows = b["obs"].shape[0]
            b["agent"] = model.agent_ids(rows)
            if self.central_critic:
                b["critic_obs"] = model.critic_obs(b["obs"])
            if self.cfg.policy_learners:  # the policy each row trains, by the map of these weights
                b["slot"] = model.mapping()[b["agent"]]
            parts.append(b)
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def minibatches(self, batch, generator):
        """``num_sgd_iter`` shuffled passes. Policy learners keep the rows of their units' policies (marked
        ``train_policy`` / ``train_critic``: which of the two losses each row enters) and split them into
        as many minibatches as the whole batch makes (so each unit takes as many steps as with one group)."""
        size = self.cfg.minibatch_size
        if self.cfg.policy_learners:
            slot = batch["slot"]  # every agent has rows in a batch: its distinct slots are the map's policies
            units = policy_learners.assigned_units(torch.unique(slot).tolist(), *self.learner_group,
                                                   critic_learners=self.cfg.critic_learners)

            def rows_of(parts):
                mine = [p for p, part in units if part in parts]
                return torch.isin(slot, torch.as_tensor(mine, dtype=slot.dtype, device=slot.device))

            train_policy = rows_of((policy_learners.POLICY, policy_learners.BOTH))
            train_critic = rows_of((policy_learners.CRITIC, policy_learners.BOTH))
            keep = train_policy | train_critic
            batch = {**{k: v[keep] for k, v in batch.items()}, "train_policy": train_policy[keep],
                     "train_critic": train_critic[keep]}
            rows, count = int(keep.sum()), -(-self.cfg.train_batch_size // size)
            if rows == 0:
                return
            size = -(-rows // count)
        for _ in range(self.cfg.num_sgd_iter):
            yield from ppo_maths.minibatches(batch, size, generator)

    # ---- learner: policy and critic losses ------------------------------------------------
    def loss(self, mb, model: MultiPolicyActorCritic, window=None) -> tuple[torch.Tensor, dict]:
        """Clipped surrogate + vf_coeff value loss - entropy bonus, every row through its policy. A policy
        learner's minibatch marks which rows enter the policy terms (``train_policy``) and which the value
        loss (``train_critic``); a term without rows is 0."""
        zero = torch.zeros((), device=model.device)
        policy_loss = ent = kl = value_loss = zero
        pol, cri = _rows(mb, "train_policy"), _rows(mb, "train_critic")
        if len(pol["agent"]):
            logp, entropy = model.policy_terms(pol["obs"], pol["actions"], pol["agent"])
            if window is not None and "train_policy" in mb:
                window = window[:, mb["train_policy"]]
            policy_loss, _ = ppo_maths.clipped_surrogate(logp, pol["behaviour_logp"], pol["advantages"], self.cfg,
                                                         window, self.ratio_fn)
            ent = entropy.mean()
            log_r = logp - pol["behaviour_logp"]
            kl = (torch.exp(log_r) - 1 - log_r).mean()
        if len(cri["agent"]):
            critic_in = cri["critic_obs"] if self.central_critic else model.obs(cri["obs"])
            value_loss = 0.5 * (model.critic(critic_in, cri["agent"]) - cri["returns"]).square().mean()
        loss = policy_loss + self.cfg.vf_coeff * value_loss - self.cfg.entropy_coeff * ent
        return loss, dict(zip(STATS, (loss, policy_loss, value_loss, ent, kl)))

    def compute_gradient(self, minibatch, model, window=None):
        model.flat.zero_grad()
        loss, stats = self.loss(minibatch, model, window)
        loss.backward()
        norm = torch.linalg.vector_norm(model.flat.grads)
        model.flat.grads.mul_(torch.clamp(self.cfg.max_grad_norm / (norm + 1e-6), max=1.0))
        out = {k: float(v.detach()) for k, v in stats.items()}
        out["grad_norm"] = float(norm)
        return model.flat.grads, out

    # ---- dynamic learner sharing (hpcrl.marl.sharing_rank) ------------------------------------
    def sharing_report(self, batch) -> dict[str, np.ndarray]:
        """The rows of the loss, ``samples_per_agent`` per agent, spread over the batch."""
        agent = batch["agent"].cpu().numpy()
        idx = torch.as_tensor(spread_rows(agent, self.cfg.agents, self.cfg.sharing_samples_per_agent))
        keys = ("obs", "actions", "advantages", "returns", "agent") + (("critic_obs",) if self.central_critic else ())
        return {k: batch[k][idx.to(batch[k].device)].cpu().numpy() for k in keys}

    def sharing_samples(self, model, report) -> list[np.ndarray]:
        n = model.out if model.discrete else None
        return [observation_action_samples(report["obs"][report["agent"] == j], report["actions"][report["agent"] == j],
                                           n) for j in range(self.cfg.agents)]

    def sharing_loss(self, model, report) -> torch.Tensor:
        """The loss at the current weights: behaviour log-probs are the current ones (ratio 1, unclipped)."""
        mb = {k: torch.as_tensor(v, device=model.device) for k, v in report.items()}
        with torch.no_grad():
            mb["behaviour_logp"] = model.log_prob(model.dist(mb["obs"], mb["agent"]), mb["actions"])
        return self.loss(mb, model)[0]

    @torch.no_grad()
    def logps(self, model, minibatch):
        return model.log_prob(model.dist(minibatch["obs"], minibatch["agent"]), minibatch["actions"])


def _rows(mb: dict, mask_key: str) -> dict:
    """The minibatch rows a policy learner's mask keeps (all of them when the minibatch has no mask)."""
    if mask_key not in mb:
        return mb
    mask = mb[mask_key]
    return {k: v[mask] for k, v in mb.items()}


class IPPO(MultiAgentPPO):
    name = "ippo"
    central_critic = False


class MAPPO(MultiAgentPPO):
    name = "mappo"
    central_critic = True
