"""PPO (Schulman et al. 2017) with Stellaris' importance-sampling truncation (SC'24, Eq. 2).

Fragment keys (one actor fragment, time-major [T, N, ...], tensors or numpy):
    obs [T, N, *obs_shape], actions [T, N, *action_shape], rewards, terminated, truncated,
    behaviour_logp (log mu(a|s) of the acting policy), values (V(s) by the acting policy),
    final_values (V of the final observation on truncated steps, 0 elsewhere) — all [T, N] —
    and last_value [N] (V of the observation after the last step, the bootstrap).

Batch keys (flat [B, ...], made by :func:`prepare_batch`):
    obs, actions, behaviour_logp, values (old values, for value clipping),
    advantages (GAE), returns (GAE value targets).

Learner loop (runtime's job): for each of ``num_sgd_iter`` passes over the batch, for each
shuffled minibatch of :func:`minibatches`: pull the newest weights, :func:`compute_gradient`,
push. Each minibatch gradient is one push, computed at the pulled weights (its base version).

KL penalty: ``kl_coeff * E[(r - 1) - log r]``, r = pi/mu, the non-negative sample estimator of
KL(mu || pi) (only mu's log-probs travel with fragments, not its distribution parameters).
RLlib's adaptive coefficient is :func:`update_kl_coeff`; :class:`PPO` (the algorithm object the
runtime holds) applies it on the parameter rank once per round when ``kl_coeff`` > 0.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from hpcrl.algos import ppo_numpy
from hpcrl.algos.base import Algorithm
from hpcrl.algos.returns import generalized_advantage_estimate, next_values_from

RatioFn = Callable[[Tensor, Tensor], Tensor]
FRAGMENT_KEYS = ("obs", "actions", "rewards", "terminated", "truncated", "behaviour_logp", "values",
                 "final_values", "last_value")


def truncated_ratio(logp_learners: Tensor, logp_behaviour: Tensor, rho: float = 1.0) -> Tensor:
    """R' = min(|min_i pi_i/mu|, rho) (Stellaris Eq. 2), shape [B].

    ``logp_learners`` [K, B]: log pi_i(a|s) of the K learner policies in the aggregation window;
    row 0 is this learner's policy (with grad), the others detached snapshots.
    """
    if logp_learners.dim() != 2 or logp_learners.shape[1:] != logp_behaviour.shape:
        raise ValueError(f"expected logp_learners [K, B] and logp_behaviour [B], got "
                         f"{tuple(logp_learners.shape)} and {tuple(logp_behaviour.shape)}")
    ratios = torch.exp(logp_learners - logp_behaviour)
    return torch.clamp(ratios.min(dim=0).values.abs(), max=rho)


def truncated_ratio_code(logp_learners: Tensor, logp_behaviour: Tensor, rho: float = 1.0) -> Tensor:
    """The authors' released code: R' = min(r_0, max(min_j r_j, rho)), r_j = pi_j/mu, no absolute value.

    Same arguments as :func:`truncated_ratio`; row 0 is this learner's policy.
    """
    if logp_learners.dim() != 2 or logp_learners.shape[1:] != logp_behaviour.shape:
        raise ValueError(f"expected logp_learners [K, B] and logp_behaviour [B], got "
                         f"{tuple(logp_learners.shape)} and {tuple(logp_behaviour.shape)}")
    ratios = torch.exp(logp_learners - logp_behaviour)
    cap = torch.clamp(ratios.min(dim=0).values, min=rho)
    return torch.minimum(ratios[0], cap)


def ratio_fn_for(aggregation_cfg) -> RatioFn | None:
    """The IS ratio an AggregationConfig asks for: None (plain pi/mu), Eq. 2, or the code variant."""
    if not aggregation_cfg.is_truncation:
        return None
    rho = aggregation_cfg.rho
    fn = truncated_ratio_code if aggregation_cfg.policy == "stellaris_code" else truncated_ratio
    return lambda logp_learners, logp_behaviour: fn(logp_learners, logp_behaviour, rho)


def update_kl_coeff(kl_coeff: float, kl: float, kl_target: float) -> float:
    """RLlib's adaptive KL coefficient: x1.5 when kl > 2 target, x0.5 when kl < target / 2."""
    if kl > 2.0 * kl_target:
        return kl_coeff * 1.5
    if kl < 0.5 * kl_target:
        return kl_coeff * 0.5
    return kl_coeff


