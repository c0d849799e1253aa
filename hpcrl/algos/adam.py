"""Adam (Kingma & Ba 2015) as torch.optim.Adam computes it, without torch.optim.Optimizer.

Why not torch.optim.Adam: constructing any torch.optim.Optimizer imports torch._dynamo (about
1.5 s of CPU on the 2-core VM). The parameter rank builds its optimizer when the first gradient
arrives, so every learner waited that long for a mailbox slot at the start of each job (about 1 s
of an 8 s default job). This class runs the same update (torch's fused Adam kernel,
``aten::_fused_adam_``, for float parameters on CPU and CUDA; the same equations in plain tensor
ops elsewhere) and keeps its state in torch's layout, so ``state_dict()`` and checkpoints load into
either class.

    m_t = beta1 m_{t-1} + (1 - beta1) g_t           v_t = beta2 v_{t-1} + (1 - beta2) g_t^2
    theta_t = theta_{t-1} - lr (m_t / (1 - beta1^t)) / (sqrt(v_t / (1 - beta2^t)) + eps)

Interface used by hpcrl: ``param_groups`` (dicts with ``params`` and ``lr``, which may be changed
between steps; ``lr`` may be a 0-dim tensor on the parameters' device, which a CUDA graph of the step reads
when it replays, and ``state_dict()`` gives it as a number), ``state`` (parameter -> ``step``, ``exp_avg``,
``exp_avg_sq``; deleting an entry restarts that parameter's moments), ``step()`` on the parameters' ``.grad``,
``state_dict()`` and ``load_state_dict()``. No weight decay, AMSGrad or maximize (hpcrl uses none of them).
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch import Tensor

_GROUP_DEFAULTS = ("lr", "betas", "eps")


class Adam:
    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        groups = list(params)
        if not groups:
            raise ValueError("Adam: no parameters to optimise")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps}
        self.param_groups: list[dict[str, Any]] = [{**defaults, **g, "params": list(g["params"])} for g in groups]
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        self._cached: dict[int, tuple] = {}
        self._zeros: dict[torch.device, Tensor] = {}  # a new state's step count, never incremented itself

    @torch.no_grad()
    def step(self) -> None:
        for i, group, params in self._stepping():
            params, steps, exp_avgs, exp_avg_sqs, fused, counts = self._lists(i, params)
            for count in counts:
                count.add_(1)
            grads = [p.grad for p in params]
            beta1, beta2 = group["betas"]
            if fused:
                torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=_lr(group["lr"]),
                                   beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"], amsgrad=False,
                                   maximize=False)
                continue
            for p, g, m, v, t in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
                m.lerp_(g, 1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                t = float(t)
                denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
                p.addcdiv_(m, denom, value=-float(group["lr"]) / (1 - beta1 ** t))

    def prepare(self) -> None:
        """Build the states and step lists the next :meth:`step` uses (the parameters that have grads now),
        without stepping: a CUDA graph capturing the step must find them built, or it would capture their
        allocations and the copies into fresh step counters, and replay those copies every time."""
        for i, _, params in self._stepping():
            self._lists(i, params)

    def _stepping(self):
        """(index, group, its parameters that have grads) of each group with any."""
        for i, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                yield i, group, params

    def _lists(self, group: int, params: list[Tensor]) -> tuple:
        """(params, steps, exp_avgs, exp_avg_sqs, fusable, step counters) of a group's parameters that have grads,
        kept while the same parameters train and no state entry was added or dropped (a Tensor is hashed in
        Python: looking a dozen up per step cost a tenth of the parameter rank's CPU).

        Parameters whose step counts are equal share one step tensor from here on, and each distinct counter is
        incremented once per step: ``torch._foreach_add_`` over a dozen 0-dim tensors cost more on the CPU than
        the fused Adam kernel itself (53 against 20 us for Hopper's 13 tensors). Each build gives fresh counters,
        so a parameter left out of a step (no grad) keeps its count, and one whose state was dropped restarts."""
        key = (id(self.state), len(self.state), tuple(map(id, params)))
        cached = self._cached.get(group)
        if cached is None or cached[0] != key:
            states = [self._state_of(p) for p in params]
            counts: dict[tuple, Tensor] = {}
            for s in states:
                t = s["step"]
                # equal counts by value on the CPU; on a GPU reading one is a host sync, so there the counters shared
                # already (the same tensor) stay shared, and new states' zeros share one (_state_of)
                where = (float(t), t.device) if t.device.type == "cpu" else (id(t), t.device)
                s["step"] = counts.setdefault(where, t.clone())
            lists = (params, [s["step"] for s in states], [s["exp_avg"] for s in states],
                     [s["exp_avg_sq"] for s in states], all(_fusable(p) for p in params), list(counts.values()))
            cached = self._cached[group] = ((id(self.state), len(self.state), key[2]), lists)
        return cached[1]

    def _state_of(self, p: Tensor) -> dict[str, Tensor]:
        if p not in self.state:
            zero = self._zeros.setdefault(p.device, torch.zeros((), dtype=torch.float32, device=p.device))
            self.state[p] = {"step": zero,  # shared by this build's new states, cloned into its counters by _lists
                             "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                             "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return self.state[p]

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: parameters numbered in group order, state by number."""
        index: dict[Tensor, int] = {}
        groups = []
        for group in self.param_groups:
            ids = [index.setdefault(p, len(index)) for p in group["params"]]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "lr": float(group["lr"]),
                           "weight_decay": 0, "amsgrad": False, "maximize": False, "params": ids})
        state = {index[p]: {k: v.clone() for k, v in s.items()} for p, s in self.state.items() if p in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this class or of torch.optim.Adam (same groups, same parameter shapes)."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(len(s["params"]) != len(g["params"])
                                                       for s, g in zip(saved, self.param_groups)):
            raise ValueError("Adam.load_state_dict: the saved parameter groups do not match this optimizer's")
        for s in saved:
            if s.get("weight_decay", 0) or s.get("amsgrad", False) or s.get("maximize", False):
                raise ValueError("Adam.load_state_dict: weight decay, AMSGrad and maximize are not supported")
        by_id = {}
        for s, group in zip(saved, self.param_groups):
            group.update({k: (tuple(s[k]) if k == "betas" else s[k]) for k in _GROUP_DEFAULTS if k in s})
            if "initial_lr" in s:
                group["initial_lr"] = s["initial_lr"]
            by_id.update(zip(s["params"], group["params"]))
        self.state, self._cached = {}, {}
        counts: dict[tuple, Tensor] = {}  # equal step counts share one tensor, as _lists would make them
        for i, values in state_dict["state"].items():
            p = by_id[int(i)]
            step = torch.as_tensor(values["step"], dtype=torch.float32).reshape(())
            self.state[p] = {"step": counts.setdefault((float(step), p.device), step.to(p.device).clone()),
                             "exp_avg": values["exp_avg"].to(p.device, p.dtype).clone(),
                             "exp_avg_sq": values["exp_avg_sq"].to(p.device, p.dtype).clone()}


def _lr(lr: float | Tensor) -> float | Tensor:
    """The fused kernel's learning rate: a tensor on the parameters' device stays one (a CUDA graph replays the
    step with whatever value it holds then: ``runtime/roles/cuda_graph_step.py``), a number is a float."""
    return lr if isinstance(lr, Tensor) else float(lr)


def _fusable(p: Tensor) -> bool:
    """torch's fused Adam kernel exists for these (CPU since torch 2.4)."""
    return p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float64)
