"""PPO's minibatch gradient for an actor-critic of small MLPs on the CPU, in numpy with the backward written out.

The loss is :func:`hpcrl.algos.ppo.ppo_loss_terms`' (clipped surrogate, value loss with optional clipping, KL
penalty, entropy bonus); this module is its derivative, taken by hand, for the case the learners run most: plain
pi/mu ratios (no Stellaris IS truncation), MLP networks (tanh or relu), a Categorical or diagonal Gaussian policy.
:func:`hpcrl.algos.ppo.gradient_and_stats` uses it where it applies, autograd elsewhere.

Why: at these sizes torch spends most of a step on dispatch and autograd bookkeeping, not arithmetic. CartPole's
default minibatch (256 rows, two 2 x 64 tanh MLPs) took 1.55 ms by autograd and 0.68 ms here on the 2-core VM,
of which the four tanh calls are a third. Not the same bits as autograd: BLAS sums in another order, so gradients
differ by float32 rounding (tests/test_ppo_numpy.py holds every branch to autograd's within 1e-5 relative).

The derivative, per row i of B (``mean`` is over rows; r = pi/mu, A the advantage, standardised when asked):
    policy loss  -mean(min(r A, clip(r, 1-c, 1+c) A)):   d/d log r = -r A / B where r A <= clip(r) A, else 0
                 (torch.min splits the gradient of a tie; a tie with r outside the clip range has A = 0)
    KL penalty   k mean((r - 1) - log r):                d/d log r = k (r - 1) / B
    value loss   vf 0.5 mean(max((V-R)^2, (V_clip-R)^2)):  d/dV = vf (V - R) / B on the larger branch
                 (V_clip = V_old + clip(V - V_old, -e, e) passes a gradient only inside the clip range)
    Categorical  log pi = log_softmax(z)[a]; entropy -sum p log p; d/dz = g - p sum(g) for g on log_softmax
    Gaussian     d log pi/d mean = (a - mean)/std^2, d log pi/d log_std = (a - mean)^2/std^2 - 1, entropy' = 1
    MLP layer    h = act(W x + b): dW = dz^T x, db = sum(dz), dx = (dz W) act'(h) with tanh' = 1 - h^2
"""
from __future__ import annotations

import weakref

import numpy as np
import torch

from hpcrl.inference import _relu, _tanh, numpy_mlp

_F32 = np.float32
_LOG_SQRT_2PI = _F32(np.log(np.sqrt(2 * np.pi)))
_ENTROPY_CONSTANT = _F32(0.5 + 0.5 * np.log(2 * np.pi))


def _tanh_slope(h: np.ndarray) -> np.ndarray:
    return 1 - h * h


def _relu_slope(h: np.ndarray) -> np.ndarray:
    return (h > 0).astype(_F32)


_SLOPES = {_tanh: _tanh_slope, _relu: _relu_slope}
"""The derivative of each activation, from its output."""


class _Network:
    """One MLP's weights (numpy views of the flat parameters) and gradient views (numpy views of the flat grads)."""

    def __init__(self, model, layers, activation) -> None:
        weights, self.activation = numpy_mlp(layers, activation)
        self.layers = weights  # ((weight.T [in, out], bias), ...)
        grads = model.flat.grads_numpy()
        self.grads = tuple((grads[model.flat.slice_of(w)].reshape(w.shape), grads[model.flat.slice_of(b)])
                           for w, b in layers)
        self.slope = _SLOPES[self.activation]

    def forward(self, x: np.ndarray) -> list[np.ndarray]:
        """Every layer's output, the input first (the backward needs them all)."""
        outs = [x]
        last = len(self.layers) - 1
        for i, (wt, b) in enumerate(self.layers):
            x = x @ wt
            x += b
            if i < last:
                x = self.activation(x)
            outs.append(x)
        return outs

    def backward(self, outs: list[np.ndarray], dz: np.ndarray) -> None:
        """Write d loss/d weights into the gradient views, from ``dz`` = d loss/d the last layer's output."""
        for i in range(len(self.layers) - 1, -1, -1):
            grad_w, grad_b = self.grads[i]
            np.matmul(dz.T, outs[i], out=grad_w)
            dz.sum(0, out=grad_b)
            if i:
                dz = (dz @ self.layers[i][0].T) * self.slope(outs[i])


