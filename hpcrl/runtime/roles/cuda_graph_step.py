"""A group's whole minibatch step (gradient, clipping and the Adam update) replayed from one CUDA graph.

Under ``learners.push: update`` a group takes every minibatch step of a batch itself (``group_update.py``):
Hopper's shipped config is 320 of them a batch (10 epochs x 32 minibatches of 64 rows). Eager, each step is
about 150 small kernels for the gradient, a host sync to read its stats and a dozen for Adam; on a GPU all of it
is launch-bound. :class:`GraphedInnerStep` captures ``algo.gradient_tensors`` (no host sync) followed by the
optimizer's fused Adam kernel as one graph per minibatch shape, so a step is a copy of the minibatch into static
inputs and one replay. The stats stay on the device: the graph adds each step's to a running total, read once a
batch by :meth:`GraphedInnerStep.means`.

What the graph reads at replay, not at capture: the weights (the model's flat parameters, loaded in place), the
optimizer's moments and step counts (its own state tensors), the learning rate (a 0-dim device tensor the
optimizer's group holds: :meth:`GraphedInnerStep.set_lr` fills it) and PPO's KL coefficient (a model constant).
Only an algorithm whose step is its gradient then ``apply`` (the base ``Algorithm.update``), with hpcrl's Adam,
qualifies (:func:`graphable`); anything else, and a fifth minibatch shape, takes the eager step.
"""
from __future__ import annotations

import torch

from hpcrl.algos.adam import Adam
from hpcrl.algos.base import Algorithm
from hpcrl.runtime.roles.cuda_graph import MAX_SHAPES, warm_up


def graphable(algo, model, optimizer) -> bool:
    """Whether :class:`GraphedInnerStep` can replay this group's minibatch step."""
    return (model.device.type == "cuda" and hasattr(algo, "gradient_tensors") and isinstance(optimizer, Adam)
            and type(algo).update is Algorithm.update)


class GraphedInnerStep:
    def __init__(self, algo, model, optimizer: Adam) -> None:
        self.algo, self.model, self.optimizer = algo, model, optimizer
        self.names = tuple(algo.gradient_stat_names)
        self.total = torch.zeros(len(self.names), dtype=torch.float32, device=model.flat.params.device)
        self.steps = 0
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.inputs: dict[tuple, dict[str, torch.Tensor]] = {}
        self._rates_on_device()

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"].fill_(lr)

    def forget(self) -> None:
        """Drop the graphs: the optimizer's state was loaded anew (a resumed group's), rates included."""
        self.graphs.clear()
        self.inputs.clear()
        self._rates_on_device()

    def _rates_on_device(self) -> None:
        """Each group's rate as a 0-dim device tensor, which the graphs read at each replay."""
        device = self.model.flat.params.device
        for group in self.optimizer.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)

    def begin(self) -> None:
        """Start a batch's stats."""
        self.total.zero_()
        self.steps = 0

    def __call__(self, minibatch: dict) -> bool:
        """One step on ``minibatch`` by replay; False when its shape has no graph and no room is left for one."""
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in minibatch.items())
        graph = self.graphs.get(key)
        if graph is None:
            if len(self.graphs) >= MAX_SHAPES:
                return False
            graph = self._capture(key, minibatch)
        inputs = self.inputs[key]
        for k, v in minibatch.items():
            inputs[k].copy_(v, non_blocking=True)
        graph.replay()
        self.steps += 1
        return True

    def means(self) -> tuple[dict[str, float], int]:
        """The mean stats of this batch's replayed steps (one host copy) and how many there were."""
        if not self.steps:
            return {}, 0
        values = (self.total / self.steps).tolist()
        return dict(zip(self.names, values)), self.steps

    def _capture(self, key: tuple, minibatch: dict) -> torch.cuda.CUDAGraph:
        model, algo = self.model, self.algo
        inputs = self.inputs[key] = {k: v.detach().clone() for k, v in minibatch.items()}
        warm_up(lambda: algo.gradient_tensors(inputs, model))  # gradients only: a warm-up must not move the weights
        self.optimizer.prepare()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            grad, stats = algo.gradient_tensors(inputs, model)
            if grad is not model.flat.grads:
                model.flat.grads.copy_(grad)
            self.optimizer.step()
            self.total.add_(stats.reshape(-1).to(self.total.dtype))
        self.graphs[key] = graph
        return graph
