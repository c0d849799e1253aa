"""Dynamic learner sharing in a run (MARLess section 4.3): the MARL algorithms' side of two contract hooks.

Learners: ``learner_report(batch)`` sends ``algo.sharing_samples_per_agent`` rows per agent of
each prepared batch (spread evenly over the batch: the latest trajectories, as the seed's learner
functions use them). Parameter rank: ``end_round(model, round_stats)`` receives the round's
finished episodes and those reports, and :class:`ParameterSharing` makes the round's
:class:`~hpcrl.marl.sharing.LearnerSharing` decision from them:

- the per-agent reward of round t is the mean return of the episodes that agent's instances
  (agent = ``env_index`` mod A) finished in the round; a round in which some agent finished none
  is left out of the window (no evidence);
- similarity (4.3.2): each agent's (observation, one-hot action) rows of the newest report;
- convexity of a slot (4.3.4, Eq. 1): Lanczos on Hessian-vector products of the algorithm's loss
  on the newest report's rows with respect to that slot's parameters.

A change is applied to the parameter rank's model at once (weight copies, then the new map; the
next published version carries both to every role), the Adam state of every slot that received
a copy is dropped (it restarts from zero moments), and each agent whose policy changed becomes a
``policy_map`` row of run.h5 (``records``). The strategy (sharing on or off) starts from the
model's map: on when some agents share a slot (``policies: shared``).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from hpcrl.algos.adam import Adam
from hpcrl.marl.convexity import loss_convexity_ratio
from hpcrl.marl.model import copy_slot
from hpcrl.marl.sharing import LearnerSharing, MappingChange

Report = Mapping[str, np.ndarray]


def agent_returns(episodes: Mapping[str, Sequence], agents: int) -> np.ndarray | None:
    """[A] mean return per agent over ``episodes`` (columns: env_index, return); None if an agent has none."""
    agent = np.asarray(episodes["env_index"], dtype=np.int64) % agents
    counts = np.bincount(agent, minlength=agents)
    if (counts == 0).any():
        return None
    return np.bincount(agent, weights=np.asarray(episodes["return"], dtype=np.float64), minlength=agents) / counts


def spread_rows(agent: np.ndarray, agents: int, per_agent: int) -> np.ndarray:
    """Row indices: up to ``per_agent`` rows of each agent, evenly spaced over that agent's rows."""
    out = []
    for j in range(agents):
        rows = np.flatnonzero(agent == j)
        if rows.size:
            out.append(rows[np.unique(np.linspace(0, rows.size - 1, min(per_agent, rows.size)).astype(np.int64))])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


@torch.no_grad()
def reset_slot_state(optimizer: Adam, model: nn.Module, slot: int) -> None:
    """Forget the optimizer's state (Adam's moments and step) of one policy slot's parameters."""
    for p in model.policy_parameters(slot):
        optimizer.state.pop(p, None)
    log_std = getattr(model, "log_std", None)
    if log_std is not None and log_std in optimizer.state:  # one parameter for all slots: clear its row
        for value in optimizer.state[log_std].values():
            if torch.is_tensor(value) and value.shape == log_std.shape:
                value[slot].zero_()


def apply_change(model: nn.Module, optimizer: Adam | None, change: MappingChange) -> None:
    """Weight copies (and their slots' optimizer state reset), then the new agent -> policy map."""
    for src, dst in change.copies:
        copy_slot(model, src, dst)
        if optimizer is not None:
            reset_slot_state(optimizer, model, dst)
    model.set_mapping(change.new)


def policy_map_rows(change: MappingChange) -> list[dict[str, Any]]:
    """One policy_map row per agent whose slot changed."""
    copied = {dst: src for src, dst in change.copies}
    policies = len(set(change.new))
    return [{"round": change.round, "agent": i, "old_policy": o, "new_policy": n, "reason": change.reason,
             "policies": policies, "copied_from": copied.get(n, -1)}
            for i, (o, n) in enumerate(zip(change.old, change.new)) if o != n]


