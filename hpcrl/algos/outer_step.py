"""The parameter rank's outer step when learner groups push updates (``learners.push: update``).

A group runs the algorithm's whole update on its batch from the version it pulled, theta_v, and pushes
u = theta_v - theta_end (one update, the fused loop's steps). Rank 0 averages the admitted updates as it
averages gradients (Stellaris' (1/H) sum_c (alpha_c / alpha_0) u_c, hpcrl.staleness) and applies the
mean d to the whole flat buffer:

    b_t = m b_{t-1} + d_t                       (momentum m; b_0 = 0)
    s_t = d_t + m b_t   if Nesterov   else b_t
    theta_t = theta_{t-1} - lr s_t

With lr = 1 and m = 0 one group at staleness 0 lands exactly on theta_end: the fused loop's weights.
Outer momentum on averaged updates is the outer optimizer of local-SGD / DiLoCo-style training.
The flat buffer is stepped whole: the untrained values it carries (PPO's KL coefficient) get a zero
update from every group, so they move only where rank 0 sets them.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class OuterStep:
    """``step(d)`` on a flat parameter tensor; ``param_groups[0]["lr"]`` as the record reads an optimizer's rate;
    ``state_dict`` / ``load_state_dict`` for checkpoints."""

    def __init__(self, params: Tensor, lr: float = 1.0, momentum: float = 0.0, nesterov: bool = False) -> None:
        if nesterov and momentum <= 0.0:
            raise ValueError("OuterStep: Nesterov needs momentum > 0")
        self.params = params
        self.param_groups: list[dict[str, Any]] = [{"lr": float(lr), "momentum": float(momentum),
                                                    "nesterov": bool(nesterov)}]
        self.buffer: Tensor | None = None  # made at the first step with momentum

    @torch.no_grad()
    def step(self, update: Tensor) -> None:
        group = self.param_groups[0]
        m, d = group["momentum"], update.to(self.params.device, self.params.dtype)
        if m:
            self.buffer = d.clone() if self.buffer is None else self.buffer.mul_(m).add_(d)
            d = d.add(self.buffer, alpha=m) if group["nesterov"] else self.buffer
        self.params.sub_(d, alpha=group["lr"])

    def state_dict(self) -> dict[str, Any]:
        return {"param_groups": [dict(g) for g in self.param_groups],
                "buffer": None if self.buffer is None else self.buffer.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's state; the rate and momentum stay this run's (a resume may change them)."""
        buffer = state.get("buffer")
        self.buffer = None if buffer is None else buffer.to(self.params.device, self.params.dtype).clone()
