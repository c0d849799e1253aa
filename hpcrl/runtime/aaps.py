"""AAPS weight sync (ClusterEnv): pull new weights only when the policy has drifted by > delta in KL.

The original sends the full state dict every step and only skips loading it. Here the
parameter rank publishes, next to each version on the weight board, the policy's outputs on
a fixed probe batch of states (Categorical log-probabilities, or Gaussian means plus the
log-std); an actor evaluates its own policy on the same states, computes the mean KL
divergence KL(published || own) over the probe batch, and pulls the full weights only
when it exceeds ``actors.aaps_delta``.
"""
from __future__ import annotations

import numpy as np
import torch


def probe_states(env_cfg, batch: int) -> np.ndarray:
    """``batch`` states visited by a uniformly random policy from a fixed seed (made on one rank).

    Any env kind, through the actors' backend (:mod:`hpcrl.runtime.env_backends`) with one env
    (for a batched env one instance, for a parallel env one copy: all its agents' observations).
    """
    from hpcrl.runtime.env_backends import make_backend

    backend = make_backend(env_cfg, count=1)
    seed = env_cfg.seed + 4242
    try:
        backend.action_space.seed(seed)
        obs = backend.reset(seed)
        states = []
        while len(states) < batch:
            states.extend(obs)
            actions = np.stack([np.asarray(backend.action_space.sample()) for _ in range(backend.num_envs)])
            obs = backend.step(actions).obs
    finally:
        backend.close()
    return np.stack(states[:batch]).astype(np.float32)


class Probe:
    """Policy outputs on the probe states, and the KL between two such output vectors."""

    def __init__(self, states: np.ndarray, model, delta: float):
        self.states = states
        self.discrete = model.discrete
        self.delta = delta
        with torch.no_grad():
            self.width = int(model.pi(model._obs(states)).shape[-1])
        self.size = len(states) * self.width + (0 if self.discrete else self.width)
        self._published = np.empty(self.size, dtype=np.float32)

    @torch.no_grad()
    def outputs(self, model) -> np.ndarray:
        out = model.pi(model._obs(self.states))
        if self.discrete:
            return torch.log_softmax(out, dim=-1).reshape(-1).cpu().numpy().astype(np.float32)
        return torch.cat([out.reshape(-1), model.log_std.reshape(-1)]).cpu().numpy().astype(np.float32)

    def kl(self, p: np.ndarray, q: np.ndarray) -> float:
        """Mean over probe states of KL(p || q) for two output vectors of :meth:`outputs`."""
        B, W = len(self.states), self.width
        if self.discrete:
            lp, lq = p.reshape(B, W).astype(np.float64), q.reshape(B, W).astype(np.float64)
            return float((np.exp(lp) * (lp - lq)).sum(-1).mean())
        mp, mq = p[:B * W].reshape(B, W).astype(np.float64), q[:B * W].reshape(B, W).astype(np.float64)
        sp, sq = p[B * W:].astype(np.float64), q[B * W:].astype(np.float64)
        kl = sq - sp + (np.exp(2 * sp) + (mp - mq) ** 2) / (2 * np.exp(2 * sq)) - 0.5
        return float(kl.sum(-1).mean())

    def drifted(self, model, board) -> bool:
        """True when the newest published policy is more than ``delta`` (KL) away from ``model``."""
        if board.read_probe(self._published) < 0:
            return False
        return self.kl(self._published, self.outputs(model)) > self.delta