class NumpyPPOGradient:
    """``gradient(batch, cfg, kl_coeff, vf_clip) -> (flat grads, stats)`` as :func:`~hpcrl.algos.ppo.gradient_and_stats`
    returns them, for plain ratios; build it with :func:`for_model`."""

    def __init__(self, model) -> None:
        pi_fast, vf_fast = model._fast
        self.discrete = model.discrete
        self.pi = _Network(model, *pi_fast)
        self.vf = _Network(model, *vf_fast)
        self.flat_grads = model.flat.grads
        self.grads = model.flat.grads_numpy()
        if not self.discrete:
            self.log_std = model.log_std.detach().numpy()
            self.grad_log_std = self.grads[model.flat.slice_of(model.log_std)]

    def gradient(self, batch, cfg, kl_coeff: float, vf_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        obs = _rows(batch["obs"])
        B = len(obs)
        pi_outs, vf_outs = self.pi.forward(obs), self.vf.forward(obs)
        logp, entropy, to_logp = self._policy(pi_outs, batch["actions"].numpy())

        mu_logp = batch["behaviour_logp"].numpy()
        log_r = logp - mu_logp
        r = np.exp(log_r)
        adv = batch["advantages"].numpy()
        if cfg.normalize_advantages and B > 1:
            centred = adv - _mean(adv)
            adv = centred / (np.sqrt(np.dot(centred, centred) / (B - 1)) + _F32(1e-8))  # std with B - 1, as torch's
        unclipped = r * adv
        clipped = np.minimum(np.maximum(r, 1.0 - cfg.clip), 1.0 + cfg.clip) * adv
        policy_loss = -_mean(np.minimum(unclipped, clipped))
        d_log_r = np.where(unclipped <= clipped, adv, _F32(0)) * r * _F32(-1.0 / B)
        r_less_1 = r - 1.0
        kl = _mean(r_less_1 - log_r)
        if kl_coeff != 0:
            d_log_r += _F32(kl_coeff / B) * r_less_1

        value = vf_outs[-1][:, 0]
        value_loss, d_value = self._value(value, batch, vf_clip, B)
        ent = _mean(entropy)

        self.grads.fill(0)
        to_logp(d_log_r, _F32(cfg.entropy_coeff / B))
        self.vf.backward(vf_outs, (_F32(cfg.vf_coeff) * d_value)[:, None])

        loss = policy_loss + cfg.vf_coeff * value_loss + (kl_coeff * kl if kl_coeff != 0 else 0.0) \
            - (cfg.entropy_coeff * ent if cfg.entropy_coeff != 0 else 0.0)
        norm = np.sqrt(np.dot(self.grads, self.grads))
        scale = min(cfg.max_grad_norm / (norm + 1e-6), 1.0)
        if scale < 1.0:
            self.grads *= _F32(scale)
        stats = np.array([loss, policy_loss, value_loss, kl, ent, np.count_nonzero(np.abs(r_less_1) > cfg.clip) / B,
                          _mean(r), 0.0, norm], dtype=_F32)
        return self.flat_grads, torch.from_numpy(stats)

    def _policy(self, outs: list[np.ndarray], actions: np.ndarray):
        """(log pi(a|s) [B], entropy [B], backward) from the policy network's layer outputs:
        ``backward(d_logp, entropy_weight)`` writes the policy's gradients (entropy_weight = entropy_coeff / B,
        the bonus's weight per row)."""
        out = outs[-1]
        if self.discrete:
            return self._categorical(outs, actions.reshape(len(out)).astype(np.intp, copy=False))
        return self._gaussian(outs, actions.reshape(out.shape).astype(_F32, copy=False))

    def _categorical(self, outs: list[np.ndarray], actions: np.ndarray):
        logits = outs[-1]
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        np.maximum(log_probs, np.finfo(_F32).min, out=log_probs)  # as the torch path clamps them
        probs = np.exp(log_probs)
        rows = np.arange(len(actions))
        entropy = -(probs * log_probs).sum(-1)

        def backward(d_logp: np.ndarray, entropy_weight: np.float32) -> None:
            g = probs * (log_probs + 1) * entropy_weight if entropy_weight else np.zeros_like(probs)
            g[rows, actions] += d_logp
            self.pi.backward(outs, g - probs * g.sum(-1, keepdims=True))

        return log_probs[rows, actions], entropy, backward

    def _gaussian(self, outs: list[np.ndarray], actions: np.ndarray):
        mean = outs[-1]
        log_std = self.log_std
        inv_var = np.exp(-2 * log_std)
        diff = actions - mean
        logp = (-(diff * diff) * (_F32(0.5) * inv_var) - (log_std + _LOG_SQRT_2PI)).sum(-1)
        entropy = np.full(len(mean), (_ENTROPY_CONSTANT + log_std).sum(), dtype=_F32)

        def backward(d_logp: np.ndarray, entropy_weight: np.float32) -> None:
            d = d_logp[:, None]
            self.pi.backward(outs, d * diff * inv_var)
            self.grad_log_std[:] = (d * (diff * diff * inv_var - 1)).sum(0) - entropy_weight * len(mean)

        return logp, entropy, backward

    def _value(self, value: np.ndarray, batch, vf_clip: float | None, B: int) -> tuple[float, np.ndarray]:
        """(0.5 mean squared error, its derivative by V per row) with torch.max's tie rule when clipped."""
        ret = batch["returns"].numpy()
        err = value - ret
        if vf_clip is None:
            return _F32(0.5) * _mean(err * err), err * _F32(1.0 / B)
        old = batch["values"].numpy()
        delta = value - old
        clipped_err = old + np.minimum(np.maximum(delta, -vf_clip), vf_clip) - ret
        plain, clipped = err * err, clipped_err * clipped_err
        inside = (delta >= -vf_clip) & (delta <= vf_clip)
        tie = _F32(0.5) * (plain == clipped)
        d = err * ((plain > clipped) + tie) + clipped_err * inside * ((clipped > plain) + tie)
        return _F32(0.5) * _mean(np.maximum(plain, clipped)), d * _F32(1.0 / B)


def _mean(x: np.ndarray) -> np.float32:
    """``x.mean()`` for float32 (the same pairwise sum) without numpy's Python wrapper around it."""
    return np.add.reduce(x, axis=None) / _F32(x.size)


def _rows(obs: torch.Tensor) -> np.ndarray:
    x = obs.numpy()
    return x.reshape(len(x), -1).astype(_F32, copy=False)


_BY_MODEL: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def for_model(model) -> NumpyPPOGradient | None:
    """The numpy gradient of ``model`` (kept with it), or None where it has none: a CNN or uint8 torso, weights
    off the CPU, an activation without a numpy twin."""
    if model not in _BY_MODEL:
        _BY_MODEL[model] = NumpyPPOGradient(model) if getattr(model, "_numpy", None) is not None else None
    return _BY_MODEL[model]
