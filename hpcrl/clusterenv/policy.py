"""Worker-side inference: the policy a worker acts with, and the head's AAPS bookkeeping.

A policy is any ``torch.nn.Module`` with ``dist(obs) -> Categorical | Normal`` (hpcrl's
:class:`~hpcrl.models.ActorCritic` has it), built on every worker by the same factory
``factory(single_observation_space, single_action_space)``. Its parameters travel as one flat
float32 vector on a :class:`~hpcrl.runtime.transport.windows.WeightBoard` owned by the head: a worker pulls
it with one-sided ``Get``s only when AAPS says so (:class:`~hpcrl.runtime.roles.aaps.VisitedStateAAPS`).
The "outputs" of a policy at a state are the log-probabilities (Discrete) or the Gaussian means
then log-stds (Box): what the KL needs, and what a worker returns with each action.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from hpcrl.errors import ConfigError


def actor_critic_factory(hidden_sizes=(64, 64), activation: str = "tanh"):
    """A factory for hpcrl's ActorCritic (separate policy and value MLPs), picklable by reference."""
    return _ActorCriticFactory(tuple(hidden_sizes), activation)


class _ActorCriticFactory:
    def __init__(self, hidden_sizes: tuple, activation: str):
        self.hidden_sizes, self.activation = hidden_sizes, activation

    def __call__(self, obs_space, action_space):
        from hpcrl.models import ActorCritic

        cfg = SimpleNamespace(hidden_sizes=list(self.hidden_sizes), activation=self.activation)
        return ActorCritic(obs_space, action_space, cfg)


def make_policy(factory, obs_space, action_space):
    """Build the module and check that it has ``dist``."""
    module = factory(obs_space, action_space)
    if not callable(getattr(module, "dist", None)):
        raise ConfigError("policy: the factory's module has no dist(obs) method; allowed: a torch module "
                          "whose dist(obs) returns a Categorical or Normal (e.g. hpcrl.models.ActorCritic)")
    return module


def outputs(dist) -> "np.ndarray":
    """(B, width) float32: log-probabilities of a Categorical, or means then log-stds of a Normal."""
    import torch

    if hasattr(dist, "logits") and not hasattr(dist, "loc"):
        out = dist.logits
    else:
        out = torch.cat([dist.loc, dist.scale.log().expand_as(dist.loc)], dim=-1)
    return out.detach().cpu().numpy().astype(np.float32, copy=False)


def flat_parameters(module) -> np.ndarray:
    import torch

    with torch.no_grad():
        return torch.nn.utils.parameters_to_vector(module.parameters()).detach().cpu().numpy().astype(np.float32)


def load_flat(module, flat: np.ndarray) -> None:
    import torch

    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(torch.as_tensor(flat), module.parameters())


def describe(module, obs_space) -> tuple[int, int, bool]:
    """(number of parameters, output width, discrete) of a policy module."""
    import torch

    with torch.no_grad():
        d = module.dist(torch.zeros((1, *obs_space.shape), dtype=torch.float32))
    width = outputs(d).shape[-1]
    discrete = hasattr(d, "logits") and not hasattr(d, "loc")
    return int(flat_parameters(module).size), int(width), discrete


class WorkerPolicy:
    """A worker's cached policy: acts on its envs' observations, pulls weights when AAPS says so."""

    def __init__(self, module, board, action_space, kl_threshold: float):
        self.module, self.board = module, board
        self.kl_threshold = kl_threshold
        self.version = -1
        self.syncs = 0
        self._flat = np.empty(board.num_params, dtype=np.float32)
        self._box = getattr(action_space, "low", None) is not None
        self._low, self._high = (action_space.low, action_space.high) if self._box else (None, None)

    def maybe_sync(self, kl_estimate: float, newest: int) -> bool:
        """Pull the newest weights before the first step, and afterwards when the estimate exceeds delta."""
        if newest < 0 or newest == self.version:
            return False
        if self.version >= 0 and not kl_estimate > self.kl_threshold:
            return False
        version = self.board.read_latest(self._flat)
        load_flat(self.module, self._flat)
        self.version = version
        self.syncs += 1
        return True

    def act(self, obs: np.ndarray):
        """(actions as sampled, their log-probs, the outputs, actions for the env (Box: clipped))."""
        import torch

        with torch.no_grad():
            d = self.module.dist(torch.as_tensor(obs, dtype=torch.float32))
            a = d.sample()
            logp = d.log_prob(a)
            if logp.dim() > 1:
                logp = logp.sum(-1)
        actions = a.cpu().numpy()
        env_actions = np.clip(actions, self._low, self._high) if self._box else actions
        return actions, logp.cpu().numpy(), outputs(d), env_actions
