"""IMPACT (Luo et al. 2020, "IMPACT: Importance Weighted Asynchronous Architectures with Clipped
Target Networks", ICLR), as Stellaris (SC'24, Section VIII-B) trains it next to PPO.

Three policies meet in one update: the behaviour policy mu that acted (its log-probs travel with
the fragment), a target policy pi_target (an untrained copy of the policy in the model's flat
buffer, refreshed by the parameter rank every ``target_update_frequency`` rounds), and the
policy pi_theta being trained. Per learner batch (one fragment, reused ``num_sgd_iter`` times:
IMPACT's circular buffer):

    targets     V-trace with pi = pi_target (Espeholt et al. 2018, Eq. 1; returns.vtrace):
                rho_t = min(rho_bar, pi_target/mu), vs_t the value targets,
                A_t = rho_t (r_t + gamma vs_{t+1} - V(s_t)) the policy-gradient advantages
    surrogate   r_t = pi_theta / pi_target;  L_pi = -E[min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)]
    value       L_v = 1/2 E[(V(s_t) - vs_t)^2]
    KL          E_s[KL(pi_target(.|s) || pi_theta(.|s))], exact between the two distributions,
                weighted by an adaptive coefficient (RLlib's rule, x1.5 / x0.5 per round against kl_target)
    loss        L_pi + vf_coeff L_v + kl_coeff KL - entropy_coeff H[pi_theta]

IMPACT's objective (Section 3.1) is min(pi_theta/mu A, clip(pi_theta/pi_target) pi_target/mu A) with
the target-worker ratio pi_target/mu truncated; since pi_theta/mu = r_t pi_target/mu, that is the
clipped surrogate above with the truncated ratio rho_t folded into A_t, which is how V-trace's
policy-gradient advantage already carries it. pi_target's log-probs are taken once per batch
(when the V-trace targets are), so rho_t and r_t refer to the same target.

Stellaris' IS truncation (Eq. 2, ``aggregation.is_truncation``): r_t is replaced by
R' = min(|min_i pi_i / pi_target|, rho) over this learner's policy and the other groups' base
versions: the target plays mu's part, because the target-worker ratio is already truncated
by V-trace.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.distributions import kl_divergence

from hpcrl.algos.base import Algorithm
from hpcrl.algos.ppo import FRAGMENT_KEYS, RatioFn, clipped_surrogate, minibatches, ratio_fn_for, update_kl_coeff
from hpcrl.algos.returns import next_values_from, vtrace


def _tensor(x, device) -> Tensor:
    return x.to(device) if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x), device=device)


@torch.no_grad()
def vtrace_batch(fragments: Sequence[Mapping], model, cfg) -> dict[str, Tensor]:
    """Fragments (the keys of :data:`hpcrl.algos.ppo.FRAGMENT_KEYS` plus ``last_obs``) -> one flat batch:
    obs, actions, behaviour_logp, target_logp, vs (value targets), advantages (V-trace's pg advantages).

    V(s_t) and the bootstrap V(last_obs) come from ``model`` (the learner's newest weights); the value
    of a truncated episode's final observation from the actor (``final_values``)."""
    device = model.device
    parts = []
    for frag in fragments:
        missing = [k for k in (*FRAGMENT_KEYS, "last_obs") if k not in frag]
        if missing:
            raise ValueError(f"vtrace_batch: fragment lacks {missing}")
        f = {k: _tensor(frag[k], device) for k in (*FRAGMENT_KEYS, "last_obs")}
        T, N = f["rewards"].shape
        obs = f["obs"].reshape(T * N, *f["obs"].shape[2:])
        actions = f["actions"].reshape(T * N, *f["actions"].shape[2:])
        values = model.value(obs).reshape(T, N)
        nxt = next_values_from(values, model.value(f["last_obs"]), f["truncated"], f["final_values"].float())
        target_logp = model.log_prob(model.target_dist(obs), actions)
        mu_logp = f["behaviour_logp"].float().reshape(T * N)
        vs, adv = vtrace((target_logp - mu_logp).reshape(T, N), f["rewards"].float(), values, nxt,
                         f["terminated"], f["truncated"], cfg.gamma, rho_bar=cfg.vtrace_rho_bar,
                         c_bar=cfg.vtrace_c_bar)
        parts.append({"obs": obs, "actions": actions, "behaviour_logp": mu_logp, "target_logp": target_logp,
                      "vs": vs.reshape(-1), "advantages": adv.reshape(-1)})
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def impact_loss(batch: Mapping[str, Tensor], model, cfg, kl_coeff: float, window_logps: Tensor | None = None,
                ratio_fn: RatioFn | None = None) -> tuple[Tensor, dict[str, float]]:
    """The IMPACT loss of one minibatch (see the module docstring) and its stats."""
    dist = model.dist(batch["obs"])
    logp = model.log_prob(dist, batch["actions"])
    value = model.value(batch["obs"])
    policy_loss, ratio = clipped_surrogate(logp, batch["target_logp"], batch["advantages"], cfg, window_logps,
                                           ratio_fn)
    value_loss = 0.5 * (value - batch["vs"]).square().mean()
    kl_each = kl_divergence(model.target_dist(batch["obs"]), dist)
    kl = (kl_each if model.discrete else kl_each.sum(-1)).mean()
    entropy = (dist.entropy() if model.discrete else dist.entropy().sum(-1)).mean()
    loss = policy_loss + cfg.vf_coeff * value_loss + kl_coeff * kl - cfg.entropy_coeff * entropy
    with torch.no_grad():
        stats = {"loss": loss.item(), "policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                 "kl": kl.item(), "entropy": entropy.item(),
                 "clip_fraction": ((ratio - 1.0).abs() > cfg.clip).float().mean().item(),
                 "ratio_mean": ratio.mean().item()}
    return loss, stats


class IMPACT(Algorithm):
    """IMPACT against the algorithm contract (:mod:`hpcrl.algos.base`); cfg: IMPACTConfig.

    Model: :class:`~hpcrl.models.ActorCritic` with a target policy and two constants in the flat
    buffer, ``kl_coeff`` and ``rounds_since_target`` (so a resumed run keeps both). Learner: one
    fragment per batch (V-trace, :func:`vtrace_batch`), ``num_sgd_iter`` shuffled passes of
    ``minibatch_size``. Parameter rank: Adam or SGD on the admitted gradients; :meth:`end_round`
    adapts the KL coefficient and copies the policy into the target every
    ``target_update_frequency`` rounds.
    """

    name = "impact"

    def __init__(self, cfg, model_cfg, aggregation_cfg=None) -> None:
        super().__init__(cfg, model_cfg)
        self.ratio_fn = ratio_fn_for(aggregation_cfg) if aggregation_cfg is not None else None
        self.uses_window = self.ratio_fn is not None

    def make_model(self, obs_space, action_space, device="cpu"):
        from hpcrl.models import ActorCritic

        return ActorCritic(obs_space, action_space, self.model_cfg, device=device, target_policy=True,
                           constants={"kl_coeff": self.cfg.kl_coeff, "rounds_since_target": 0.0})

    def prepare(self, fragments, model):
        return vtrace_batch(fragments, model, self.cfg)

    def minibatches(self, batch, generator):
        for _ in range(self.cfg.num_sgd_iter):
            yield from minibatches(batch, self.cfg.minibatch_size, generator)

    def compute_gradient(self, minibatch, model, window=None):
        """Flat gradient of :func:`impact_loss`, norm-clipped to ``max_grad_norm`` (``model.flat.grads``)."""
        flat = model.flat
        flat.zero_grad()
        loss, stats = impact_loss(minibatch, model, self.cfg, float(model.constants["kl_coeff"]), window,
                                  self.ratio_fn)
        loss.backward()
        norm = torch.linalg.vector_norm(flat.grads)
        stats["grad_norm"] = norm.item()
        flat.grads.mul_(torch.clamp(self.cfg.max_grad_norm / (norm + 1e-6), max=1.0))
        return flat.grads, stats

    def end_round(self, model, round_stats):
        """Adaptive KL and the target copy every ``target_update_frequency`` rounds, both in the flat buffer."""
        coeff = float(model.constants["kl_coeff"])
        kl = round_stats.get("kl", float("nan"))
        with torch.no_grad():
            if coeff > 0 and np.isfinite(kl):
                model.constants["kl_coeff"].fill_(update_kl_coeff(coeff, kl, self.cfg.kl_target))
            rounds = float(model.constants["rounds_since_target"]) + 1
            if rounds >= self.cfg.target_update_frequency:
                model.sync_target_()
                rounds = 0.0
            model.constants["rounds_since_target"].fill_(rounds)
        return {}
