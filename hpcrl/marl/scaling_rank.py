"""Cost-aware actor scaling in a run (MARLess section 4.4, Eq. 2): the MARL algorithms' side of the contract.

Learners send the same report as dynamic learner sharing (``sharing_samples_per_agent`` rows per
agent of each prepared batch, :mod:`hpcrl.marl.sharing_rank`). At the end of every round the
parameter rank's ``end_round``, after any sharing decision, computes the convexity ratio C of
each policy in use (Lanczos on Hessian-vector products of the algorithm's loss on the newest
report's rows, as sharing does) and feeds them to :class:`~hpcrl.marl.actor_scaling.ActorScaler`:
per-policy windows of ``actor_scaling_window`` rounds, S^j, I^j = clip(S^j I_max, I_min, I_max) and the
beta rule for the total I_t. ``end_round`` returns ``{"active_actors": I_t}``: the runtime lets
actor ranks 0 .. I_t-1 sample the next round, parks the others and shrinks the round's data to
I_t / actors.count of its size (``Plan.round_steps_for``). Before the first learner report
every actor stays active.

Every round becomes one ``actor_scaling`` row of run.h5 (``records``): round, demanded I_t,
active actors for the next round, policies, each policy's I^j, whether the count changed, and
the reason (the branch of Eq. 2 with I_average and the threshold).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import Tensor, nn

from hpcrl.marl.actor_scaling import ActorScaler, scaling_bounds
from hpcrl.marl.convexity import loss_convexity_ratio

Report = Mapping[str, np.ndarray]


class ParameterScaling:
    """The parameter rank's actor-scaling state: the scaler (built at the first round, when the actor count is
    known), the newest learner report, the rows to record. ``loss(model, report)``: the algorithm's loss."""

    def __init__(self, cfg: Any, loss: Callable[[nn.Module, Report], Tensor], seed: int = 0) -> None:
        self.cfg, self.loss_fn, self.seed = cfg, loss, seed
        self.scaler: ActorScaler | None = None
        self.note = ""
        self.report: Report | None = None
        self.rows: list[dict[str, Any]] = []

    def end_round(self, model: nn.Module, round_stats: Mapping[str, Any]) -> int | None:
        """The active actors for the next round (None: leave them as they are)."""
        reports = round_stats.get("reports") or []
        if reports:
            self.report = reports[-1]
        actors = round_stats.get("actors") or {}
        count = int(actors.get("count", 0))
        if count < 1:
            return None
        current = int(actors.get("active", count))
        if self.scaler is None:
            cfg = self.cfg
            lo, hi = scaling_bounds(cfg.actor_scaling_max, cfg.actor_scaling_min, count, cfg.agents)
            if cfg.actor_scaling_max and cfg.actor_scaling_max > count:
                self.note = f"algo.actor_scaling_max={cfg.actor_scaling_max} capped at actors.count={count}"
                print(f"hpcrl: note: {self.note}", flush=True)
            lo = min(lo, hi)
            self.scaler = ActorScaler(hi, self.cfg.agents, self.cfg.actor_scaling_beta, self.cfg.actor_scaling_window,
                                      min_actors_override=lo)
        policies = sorted(set(model.mapping().tolist()))
        row = {"round": int(round_stats.get("round", 0)), "demanded": -1, "active": current,
               "policies": len(policies), "policy_demands": "", "changed": 0}
        if self.report is None:
            return self._row(row, current, "no learner report yet: actors unchanged")
        ratios = {j: self.convexity(model, self.report, j) for j in policies}
        total = self.scaler.observe(ratios)
        s = self.scaler
        average = float(np.mean(list(s.demands.values())))
        rule = (f"I_avg={average:.2f} >= beta(I_max-I_min)={s.threshold:.2f}: max" if average >= s.threshold
                else f"I_avg={average:.2f} < beta(I_max-I_min)={s.threshold:.2f}: average")
        row["demanded"] = total
        row["policy_demands"] = " ".join(f"{j}:{d:.2f}(C={ratios[j]:.3g})" for j, d in s.demands.items())
        active = min(max(total, 1), count)
        why = f"{rule}; I=[{s.min_actors},{s.max_actors}]" + (f"; {self.note}" if self.note else "")
        return self._row(row, active, why)

    def _row(self, row: dict, active: int, reason: str) -> int:
        row["changed"] = int(active != row["active"])
        row["active"] = active
        row["reason"] = reason
        self.rows.append(row)
        return active

    def convexity(self, model: nn.Module, report: Report, slot: int) -> float:
        """C of one policy slot (Eq. 1) on the report's rows; NaN-free (a failed estimate counts as 1)."""
        with torch.enable_grad():
            loss = self.loss_fn(model, report)
            c = loss_convexity_ratio(loss, model.policy_parameters(slot), self.cfg.sharing_lanczos_steps, self.seed)
        return c if np.isfinite(c) else 1.0

    def records(self) -> dict[str, list[dict[str, Any]]]:
        rows, self.rows = self.rows, []
        return {"actor_scaling": rows} if rows else {}


class ScalingHooks:
    """The contract methods actor scaling adds to a MARL algorithm (put before
    :class:`~hpcrl.marl.sharing_rank.SharingHooks` in the bases, so the round's sharing decision comes first).
    Uses the algorithm's ``sharing_report`` and ``sharing_loss``; call :meth:`_setup_scaling` in the constructor."""

    def _setup_scaling(self) -> None:
        self.scaling = ParameterScaling(self.cfg, self.sharing_loss) if self.cfg.actor_scaling else None

    def learner_report(self, batch):
        report = super().learner_report(batch)
        if report is None and self.scaling is not None:
            report = self.sharing_report(batch)
        return report

    def end_round(self, model, round_stats):
        out = super().end_round(model, round_stats)
        if self.scaling is not None:
            active = self.scaling.end_round(model, round_stats)
            if active is not None:
                out = {**out, "active_actors": active}
        return out

    def records(self):
        out = super().records()
        if self.scaling is not None:
            out = {**out, **self.scaling.records()}
        return out

    def parameter_state(self):
        out = super().parameter_state()
        if self.scaling is not None:  # the convexity windows and the newest report
            out["scaling"] = {"scaler": self.scaling.scaler, "note": self.scaling.note, "report": self.scaling.report}
        return out

    def load_parameter_state(self, state):
        super().load_parameter_state(state)
        if self.scaling is not None and "scaling" in state:
            kept = state["scaling"]
            self.scaling.scaler, self.scaling.note, self.scaling.report = kept["scaler"], kept["note"], kept["report"]
