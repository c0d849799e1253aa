"""Return and advantage estimators, once each: GAE, V-trace, n-step returns.

All take time-major tensors of shape [T, N] (T steps of N environments) on any device, and
keep ``terminated`` and ``truncated`` apart:

- ``next_values[t]`` is the bootstrap value of the observation that followed step t, before
  any reset: ``values[t + 1]`` inside a fragment, the value of the final observation on a
  truncated step, the value of the observation after the fragment's last step at t = T - 1.
  :func:`next_values_from` builds it from what actors send.
- ``terminated[t]``: the episode ended in a terminal state; nothing is bootstrapped.
- ``truncated[t]``: a time limit cut the episode; the recursion stops (the next row belongs
  to a new episode) but ``next_values[t]`` is bootstrapped.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _check(**tensors: Tensor) -> tuple[int, int]:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected equal [T, N] shapes, got {shapes}")
    return first


def next_values_from(values: Tensor, last_value: Tensor, truncated: Tensor, final_values: Tensor) -> Tensor:
    """[T, N] bootstrap values: values[t + 1], last_value [N] at t = T - 1, final_values where truncated."""
    _check(values=values, truncated=truncated, final_values=final_values)
    if tuple(last_value.shape) != (values.shape[1],):
        raise ValueError(f"last_value: expected shape ({values.shape[1]},), got {tuple(last_value.shape)}")
    nxt = torch.cat([values[1:], last_value.reshape(1, -1).to(values.dtype)], dim=0)
    return torch.where(truncated.bool(), final_values.to(values.dtype), nxt)


def generalized_advantage_estimate(rewards: Tensor, values: Tensor, next_values: Tensor, terminated: Tensor,
                                   truncated: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE", Eq. 16).

    delta_t = r_t + gamma (1 - terminated_t) V'_t - V_t;
    A_t = delta_t + gamma lam (1 - terminated_t)(1 - truncated_t) A_{t+1}, A_T = 0.
    Returns (advantages, value targets = advantages + values), both [T, N].
    """
    T, _ = _check(rewards=rewards, values=values, next_values=next_values, terminated=terminated,
                  truncated=truncated)
    not_term = 1.0 - terminated.to(values.dtype)
    not_done = not_term * (1.0 - truncated.to(values.dtype))
    deltas = rewards.to(values.dtype) + gamma * not_term * next_values - values
    carry = gamma * lam * not_done
    adv = torch.empty_like(values)
    acc = torch.zeros_like(values[0])
    # one fused op per step, written in place (the recursion is the learner's longest Python loop)
    for delta, keep, out in zip(reversed(deltas.unbind(0)), reversed(carry.unbind(0)), reversed(adv.unbind(0))):
        acc = torch.addcmul(delta, keep, acc, out=out)
    return adv, adv + values


def vtrace(log_rhos: Tensor, rewards: Tensor, values: Tensor, next_values: Tensor, terminated: Tensor,
           truncated: Tensor, gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0) -> tuple[Tensor, Tensor]:
    """V-trace targets (Espeholt et al. 2018, IMPALA, Eq. 1 and Remark 1; used by IMPACT).

    log_rhos = log pi(a|x) - log mu(a|x); rho_t = min(rho_bar, e^log_rho), c_t = lam min(c_bar, e^log_rho).
    v_t = V_t + delta_t + gamma c_t (v_{t+1} - V_{t+1}), delta_t = rho_t (r_t + gamma V'_t - V_t).
    Returns (vs [T, N], policy-gradient advantages rho_t (r_t + gamma v'_t - V_t)), both detached;
    v'_t = v_{t+1} inside an episode and next_values[t] at a truncation or the fragment end.
    """
    T, _ = _check(log_rhos=log_rhos, rewards=rewards, values=values, next_values=next_values,
                  terminated=terminated, truncated=truncated)
    with torch.no_grad():
        not_term = 1.0 - terminated.to(values.dtype)
        not_done = not_term * (1.0 - truncated.to(values.dtype))
        ratio = torch.exp(log_rhos.to(values.dtype))
        rhos = ratio.clamp(max=rho_bar)
        cs = lam * ratio.clamp(max=c_bar)
        deltas = rhos * (rewards.to(values.dtype) + gamma * not_term * next_values - values)
        corr = torch.empty_like(values)  # v_t - V_t
        acc = torch.zeros_like(values[0])
        for t in range(T - 1, -1, -1):
            acc = deltas[t] + gamma * cs[t] * not_done[t] * acc
            corr[t] = acc
        vs = values + corr
        later = torch.cat([corr[1:], torch.zeros_like(corr[:1])], dim=0)
        next_vs = next_values + not_done * later
        pg_adv = rhos * (rewards.to(values.dtype) + gamma * not_term * next_vs - values)
    return vs, pg_adv


def n_step_returns(rewards: Tensor, next_values: Tensor, terminated: Tensor, truncated: Tensor,
                   gamma: float, n: int) -> Tensor:
    """n-step returns (Sutton & Barto 2018, Eq. 7.1; the targets of seed 003's HDDPG, Algorithm 2).

    G_t = sum_{k<m} gamma^k r_{t+k} + gamma^m (1 - terminated) next_values[t+m-1], where the window
    m <= n stops early at the first terminated or truncated step or at the fragment end. For a
    critic, ``next_values[t]`` is the target network's Q(s_{t+1}, mu'(s_{t+1})).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    T, _ = _check(rewards=rewards, next_values=next_values, terminated=terminated, truncated=truncated)
    dtype = next_values.dtype
    rewards, term, trunc = rewards.to(dtype), terminated.bool(), truncated.bool()
    out = torch.zeros_like(next_values)
    alive = torch.ones_like(term)
    discount = torch.ones_like(next_values)
    for k in range(min(n, T)):
        rows = T - k  # row t reads step t + k
        a, disc = alive[:rows], discount[:rows]
        out[:rows] += torch.where(a, disc * rewards[k:], torch.zeros_like(disc))
        stop = trunc[k:] | term[k:]
        if k == n - 1:
            stop = torch.ones_like(stop)
        else:
            stop = stop.clone()
            stop[-1] = True  # fragment end
        boot = a & stop & ~term[k:]
        out[:rows] += torch.where(boot, disc * gamma * next_values[k:], torch.zeros_like(disc))
        alive[:rows] = a & ~stop
        discount[:rows] = disc * gamma
    return out
