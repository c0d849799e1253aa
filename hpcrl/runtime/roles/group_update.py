"""Update push (``learners.push: update``): a learner group's whole update of one batch, with its own optimizer.

The group steps every minibatch of ``algo.minibatches`` itself, as the fused loop does, and pushes one
update: the weights it started from minus those it ended with. Its optimizer (and the minibatch order's
generator) lives across batches; rank 0 keeps a copy from each activity report for the checkpoint
(``runtime/roles/group_states.py``) and hands it back on ``--resume``::

    inner = GroupUpdate(algo, model, generator, cuda_graphs)
    inner.restore(saved)                  # --resume: as the group was after its last update
    inner.set_lr(lr)                      # the schedule's rate at the env steps consumed so far
    got = inner.run(batch, step)          # step(minibatch) -> stats, or None: the run is stopping
    update, stats = got                   # stats: the minibatch means, and inner_steps
    inner.state()                         # what the activity report carries

``step`` is the learner's: its control checks, the IS window, the group's shares; it ends with
:meth:`apply` (a gradient) or :meth:`fused_step` (the algorithm's own step, replayed from a CUDA graph where
``cuda_graphs`` is on and the step allows one: ``runtime/roles/cuda_graph_step.py``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from hpcrl.runtime.roles.cuda_graph_step import GraphedInnerStep, graphable
from hpcrl.runtime.roles.group_states import as_tensors, on_host


class GroupUpdate:
    def __init__(self, algo, model, generator: torch.Generator, cuda_graphs: bool = False) -> None:
        self.algo, self.model, self.generator = algo, model, generator
        self.optimizer = algo.make_optimizer(model)
        self.graphed = (GraphedInnerStep(algo, model, self.optimizer)
                        if cuda_graphs and graphable(algo, model, self.optimizer) else None)

    def restore(self, saved: dict) -> None:
        self.optimizer.load_state_dict(as_tensors(saved["optimizer"]))
        if self.graphed is not None:
            self.graphed.forget()  # its graphs read the old state tensors and rates
        self.generator.set_state(saved["minibatch_rng"])

    def state(self) -> dict:
        return {"optimizer": on_host(self.optimizer.state_dict()), "minibatch_rng": self.generator.get_state()}

    def set_lr(self, lr: float) -> None:
        if self.graphed is not None:
            self.graphed.set_lr(lr)
            return
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def fused_step(self, minibatch: dict) -> dict:
        """The algorithm's own step on one minibatch (HDDPG orders its losses in it). A replayed step gives no
        stats here: they stay on the device until :meth:`run` ends."""
        if self.graphed is not None and self.graphed(minibatch):
            return {}
        return self.algo.update(minibatch, self.model, self.optimizer)

    def apply(self, grad: np.ndarray) -> None:
        """One optimizer step with a gradient the group computed (a multi-rank group's average)."""
        self.algo.apply(self.model, self.optimizer, grad)

    def run(self, batch: dict, step: Callable[[dict], dict | None]) -> tuple[np.ndarray, dict] | None:
        """Every minibatch of ``batch`` through ``step``: (the update, the mean stats with ``inner_steps``), or
        None when a step says the run is stopping."""
        start = self.model.flat.params.detach().clone()
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        steps = 0
        if self.graphed is not None:
            self.graphed.begin()
        for mb in self.algo.minibatches(batch, self.generator):
            stats = step(mb)
            if stats is None:
                return None
            for k, v in stats.items():  # summed as they come (tensors stay on the device until the end)
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + 1
            steps += 1
        if self.graphed is not None:  # the replayed steps' stats, summed on the device
            means, replayed = self.graphed.means()
            for k, mean in means.items():
                sums[k] = sums.get(k, 0.0) + mean * replayed
                counts[k] = counts.get(k, 0) + replayed
        update = (start - self.model.flat.params).cpu().numpy()
        stats = {k: float(v) / counts[k] for k, v in sums.items()}
        stats["inner_steps"] = steps
        return update, stats
