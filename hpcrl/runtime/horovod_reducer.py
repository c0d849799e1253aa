"""Horovod as the learner groups' gradient allreduce (``learners.allreduce: horovod``).

The same two methods as :class:`hpcrl.runtime.learner.GroupReducer`: ``average(grad)`` returns the
group's mean gradient as a float32 numpy array, ``close()`` ends the Horovod world. Horovod is
initialised on the learner group's communicator (``hvd.init(comm=group_comm)``), so each group is a
Horovod world of its own and the parameter and actor ranks never join one. Horovod 0.28.1 (its last
release, 2023) compiles as C++14 and PyTorch 2.x headers need C++17: docs/runtime.md gives the build.
"""
from __future__ import annotations

import numpy as np
import torch

TENSOR_NAME = "hpcrl.group_gradient"
"""One name for every call: Horovod matches the ranks' tensors by name, and the calls are sequential."""


def horovod_available() -> bool:
    """True when ``horovod.torch`` can be found in this Python (without importing it)."""
    from importlib.util import find_spec

    try:
        return find_spec("horovod") is not None and find_spec("horovod.torch") is not None
    except (ImportError, ValueError):
        return False


class HorovodReducer:
    """Average a flat gradient over one learner group with ``horovod.torch.allreduce(op=Average)``."""

    def __init__(self, group_comm, device: torch.device) -> None:
        import horovod.torch as hvd

        hvd.init(comm=group_comm)
        self.hvd = hvd
        self.size = hvd.size()
        # a CPU-only Horovod build reduces host tensors; one with NCCL takes CUDA tensors as they are
        self.on_host = device.type != "cuda" or not hvd.nccl_built()

    def average(self, grad: torch.Tensor) -> np.ndarray:
        grad = grad.detach()
        if self.size == 1:
            return grad.cpu().numpy()
        if self.on_host:
            grad = grad.cpu()
        return self.hvd.allreduce(grad, op=self.hvd.Average, name=TENSOR_NAME).cpu().numpy()

    def close(self) -> None:
        self.hvd.shutdown()
