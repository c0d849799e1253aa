"""The algorithm contract: what trains, separated from where it runs.

An :class:`Algorithm` is one object per role (each rank or thread builds its own from the
config). Its methods are named for the role that calls them; the runtime (``hpcrl.runtime``,
either runner) moves fragments, gradients and weights between the roles and never looks
inside them::

    actor      act(model, obs) -> (actions, behaviour_logp, values)   one env step of N instances
               greedy(model, obs) -> actions                          evaluation episodes (no exploration)
               value(model, obs) -> values                            bootstrap of truncated steps
    learner    prepare(fragments, model) -> batch                     post-processing (e.g. GAE)
               minibatches(batch, generator) -> iterator              one gradient push each
               compute_gradient(minibatch, model, window) -> (flat gradient, stats)
               gradient_tensors(minibatch, model) -> (flat gradient, stats tensor)   no host sync: a CUDA
                                                                      learner replays it from a graph (optional;
                                                                      stats named by gradient_stat_names)
               learner_report(batch) -> dict or None                  a small summary for end_round (optional)
               assign_learner(group, active_groups)                   which group this is, before each batch (optional)
    parameter  make_optimizer(model)
               aggregate(step) -> gradient                            an admitted step's gradients in one (Stellaris V-C)
               apply(model, optimizer, gradient)                      one admitted (aggregated) step
               learner_groups_needed(model, groups) -> int or None    active groups the algorithm sets (None: elastic rule)
               end_round(model, round_stats) -> {key: value}          once per round (adaptive KL in place...); returns
                                                                      only ROUND_CHANGES keys (active_actors)
               records() -> {table: [row, ...]}                       rows for run.h5 (optional)
               parameter_state() / load_parameter_state(state)        what end_round keeps between rounds,
                                                                      in the checkpoint (optional)
    fused loop update(batch, model, optimizer) -> stats               compute_gradient + apply, in place
    everyone   make_model(obs_space, action_space, device)

What is published to actors and learners is the model's flat parameter buffer
(:class:`hpcrl.models.FlatParameters`): everything an actor or learner needs lives in it,
including non-trained values such as PPO's adaptive KL coefficient (parameters with
``requires_grad=False``, which :meth:`make_optimizer` leaves out).

Learner -> parameter rank: what :meth:`learner_report` returns for a prepared batch (a dict of
small NumPy arrays, or None for nothing) travels with the group's ``learner_activity`` row (the
reports channel both runners have) and reaches :meth:`end_round` in ``round_stats["reports"]``,
beside the round's finished episodes (``round_stats["episodes"]``: columns ``actor``, ``env_index``,
``return``). Rows :meth:`records` returns are appended to run.h5's tables (``hpcrl.io.schema``)
after each :meth:`end_round`. MARL's dynamic learner sharing (:mod:`hpcrl.marl.sharing_rank`) is
built on these two hooks; the runtime knows nothing of agents or policies.

``window``: Stellaris' importance-sampling truncation (Eq. 2) needs the log-probabilities of
the minibatch under the other learner groups' base versions. When :attr:`uses_window` is
True the learner evaluates :meth:`logps` with those snapshots and passes them as a
[K-1, B] tensor; otherwise ``window`` is None.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from hpcrl.algos.adam import Adam
from hpcrl.staleness import Step, aggregate

Batch = dict[str, Tensor]

ROUND_CHANGES = {
    "active_actors": "int: actor ranks 0 .. n-1 sample the next round, the others park (MARL actor scaling)",
}
"""The keys :meth:`Algorithm.end_round` may return, each acted on by the parameter rank. A setting that lives in
the model's flat buffer (PPO's and IMPACT's KL coefficient, IMPACT's target copy, IQL's epsilon, MARL
sharing's policy map) is changed there in place and reaches the roles with the next published version:
it is not returned."""


def round_changes(algo: "Algorithm", changed: Mapping[str, Any] | None) -> dict[str, Any]:
    """What ``algo.end_round`` returned, checked: ValueError (one line, naming the allowed keys) for any other key."""
    unknown = sorted(set(changed or {}) - set(ROUND_CHANGES))
    if unknown:
        raise ValueError(f"{algo.name or type(algo).__name__}.end_round returned {', '.join(unknown)}; it may return "
                         f"only {', '.join(ROUND_CHANGES)} (a setting in the flat buffer is changed in place)")
    return dict(changed or {})


class Algorithm:
    """Base class: subclasses set :attr:`name` and implement the learner-side methods."""

    name: str = ""
    uses_window: bool = False
    """True when :meth:`compute_gradient` wants the other learners' log-probs (IS truncation)."""

    def __init__(self, cfg: Any, model_cfg: Any) -> None:
        self.cfg = cfg
        self.model_cfg = model_cfg

    # ---- every role -----------------------------------------------------------------------
    def make_model(self, obs_space: spaces.Space, action_space: spaces.Space,
                   device: str | torch.device = "cpu") -> nn.Module:
        """The network whose ``flat`` buffer is trained, published and checkpointed."""
        from hpcrl.models import ActorCritic

        return ActorCritic(obs_space, action_space, self.model_cfg, device=device)

    # ---- actor ----------------------------------------------------------------------------
    def act(self, model: nn.Module, obs: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
        """Actions (unclipped samples for Box), their log-probs and V(obs) for a batch [N, ...]
        (every model's ``act`` runs under no_grad already: a second context would be pure overhead)."""
        return model.act(obs)

    def act_numpy(self, model: nn.Module, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`act`'s three results as numpy arrays, the sampler's call once per env step: the model's own
        ``act_numpy`` (ActorCritic: a numpy forward, hpcrl/inference.py) where this algorithm acts with the model's
        ``act``; an algorithm with an ``act`` of its own keeps it."""
        if type(self).act is Algorithm.act and hasattr(model, "act_numpy"):
            return model.act_numpy(obs)
        a, logp, v = self.act(model, obs)
        return a.cpu().numpy(), logp.cpu().numpy(), v.cpu().numpy()

    @torch.no_grad()
    def value(self, model: nn.Module, obs: np.ndarray) -> Tensor:
        return model.value(obs)

    @torch.no_grad()
    def greedy(self, model: nn.Module, obs: np.ndarray) -> Tensor:
        """The actions an evaluation takes: the policy without its exploration."""
        return model.greedy(obs)

    # ---- learner --------------------------------------------------------------------------
    def prepare(self, fragments: Sequence[Mapping], model: nn.Module) -> Batch:
        raise NotImplementedError

    def minibatches(self, batch: Batch, generator: torch.Generator) -> Iterator[Batch]:
        """The minibatches of one batch, one gradient push each (default: the whole batch once)."""
        yield batch

    def compute_gradient(self, minibatch: Batch, model: nn.Module,
                         window: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
        """The flat gradient (``model.flat.grads``) and stats: floats or 0-dim tensors (a device loop
        must not wait for the host), with at least ``loss``; ``policy_loss``, ``value_loss``,
        ``entropy`` and ``kl`` are recorded when present."""
        raise NotImplementedError

    def learner_report(self, batch: Batch) -> dict[str, Any] | None:
        """A small picklable summary of a prepared batch for the parameter rank's :meth:`end_round`
        (sent after the batch's gradients; default: nothing)."""
        return None

    def assign_learner(self, group: int, active_groups: int) -> None:
        """The learner group this object computes for and the active groups, told before each batch
        (MARL policy learners train the policies assigned to their group; default: nothing)."""

    @torch.no_grad()
    def logps(self, model: nn.Module, minibatch: Batch) -> Tensor:
        """log pi(a|s) of the minibatch actions under ``model`` (a snapshot of another version)."""
        return model.evaluate(minibatch["obs"], minibatch["actions"])[0]

    # ---- parameter rank -------------------------------------------------------------------
    def make_optimizer(self, model: nn.Module) -> Adam | torch.optim.SGD:
        params = [p for p in model.parameters() if p.requires_grad]
        if getattr(self.cfg, "optimizer", "adam") == "sgd":
            return torch.optim.SGD(params, lr=self.cfg.lr)
        return Adam(params, lr=self.cfg.lr, eps=1e-5)

    def aggregate(self, step: Step) -> np.ndarray:
        """One admitted step's (gradient record, lr scale) pairs as one flat gradient: Stellaris' mean."""
        return aggregate(step)

    def learner_groups_needed(self, model: nn.Module, groups: int) -> int | None:
        """How many learner groups must be active now, at most ``groups`` (the parameter rank asks at the
        start and after every round); None (default): the elastic rule decides (runtime/roles/elastic.py)."""
        return None

    def apply(self, model: nn.Module, optimizer: Adam | torch.optim.SGD, gradient: np.ndarray) -> None:
        """One optimizer step with an admitted (already staleness-scaled and averaged) flat gradient."""
        if gradient is not model.flat.grads:  # the fused update's gradient is the buffer itself
            model.flat.grads.copy_(torch.as_tensor(gradient, device=model.flat.grads.device))
        optimizer.step()

    def update(self, batch: Batch, model: nn.Module, optimizer: Adam | torch.optim.SGD) -> dict[str, Tensor]:
        """One training step where the learner and the parameter role share the model (the fused loop):
        a gradient at the current weights, applied at once. An algorithm whose paper orders its
        losses within a step (HDDPG: critic, then actor through the new critic) overrides this."""
        gradient, stats = self.compute_gradient(batch, model)
        self.apply(model, optimizer, gradient)
        return stats

    def end_round(self, model: nn.Module, round_stats: Mapping[str, Any]) -> dict[str, Any]:
        """Called by the parameter rank when a round ends; changes the model's untrained values in place and
        returns what the runtime must act on: only keys of :data:`ROUND_CHANGES` (any other is an error).

        ``round_stats``: ``round`` (its index), ``kl`` (mean KL of the admitted gradients, NaN if
        none), ``episodes`` (the round's finished episodes: dicts with ``actor``, ``env_index``,
        ``return``), ``reports`` (the :meth:`learner_report` results received in the round) and ``actors``
        (``count``: actor ranks, ``active``: those sampling now). A returned ``active_actors`` (an int) sets
        the actor ranks that sample the next round: 0 .. n-1; the others park (MARL actor scaling)."""
        return {}

    def records(self) -> dict[str, list[dict[str, Any]]]:
        """Rows for run.h5 tables made since the last call (table name -> rows); the parameter rank
        appends them after :meth:`end_round`. Default: none."""
        return {}

    def parameter_state(self) -> dict[str, Any]:
        """State the parameter rank's :meth:`end_round` keeps from round to round that does not live in
        the flat buffer (e.g. MARL sharing's tolerant window); saved in each checkpoint (picklable).
        Default: none."""
        return {}

    def load_parameter_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`parameter_state` returned (``--resume``)."""
