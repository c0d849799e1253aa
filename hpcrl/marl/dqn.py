"""IQL and VDN (MARLess section 4.2, Fig. 5 (a) and (c); section 6.2.1) against the algorithm contract.

Both train a :class:`~hpcrl.marl.model.MultiPolicyQ` (a Q-network and a target Q-network per
policy, epsilon in the published weights). MARLess' decomposition maps onto the roles:

- post-processing: :meth:`prepare` turns each fragment into joint transitions in the learner's
  replay buffer (:mod:`hpcrl.marl.replay`); :meth:`minibatches` draws
  ``updates_per_fragment`` minibatches from it (VDN's mixing is the sum inside the loss);
- policy (value-network) learners: :meth:`compute_gradient`, the TD loss;
- parameter rank: Adam (fixed learning rate), then the soft target update
  theta' <- tau theta + (1 - tau) theta' after every applied gradient (:meth:`apply`), and the
  linear epsilon schedule once per round (:meth:`end_round`).

IQL with ``algo.policy_learners`` (:mod:`hpcrl.marl.policy_learners`): each learner group keeps
every fragment in its replay and computes Q-values and TD errors only for the agents whose
policies it trains (``train_agent``), so its gradient carries only their Q-networks. VDN refuses it: its team TD
error couples every agent's Q-value.

IQL (Tan 1993; Tampuu et al. 2017): each agent's own TD error,
    y_i = r_i + gamma alive_i max_a Q'_i(o'_i, a),   L = mean_i (y_i - Q_i(o_i, a_i))^2.
VDN (Sunehag et al. 2018): one team TD error on the sum of the agents' values,
    Q_tot = sum_i Q_i(o_i, a_i),   y_tot = sum_i r_i + gamma sum_i alive_i max_a Q'_i(o'_i, a),
    L = mean (y_tot - Q_tot)^2,
so every agent's Q receives the same gradient dL/dQ_i = dL/dQ_tot (:func:`vdn_loss`).
Truncated episodes bootstrap from the actor's max_a Q'(final observation) (``fixed_value``).
"""
from __future__ import annotations

import torch
from torch import Tensor

import numpy as np

from hpcrl.algos.base import Algorithm
from hpcrl.marl import policy_learners
from hpcrl.marl.model import MultiPolicyQ, initial_map, slot_count
from hpcrl.marl.policy_learners import PolicyLearnerHooks
from hpcrl.marl.replay import KEYS, ReplayBuffer, joint_transitions
from hpcrl.marl.scaling_rank import ScalingHooks
from hpcrl.marl.sharing_rank import SharingHooks
from hpcrl.marl.similarity import observation_action_samples


def epsilon_at(round_index: int, cfg) -> float:
    """Linear decay from epsilon_start to epsilon_end over epsilon_decay_rounds rounds."""
    frac = min(1.0, round_index / cfg.epsilon_decay_rounds)
    return cfg.epsilon_start + frac * (cfg.epsilon_end - cfg.epsilon_start)


def vdn_loss(q_taken: Tensor, target: Tensor) -> Tensor:
    """mean_b (y_tot_b - sum_i Q_i,b)^2 for q_taken [B, A] (each agent's Q of its action) and y_tot [B]."""
    return (target - q_taken.sum(dim=1)).square().mean()


