"""The actor's policy call in numpy, for an :class:`~hpcrl.models.ActorCritic` of MLPs on the CPU.

At an actor's batch (1-8 rows of a few dozen floats) torch spends far more on dispatching each of the
forward's ~17 operations than on the arithmetic; the same network in numpy costs about a quarter as much
(Hopper's 2 x 64 policy and value at batch 1: ~50 vs ~200 us on the 2-core VM; docs/results/step-cost.md).
The weights are numpy views of the model's flat buffer, so every version the actor loads into it is
used without a copy.

Not the same bits as :meth:`ActorCritic.act`: numpy's BLAS sums a layer in another order (the means and
values differ by a few float32 ulps). The random numbers are the same: the standard normal (Box) or
uniform (Discrete) draws come from the model's torch generator as before. The learner's log-probs of the
recorded actions therefore differ from the recorded ones by about 1e-6, so a first epoch's importance
ratio is 1 within that, not exactly 1. The log-prob of a Box action is that of its standard-normal draw
``eps``: ``sum(-eps^2 / 2 - log_std - log sqrt(2 pi))``, which is the Normal's log-density at
``mean + std * eps``.
"""
from __future__ import annotations

import math

import numpy as np
import torch

_LOG_SQRT_2PI = np.float32(math.log(math.sqrt(2 * math.pi)))


def _tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=x)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, out=x)


_NUMPY_ACTIVATIONS = {torch.tanh: _tanh, torch.relu: _relu}
"""The numpy twin of each activation :class:`~hpcrl.models.MLP` calls (in place: its input is a fresh array)."""


def numpy_mlp(layers, activation) -> tuple[tuple[tuple[np.ndarray, np.ndarray], ...], object] | None:
    """((weight.T, bias) as numpy views, numpy activation) of an MLP's ``(weight, bias)`` layers on the CPU, or
    None where numpy cannot run it (another device or activation)."""
    act = _NUMPY_ACTIVATIONS.get(activation)
    if act is None or any(w.device.type != "cpu" or w.dtype != torch.float32 for w, _ in layers):
        return None
    return tuple((w.detach().numpy().T, b.detach().numpy()) for w, b in layers), act


def run_numpy_mlp(layers, activation, x: np.ndarray) -> np.ndarray:
    last = len(layers) - 1
    for i, (wt, b) in enumerate(layers):
        x = x @ wt
        x += b
        if i < last:
            x = activation(x)
    return x


class NumpyActorCritic:
    """``act(obs) -> (actions, log-probs, values)`` as numpy arrays, the numbers :meth:`ActorCritic.act` gives
    (see the module docstring for how close); build it with :meth:`of`."""

    def __init__(self, model, pi, vf) -> None:
        self.model = model
        self.pi, self.vf = pi, vf
        self.discrete = model.discrete
        self.action_shape = model.action_shape
        self.log_std = None if model.discrete else model.log_std.detach().numpy()
        self._draws: dict[tuple[int, ...], tuple[torch.Tensor, np.ndarray]] = {}

    def _draw(self, shape: tuple[int, ...], uniform: bool) -> np.ndarray:
        """Standard normal (or uniform [0, 1)) numbers from the model's generator, the numbers ``torch.randn`` (or
        ``torch.rand``) of ``shape`` draws, into a tensor kept per shape: a quarter of randn's cost per call, and
        valid until the next draw of that shape."""
        kept = self._draws.get(shape)
        if kept is None:
            tensor = torch.empty(shape)
            kept = self._draws[shape] = (tensor, tensor.numpy())
        if uniform:
            kept[0].uniform_(generator=self.model.sampling_generator)
        else:
            kept[0].normal_(generator=self.model.sampling_generator)
        return kept[1]

    @classmethod
    def of(cls, model) -> "NumpyActorCritic | None":
        """The numpy policy call of ``model``, or None where it has none (a CNN or uint8 network, GPU weights,
        an activation numpy does not have here)."""
        pi_fast, vf_fast = model._fast
        if pi_fast is None or vf_fast is None:
            return None
        pi, vf = numpy_mlp(*pi_fast), numpy_mlp(*vf_fast)
        if pi is None or vf is None:
            return None
        return cls(model, pi, vf)

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        out = run_numpy_mlp(*self.pi, x)
        value = run_numpy_mlp(*self.vf, x)[:, 0]
        if self.discrete:
            return (*self._categorical(out, self._draw((len(out), 1), uniform=True)), value)
        eps = self._draw(out.shape, uniform=False)
        log_std = self.log_std
        actions = out + np.exp(log_std) * eps
        logp = (np.float32(-0.5) * (eps * eps) - (log_std + _LOG_SQRT_2PI)).sum(-1)
        return actions.reshape(actions.shape[:-1] + self.action_shape), logp, value

    @staticmethod
    def _categorical(logits: np.ndarray, uniform: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(action, its log-prob) per row: the inverse-CDF draw of :func:`~hpcrl.models._inverse_cdf_draw` on
        log-softmax probabilities, clamped to finite values as the torch path clamps them."""
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        np.maximum(log_probs, np.finfo(np.float32).min, out=log_probs)
        cdf = np.exp(log_probs).cumsum(-1)
        u = uniform * cdf[:, -1:]
        a = (cdf <= u).sum(-1)
        return a, log_probs[np.arange(len(a)), a]