def _tensor(x, device, dtype=None) -> Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, Tensor) else x, device=device, dtype=dtype)


def prepare_batch(fragments: Mapping | Sequence[Mapping], cfg, device: str | torch.device = "cpu",
                  policy=None) -> dict[str, Tensor]:
    """Fragments (keys above) -> one flat batch on ``device`` with GAE advantages and returns (cfg: PPOConfig).

    With ``policy`` (an ActorCritic on ``device``) and a ``last_obs`` [N, ...] key in a fragment, its
    ``values`` and ``last_value`` are recomputed by the learner's policy; ``final_values`` always come
    from the actor (the final observation is gone after the reset). The arithmetic runs on the host:
    GAE's recursion is T small steps, each a few kernel launches on a GPU (measured on an H200 with
    CartPole's 2 x 16 x 8-step batch: 4.4 ms on the GPU, 1.3 ms on a CPU core). Only the value forward,
    one for all fragments, runs on ``device``, and the batch moves there once.
    """
    if isinstance(fragments, Mapping):
        fragments = [fragments]
    for frag in fragments:
        missing = [k for k in FRAGMENT_KEYS if k not in frag]
        if missing:
            raise ValueError(f"prepare_batch: fragment lacks {missing}")
    relearned = _learner_values(policy, fragments, device) if policy is not None else {}
    parts: list[dict[str, Tensor]] = []
    for i, frag in enumerate(fragments):
        f = {k: _tensor(frag[k], "cpu") for k in FRAGMENT_KEYS}
        T, N = f["rewards"].shape
        values, last_value = relearned.get(i, (f["values"].float(), f["last_value"].float()))
        nxt = next_values_from(values, last_value, f["truncated"], f["final_values"].float())
        adv, ret = generalized_advantage_estimate(f["rewards"].float(), values, nxt, f["terminated"],
                                                  f["truncated"], cfg.gamma, cfg.gae_lambda)
        flat = lambda x: x.reshape(T * N, *x.shape[2:])  # noqa: E731
        parts.append({"obs": flat(f["obs"]), "actions": flat(f["actions"]),
                      "behaviour_logp": flat(f["behaviour_logp"]).float(), "values": flat(values),
                      "advantages": flat(adv), "returns": flat(ret)})
    return {k: torch.cat([p[k] for p in parts]).to(device) for k in parts[0]}


@torch.no_grad()
def _learner_values(policy, fragments: Sequence[Mapping], device) -> dict[int, tuple[Tensor, Tensor]]:
    """{fragment index: (values [T, N], last_value [N]) on the host} under ``policy``, for the fragments
    that carry ``last_obs``: every observation of them in one forward on ``device``."""
    which = [i for i, f in enumerate(fragments) if "last_obs" in f]
    if not which:
        return {}
    obs = [_tensor(fragments[i]["obs"], "cpu") for i in which]
    last = [_tensor(fragments[i]["last_obs"], "cpu") for i in which]
    rows = [o.reshape(-1, *o.shape[2:]) for o in obs] + last
    values = policy.value(torch.cat(rows).to(device)).float().cpu()
    sizes = [r.shape[0] for r in rows]
    pieces = values.split(sizes)
    k = len(which)
    return {i: (pieces[j].reshape(obs[j].shape[:2]), pieces[k + j].reshape(-1)) for j, i in enumerate(which)}