class ParameterSharing:
    """The parameter rank's sharing state: the decision maker, the newest learner report, the rows to record.

    ``cfg``: the algo config (its ``sharing_*`` fields); ``samples(model, report)`` -> each agent's [n, d]
    (observation, action) rows; ``loss(model, report)`` -> the algorithm's loss on the report's rows (differentiable)."""

    def __init__(self, cfg: Any, agents: int, samples: Callable[[nn.Module, Report], list[np.ndarray]],
                 loss: Callable[[nn.Module, Report], Tensor], seed: int = 0) -> None:
        self.cfg, self.agents = cfg, agents
        self.samples_fn, self.loss_fn = samples, loss
        self.seed = seed
        self.decider: LearnerSharing | None = None
        self.report: Report | None = None
        self.rows: list[dict[str, Any]] = []
        self.changes: list[MappingChange] = []

    def end_round(self, model: nn.Module, optimizer, round_stats: Mapping[str, Any]) -> MappingChange | None:
        reports = round_stats.get("reports") or []
        if reports:
            self.report = reports[-1]
        rewards = agent_returns(round_stats.get("episodes") or {"env_index": [], "return": []}, self.agents)
        if rewards is None or self.report is None:
            return None
        current = model.mapping().tolist()
        if self.decider is None:  # also after a resume: the strategy follows the restored map
            cfg = self.cfg
            self.decider = LearnerSharing(self.agents, cfg.sharing_window, cfg.sharing_gamma, cfg.sharing_components,
                                          self.seed)
            self.decider.toggle.sharing = len(set(current)) < self.agents
        report = self.report
        change = self.decider.end_round(int(round_stats.get("round", 0)), rewards, current,
                                        lambda: self.samples_fn(model, report),
                                        lambda slot: self.convexity(model, report, slot))
        if change is not None:
            apply_change(model, optimizer, change)
            self.rows += policy_map_rows(change)
            self.changes.append(change)
        return change

    def convexity(self, model: nn.Module, report: Report, slot: int) -> float:
        """C of one slot (Eq. 1) on the report's rows."""
        with torch.enable_grad():
            loss = self.loss_fn(model, report)
            return loss_convexity_ratio(loss, model.policy_parameters(slot), self.cfg.sharing_lanczos_steps,
                                         self.seed)

    def records(self) -> dict[str, list[dict[str, Any]]]:
        rows, self.rows = self.rows, []
        return {"policy_map": rows} if rows else {}


class SharingHooks:
    """The contract methods sharing adds to a MARL algorithm (put before :class:`~hpcrl.algos.base.Algorithm`
    in the bases). The algorithm supplies ``sharing_report(batch)``, ``sharing_samples(model, report)``
    and ``sharing_loss(model, report)``, and calls :meth:`_setup_sharing` in its constructor."""

    def _setup_sharing(self) -> None:
        self.sharing = (ParameterSharing(self.cfg, self.cfg.agents, self.sharing_samples, self.sharing_loss)
                        if self.cfg.sharing else None)
        self._optimizer = None

    def make_optimizer(self, model):
        self._optimizer = super().make_optimizer(model)  # kept to reset the state of copied slots
        return self._optimizer

    def learner_report(self, batch):
        return None if self.sharing is None else self.sharing_report(batch)

    def end_round(self, model, round_stats):
        """The round's sharing decision: a new map goes into the flat buffer, its rows to policy_map."""
        out = super().end_round(model, round_stats)
        if self.sharing is not None:
            self.sharing.end_round(model, self._optimizer, round_stats)
        return out

    def records(self):
        return {} if self.sharing is None else self.sharing.records()

    def parameter_state(self):
        out = super().parameter_state()
        if self.sharing is not None:  # the tolerant window, the enablings j and the newest report
            out["sharing"] = {"decider": self.sharing.decider, "report": self.sharing.report}
        return out

    def load_parameter_state(self, state):
        super().load_parameter_state(state)
        if self.sharing is not None and "sharing" in state:
            self.sharing.decider, self.sharing.report = state["sharing"]["decider"], state["sharing"]["report"]
