"""AAPS weight sync (ClusterEnv): pull new weights only when the policy has drifted by > delta in KL.

The original sends the full state dict every step and only skips loading it. Here the
parameter rank publishes, next to each version on the weight board, the policy's outputs on
a fixed probe batch of states (Categorical log-probabilities, or Gaussian means plus the
log-std); an actor evaluates its own policy on the same states, computes the mean KL
divergence KL(published || own) over the probe batch, and pulls the full weights only
when it exceeds ``actors.aaps_delta``.

Two variants live here. :class:`Probe` (``actors.weight_sync: aaps``) is what the runtime's actors
use: an actor decides alone from the weight board, with no message per decision, which suits many
actor ranks polling one parameter rank. :class:`VisitedStateAAPS` is the seed's rule (KL over the
states the actor visited) and is what ``hpcrl.ClusterEnv`` uses, where the head already receives
those states with every step; the runtime's actors would need their fragments' policy outputs sent
to the learner and an estimate sent back to use it (a later change, not a different rule).
"""
from __future__ import annotations

import numpy as np
import torch


def probe_states(env_cfg, batch: int) -> np.ndarray:
    """``batch`` states visited by a uniformly random policy from a fixed seed (made on one rank).

    Any env kind, through the actors' backend (:mod:`hpcrl.runtime.roles.env_backends`) with one env
    (for a batched env one instance, for a parallel env one copy: all its agents' observations).
    """
    from hpcrl.runtime.roles.env_backends import make_backend

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


class VisitedStateAAPS:
    """The seed's AAPS (ClusterEnv Section III-C, Algorithm 2): sync when, over the states this actor
    recently visited, the running mean of KL(pi_cached(.|s) || pi_head(.|s)) exceeds ``delta``.

    Direction and states as in the seed's equation E_{s~D}[D_KL(pi_theta'(.|s) || pi_theta(.|s))] > delta
    => theta' <- theta: theta' is the actor's cached (acting) policy, theta the learner's newest, and D
    the actor's recently visited states. Algorithm 2 writes the same test as KL(pi_actor, pi_cached)
    with pi_cached the fetched head copy. Here the actor's own outputs (log-probabilities, or Gaussian
    mean and log-std) on the states it acted in are kept in a ring of ``window`` states; whoever holds
    the newest weights evaluates them on those states (:meth:`estimate`), so no weights move to decide.
    Entries made by an older cached version are dropped when the actor's version changes (a sync).
    """

    def __init__(self, delta: float, window: int, width: int, obs_shape: tuple, discrete: bool):
        if delta < 0 or window < 1 or width < 1:
            raise ValueError("VisitedStateAAPS: delta >= 0, window >= 1, width >= 1")
        self.delta, self.window, self.width, self.discrete = delta, window, width, discrete
        self.states = np.zeros((window, *obs_shape), dtype=np.float32)
        self.outputs = np.zeros((window, width), dtype=np.float32)
        self.count = 0
        self._next = 0
        self.version = -1
        self.last_kl = 0.0

    def observe(self, states: np.ndarray, outputs: np.ndarray, version: int) -> None:
        """Add the states the actor acted in and its cached policy's outputs there (made by ``version``)."""
        if version != self.version:
            self.count, self._next, self.version = 0, 0, version
        states = states[-self.window:]
        outputs = outputs[-self.window:]
        n = len(states)
        idx = (self._next + np.arange(n)) % self.window
        self.states[idx] = states
        self.outputs[idx] = outputs
        self._next = int((self._next + n) % self.window)
        self.count = min(self.window, self.count + n)

    def estimate(self, newest_outputs) -> float:
        """Mean KL(cached || newest) over the ring; ``newest_outputs(states) -> (B, width)`` runs the
        newest policy. 0.0 while the ring is empty (nothing visited since the last sync)."""
        if self.count == 0:
            self.last_kl = 0.0
        else:
            self.last_kl = self.kl(self.outputs[:self.count], np.asarray(newest_outputs(self.states[:self.count])))
        return self.last_kl

    def drifted(self, kl: float | None = None) -> bool:
        return (self.last_kl if kl is None else kl) > self.delta

    def kl(self, p: np.ndarray, q: np.ndarray) -> float:
        """Mean over rows of KL(p || q): rows of log-probabilities, or of Gaussian means then log-stds."""
        p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
        if self.discrete:
            return float((np.exp(p) * (p - q)).sum(-1).mean())
        d = self.width // 2
        mp, sp, mq, sq = p[:, :d], p[:, d:], q[:, :d], q[:, d:]
        kl = sq - sp + (np.exp(2 * sp) + (mp - mq) ** 2) / (2 * np.exp(2 * sq)) - 0.5
        return float(kl.sum(-1).mean())