def minibatches(batch: Mapping[str, Tensor], size: int, generator: torch.Generator | None = None
                ) -> Iterator[dict[str, Tensor]]:
    """Shuffled minibatches of ``size`` rows (the last one may be smaller): the batch gathered once in
    a random order, then consecutive slices of it (views: one gather per key a pass, not a minibatch).
    A minibatch of the whole batch is the batch itself, unshuffled: the loss is a mean over rows, so
    the order changes nothing but the rounding, and every pass hands over the same tensors."""
    n = len(batch["advantages"])
    if size >= n:
        yield dict(batch)
        return
    order = torch.randperm(n, generator=generator).to(batch["advantages"].device)
    shuffled = {k: v[order] for k, v in batch.items()}
    for start in range(0, n, size):
        yield {k: v[start:start + size] for k, v in shuffled.items()}


def clipped_surrogate(logp: Tensor, denom_logp: Tensor, advantages: Tensor, cfg, window_logps: Tensor | None = None,
                      ratio_fn: RatioFn | None = None, ratio: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """-E[min(r A, clip(r, 1 - clip, 1 + clip) A)] and the ratio r used (Schulman et al. 2017, Eq. 7).

    r = pi/denom (denom: the behaviour policy mu for PPO, the target policy for IMPACT), or with
    ``ratio_fn`` Stellaris' truncated ratio over [logp; window_logps] (Eq. 2). Advantages are
    standardised within the minibatch when ``cfg.normalize_advantages``. ``ratio``: pi/denom computed already as
    ``exp(logp - denom_logp)`` (the caller's, so the graph has one exp, not two; without ``ratio_fn`` only).
    """
    if ratio_fn is not None:
        learners = logp.unsqueeze(0)
        if window_logps is not None:
            learners = torch.cat([learners, window_logps.detach().to(logp.dtype)], dim=0)
        ratio = ratio_fn(learners, denom_logp)
    elif ratio is None:
        ratio = torch.exp(logp - denom_logp)
    adv = advantages
    if cfg.normalize_advantages and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1.0 - cfg.clip, 1.0 + cfg.clip) * adv)
    return -surrogate.mean(), ratio


LOSS_STATS = ("loss", "policy_loss", "value_loss", "kl", "entropy", "clip_fraction", "ratio_mean", "truncated_fraction")
"""What :func:`ppo_loss` reports per (mini)batch, in this order."""


def ppo_loss_terms(batch: Mapping[str, Tensor], policy, cfg, window_logps: Tensor | None = None,
                   ratio_fn: RatioFn | None = None, kl_coeff: float | Tensor | None = None,
                   vf_clip: float | None = None) -> tuple[Tensor, Tensor]:
    """The loss of :func:`ppo_loss` and its :data:`LOSS_STATS` as one tensor on the batch's device
    (no host copy, so a CUDA graph can capture it). ``kl_coeff`` may be a 0-dim tensor (the model's
    constant: read on the device, it follows the adaptive coefficient without a host round trip)."""
    logp, entropy, value = policy.evaluate(batch["obs"], batch["actions"])
    mu_logp = batch["behaviour_logp"]
    log_r = logp - mu_logp
    raw_ratio = torch.exp(log_r)
    policy_loss, ratio = clipped_surrogate(logp, mu_logp, batch["advantages"], cfg, window_logps, ratio_fn,
                                           ratio=raw_ratio)
    ret = batch["returns"]
    value_err = (value - ret) ** 2
    if vf_clip is not None:
        old = batch["values"]
        clipped = old + torch.clamp(value - old, -vf_clip, vf_clip)
        value_err = torch.max(value_err, (clipped - ret) ** 2)
    value_loss = 0.5 * value_err.mean()
    coeff = cfg.kl_coeff if kl_coeff is None else kl_coeff
    loss = policy_loss + cfg.vf_coeff * value_loss
    # a term whose coefficient is 0 (known on the host) adds 0 to the loss and to every gradient: it is left
    # out of the graph (the same bits, a shorter backward) and still reported
    kl_in_loss = _nonzero(coeff)  # once: for the model's 0-dim constant it is a tensor comparison
    with nullcontext() if kl_in_loss else torch.no_grad():
        kl = ((raw_ratio - 1.0) - log_r).mean()
        if kl_in_loss:
            loss = loss + coeff * kl
    with nullcontext() if cfg.entropy_coeff != 0 else torch.no_grad():
        ent = entropy.mean()
        if cfg.entropy_coeff != 0:
            loss = loss - cfg.entropy_coeff * ent
    with torch.no_grad():
        stats = torch.stack([loss, policy_loss, value_loss, kl, ent, ((ratio - 1.0).abs() > cfg.clip).float().mean(),
                             ratio.mean(), (ratio < raw_ratio - 1e-6).float().mean()])
    return loss, stats


