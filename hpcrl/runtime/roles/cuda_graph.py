"""A CUDA learner's minibatch gradient replayed from a CUDA graph.

The networks RL learners train are small (Hopper's 2 x 64 MLPs: 9K parameters), so on a GPU a
minibatch gradient is bound by kernel launches, not arithmetic: PPO's forward, loss, backward
and clipping are about 150 kernels, each a few microseconds of host time, and every stat read
back is a host-device sync. Replayed as one graph, the same kernels cost one launch.

:class:`GraphedGradient` captures ``algo.gradient_tensors(minibatch, model)`` (the algorithm's
gradient with no host sync; the algorithm lists the stats it returns in
``algo.gradient_stat_names``) once per minibatch shape, with the minibatch in static device
tensors. A call copies the minibatch in, replays, and brings the flat gradient and the stats
back in one copy to pinned host memory (:meth:`GraphedGradient.launch` returns before that copy
is done, so the learner can push the previous gradient meanwhile: ``learners.overlap_push``). The
model's parameters and gradient buffer are the same tensors every call (``FlatParameters`` loads
new weights in place), so the graph always reads the newest weights. Used by the learner when ``learners.cuda_graphs`` is true on a CUDA learner, the
algorithm offers ``gradient_tensors`` and no IS window is needed (the window's snapshot count
varies); any other minibatch takes the eager path.
"""
from __future__ import annotations

import numpy as np
import torch

MAX_SHAPES = 4
"""Graphs kept per learner (one per minibatch shape: a batch's last, shorter minibatch is another)."""
WARMUP = 3
"""Eager calls on a side stream before a capture (lets autograd and the allocator settle, as torch asks)."""


def warm_up(call) -> None:
    """WARMUP eager ``call()``s on a side stream before a capture, as torch asks."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP):
            call()
    torch.cuda.current_stream().wait_stream(side)


class GraphedGradient:
    def __init__(self, algo, model) -> None:
        if model.device.type != "cuda":
            raise ValueError(f"GraphedGradient needs a CUDA model, got device {model.device}")
        self.algo, self.model = algo, model
        self.names = tuple(algo.gradient_stat_names)
        self.graphs: dict[tuple, _Captured] = {}

    def __call__(self, minibatch: dict) -> tuple[np.ndarray, dict[str, float]] | None:
        """The flat gradient (a host array, valid until the next call but one) and the stats; None when this
        minibatch's shape has no graph and no room is left for one (the caller goes eager)."""
        launched = self.launch(minibatch)
        return None if launched is None else launched.result()

    def launch(self, minibatch: dict) -> "_Captured | None":
        """Start the minibatch's replay and the copy of its result to the host, without waiting; ``.result()``
        of the returned graph waits and gives what :meth:`__call__` gives. The host can work meanwhile, but
        must not load new weights into the model before ``result()`` (the graph reads them)."""
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in minibatch.items())
        captured = self.graphs.get(key)
        if captured is None:
            if len(self.graphs) >= MAX_SHAPES:
                return None
            captured = self.graphs[key] = _Captured(self.algo, self.model, minibatch, self.names)
        captured.launch(minibatch)
        return captured


class _Captured:
    """One graph: static inputs, the captured step, one output (gradient then stats) and two pinned host copies
    (taken in turn, so a gradient still being pushed is not overwritten by the next replay's copy)."""

    def __init__(self, algo, model, minibatch: dict, names: tuple[str, ...]) -> None:
        self.names = names
        self.inputs = {k: v.detach().clone() for k, v in minibatch.items()}
        warm_up(lambda: algo.gradient_tensors(self.inputs, model))
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            grad, stats = algo.gradient_tensors(self.inputs, model)
            self.output = torch.cat([grad.reshape(-1), stats.reshape(-1).to(grad.dtype)])
        self.num_params = grad.numel()
        self.hosts = [torch.empty(self.output.shape, dtype=self.output.dtype, pin_memory=True) for _ in range(2)]
        self.turn = 0
        self.stream = torch.cuda.current_stream()
        self.copied: dict[str, tuple[torch.Tensor, int]] = {}  # input -> (source tensor, its version) last copied

    def launch(self, minibatch: dict) -> None:
        for k, v in minibatch.items():
            # a pass over the same unshuffled batch hands over the same tensors: copied once, not per pass
            # (held here, so `is` cannot meet a new tensor at a freed one's address; _version counts in-place writes)
            source, version = self.copied.get(k, (None, -1))
            if source is not v or version != v._version:
                self.inputs[k].copy_(v, non_blocking=True)
                self.copied[k] = (v, v._version)
        self.graph.replay()
        self.turn ^= 1
        self.hosts[self.turn].copy_(self.output, non_blocking=True)

    def result(self) -> tuple[np.ndarray, dict[str, float]]:
        self.stream.synchronize()
        out = self.hosts[self.turn].numpy()
        return out[:self.num_params], dict(zip(self.names, out[self.num_params:].tolist()))