class MultiAgentDQN(PolicyLearnerHooks, ScalingHooks, SharingHooks, Algorithm):
    """cfg: IQLConfig or VDNConfig; ``team`` picks VDN. ``algo.sharing``: dynamic learner sharing
    (:mod:`hpcrl.marl.sharing_rank`)."""

    name = "iql"
    team = False

    def __init__(self, cfg, model_cfg, aggregation_cfg=None) -> None:
        super().__init__(cfg, model_cfg)
        self.replay = ReplayBuffer(cfg.buffer_size)
        self._setup_sharing()
        self._setup_scaling()

    def make_model(self, obs_space, action_space, device="cpu") -> MultiPolicyQ:
        model = MultiPolicyQ(obs_space, action_space, self.model_cfg, self.cfg.agents,
                             initial_map(self.cfg.policies, self.cfg.agents), self.cfg.epsilon_start, device,
                             slots=slot_count(self.cfg))
        self.blocks = policy_learners.unit_blocks(model)
        return model

    # ---- learner --------------------------------------------------------------------------
    def prepare(self, fragments, model):
        for frag in fragments:
            self.replay.add(joint_transitions(frag, model.agents))
        batch = {"replay_size": torch.tensor(len(self.replay))}
        if self.cfg.policy_learners:  # the agents whose policies this group trains, by the current map
            slot = model.mapping().cpu()
            mine = [p for p, _ in policy_learners.assigned_units(slot.tolist(), *self.learner_group)]
            batch["train_agent"] = torch.isin(slot, torch.as_tensor(mine, dtype=slot.dtype))
        return batch

    def minibatches(self, batch, generator):
        mine = batch.get("train_agent")
        if mine is not None and not mine.any():
            return
        for _ in range(self.cfg.updates_per_fragment):
            mb = self.replay.sample(self.cfg.batch_size, generator, "cpu")
            if mine is not None:  # per row, so a group's ranks can split the minibatch by rows
                mb["train_agent"] = mine.expand(mb["actions"].shape[0], -1)
            yield mb

    def td_targets(self, mb, model: MultiPolicyQ) -> tuple[Tensor, Tensor]:
        """(Q_i(o_i, a_i) [B, A] with gradients, per-agent bootstrapped targets parts (r_i, boot_i) summed
        as the algorithm needs: IQL [B, A], VDN [B]); A is the group's own agents under policy learners."""
        mb = {k: v.to(model.device) for k, v in mb.items()}
        agents = torch.arange(mb["actions"].shape[1], device=model.device)
        if "train_agent" in mb:  # policy learners (IQL): the Q-values of this group's agents only
            agents = agents[mb.pop("train_agent")[0]]
            mb = {k: mb[k][:, agents] for k in KEYS}
        B, A = mb["actions"].shape
        agent = agents.repeat(B)
        q = model.q(mb["obs"].reshape(B * A, -1), agent).gather(1, mb["actions"].reshape(-1, 1))
        with torch.no_grad():
            next_max = model.q(mb["next_obs"].reshape(B * A, -1), agent, target=True).max(dim=1).values.view(B, A)
            boot = torch.where(mb["fixed"] > 0, mb["fixed_value"], next_max) * mb["alive"]
            y = mb["rewards"] + self.cfg.gamma * boot
        q = q.view(B, A)
        return q, (y.sum(dim=1) if self.team else y)

    def td_loss(self, mb, model: MultiPolicyQ) -> tuple[Tensor, Tensor]:
        """(VDN's team loss or IQL's mean per-agent squared TD error, Q(o, a) [B, A])."""
        q, y = self.td_targets(mb, model)
        if self.team:
            return vdn_loss(q, y), q
        return (y - q).square().mean(), q

    def compute_gradient(self, minibatch, model, window=None):
        model.flat.zero_grad()
        loss, q = self.td_loss(minibatch, model)
        loss.backward()
        norm = torch.linalg.vector_norm(model.flat.grads)
        model.flat.grads.mul_(torch.clamp(self.cfg.max_grad_norm / (norm + 1e-6), max=1.0))
        return model.flat.grads, {"loss": float(loss.detach()), "value_loss": float(loss.detach()),
                                  "q_mean": float(q.detach().mean()), "grad_norm": float(norm)}

    # ---- parameter rank -------------------------------------------------------------------
    def apply(self, model, optimizer, gradient) -> None:
        super().apply(model, optimizer, gradient)  # policy learners: the carried Q-networks only
        targets, online = model.pairs()
        with torch.no_grad():
            torch._foreach_lerp_(targets, online, self.cfg.target_tau)

    def end_round(self, model, round_stats):
        """The epsilon schedule, in the flat buffer (the actors explore with it from the next version)."""
        rounds = float(model.constants["rounds"]) + 1
        with torch.no_grad():
            model.constants["rounds"].fill_(rounds)
            model.constants["epsilon"].fill_(epsilon_at(int(rounds), self.cfg))
        return super().end_round(model, round_stats)

    # ---- dynamic learner sharing (hpcrl.marl.sharing_rank) ------------------------------------
    def sharing_report(self, batch) -> dict[str, np.ndarray] | None:
        """``samples_per_agent`` joint transitions spread over the replay's newest four times as many."""
        if not len(self.replay):
            return None
        newest = min(len(self.replay), 4 * self.cfg.sharing_samples_per_agent)
        back = np.unique(np.linspace(1, newest, min(newest, self.cfg.sharing_samples_per_agent)).astype(np.int64))
        idx = (self.replay.next - back) % self.replay.capacity
        return {k: self.replay.data[k][idx] for k in KEYS}

    def sharing_samples(self, model, report) -> list[np.ndarray]:
        return [observation_action_samples(report["obs"][:, j], report["actions"][:, j], model.out)
                for j in range(self.cfg.agents)]

    def sharing_loss(self, model, report) -> Tensor:
        return self.td_loss({k: torch.as_tensor(v) for k, v in report.items()}, model)[0]


class IQL(MultiAgentDQN):
    name = "iql"
    team = False


class VDN(MultiAgentDQN):
    name = "vdn"
    team = True