def _nonzero(coeff: float | Tensor) -> bool:
    """False only for a coefficient known to be 0 without a device sync (a float, or a CPU tensor)."""
    if isinstance(coeff, Tensor):
        return coeff.device.type != "cpu" or bool(coeff != 0)
    return coeff != 0


def ppo_loss(batch: Mapping[str, Tensor], policy, cfg, window_logps: Tensor | None = None,
             ratio_fn: RatioFn | None = None, kl_coeff: float | Tensor | None = None,
             vf_clip: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate + vf_coeff value loss + KL penalty - entropy bonus (cfg: PPOConfig).

    ``window_logps`` [K-1, B]: log-probs of the batch actions under the other learner policies of
    the aggregation window (detached); with ``ratio_fn`` (see :func:`ratio_fn_for`) the ratio is
    ``ratio_fn([logp; window_logps], behaviour_logp)``, else pi/mu. ``vf_clip``: clip V around
    the old values by this much (None: unclipped). ``kl_coeff`` overrides cfg.kl_coeff.
    """
    loss, stats = ppo_loss_terms(batch, policy, cfg, window_logps, ratio_fn, kl_coeff, vf_clip)
    return loss, dict(zip(LOSS_STATS, stats.tolist()))  # one host copy for all of them


GRADIENT_STATS = (*LOSS_STATS, "grad_norm")
"""What :func:`gradient_and_stats` reports, in this order."""


def gradient_and_stats(batch: Mapping[str, Tensor], policy, cfg, window_logps: Tensor | None = None,
                       ratio_fn: RatioFn | None = None, kl_coeff: float | Tensor | None = None,
                       vf_clip: float | None = None) -> tuple[Tensor, Tensor]:
    """:func:`compute_gradient` without leaving the device: the clipped flat gradient and the
    :data:`GRADIENT_STATS` as one tensor (``grad_norm`` before clipping).

    With plain ratios and an MLP actor-critic on the CPU, the derivative written out in numpy
    (:mod:`hpcrl.algos.ppo_numpy`, about 2x faster at CartPole's size; equal to autograd's within float32
    rounding); otherwise autograd."""
    if ratio_fn is None and window_logps is None:
        by_hand = ppo_numpy.for_model(policy)  # None off the CPU
        if by_hand is not None:
            coeff = cfg.kl_coeff if kl_coeff is None else float(kl_coeff)
            return by_hand.gradient(batch, cfg, coeff, vf_clip)
    return autograd_gradient_and_stats(batch, policy, cfg, window_logps, ratio_fn, kl_coeff, vf_clip)


def autograd_gradient_and_stats(batch: Mapping[str, Tensor], policy, cfg, window_logps: Tensor | None = None,
                                ratio_fn: RatioFn | None = None, kl_coeff: float | Tensor | None = None,
                                vf_clip: float | None = None) -> tuple[Tensor, Tensor]:
    """:func:`gradient_and_stats` by autograd on :func:`ppo_loss_terms`, for any model, device and ratio."""
    flat = policy.flat
    flat.zero_grad()
    loss, stats = ppo_loss_terms(batch, policy, cfg, window_logps, ratio_fn, kl_coeff, vf_clip)
    loss.backward()
    if not flat.grads_attached():
        raise RuntimeError("compute_gradient: parameter grads were detached from the flat buffer")
    norm = torch.linalg.vector_norm(flat.grads)
    flat.grads.mul_(torch.clamp(cfg.max_grad_norm / (norm + 1e-6), max=1.0))
    return flat.grads, torch.cat([stats, norm.reshape(1)])


def compute_gradient(batch: Mapping[str, Tensor], policy, cfg, window_logps: Tensor | None = None,
                     ratio_fn: RatioFn | None = None, kl_coeff: float | Tensor | None = None,
                     vf_clip: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """Flat float32 gradient of :func:`ppo_loss` on one (mini)batch, norm-clipped to cfg.max_grad_norm.

    Returns ``policy.flat.grads`` itself (valid until the next call: copy it to keep it) and the
    loss stats plus ``grad_norm`` (before clipping). The policy's parameters are not changed.
    """
    grad, stats = gradient_and_stats(batch, policy, cfg, window_logps, ratio_fn, kl_coeff, vf_clip)
    return grad, dict(zip(GRADIENT_STATS, stats.tolist()))  # one host copy (a sync on a GPU)


@torch.no_grad()
def logps_under(policies: Sequence, batch: Mapping[str, Tensor]) -> Tensor:
    """[K, B] log-probs of the batch actions under K policy snapshots (e.g. older weight-board versions)."""
    return torch.stack([p.evaluate(batch["obs"], batch["actions"])[0] for p in policies])


class PPO(Algorithm):
    """PPO against the algorithm contract (:mod:`hpcrl.algos.base`); cfg: PPOConfig.

    Learner: GAE with the newest weights' values (:func:`prepare_batch`), ``num_sgd_iter``
    shuffled passes of ``minibatch_size`` (one push per minibatch). Parameter rank: Adam or SGD
    on the admitted gradients; at the end of each round RLlib's adaptive KL coefficient
    (:func:`update_kl_coeff`, from the round's mean KL) when ``kl_coeff`` > 0. The coefficient
    travels to the learners inside the published weights (``model.constants``).
    """

    name = "ppo"

    def __init__(self, cfg, model_cfg, aggregation_cfg=None) -> None:
        super().__init__(cfg, model_cfg)
        self.ratio_fn = ratio_fn_for(aggregation_cfg) if aggregation_cfg is not None else None
        self.uses_window = self.ratio_fn is not None

    def make_model(self, obs_space, action_space, device="cpu"):
        from hpcrl.models import ActorCritic

        return ActorCritic(obs_space, action_space, self.model_cfg, device=device,
                           constants={"kl_coeff": self.cfg.kl_coeff})

    def prepare(self, fragments, model):
        return prepare_batch(fragments, self.cfg, device=model.device, policy=model)

    def minibatches(self, batch, generator):
        for _ in range(self.cfg.num_sgd_iter):
            yield from minibatches(batch, self.cfg.minibatch_size, generator)

    def compute_gradient(self, minibatch, model, window=None):
        return compute_gradient(minibatch, model, self.cfg, window_logps=window, ratio_fn=self.ratio_fn,
                                kl_coeff=model.constants["kl_coeff"], vf_clip=self.cfg.vf_clip)

    gradient_stat_names = GRADIENT_STATS

    def gradient_tensors(self, minibatch, model):
        return gradient_and_stats(minibatch, model, self.cfg, ratio_fn=self.ratio_fn, kl_coeff=model.constants["kl_coeff"],
                                  vf_clip=self.cfg.vf_clip)

    def end_round(self, model, round_stats):
        """RLlib's adaptive KL coefficient, in the flat buffer (the learners get it with the next version)."""
        coeff = float(model.constants["kl_coeff"])
        kl = round_stats.get("kl", float("nan"))
        if coeff > 0 and np.isfinite(kl):
            with torch.no_grad():
                model.constants["kl_coeff"].fill_(update_kl_coeff(coeff, kl, self.cfg.kl_target))
        return {}
