"""A learner group's gradient average: one function picks the backend, each backend two methods.

``make_reducer(learners.allreduce, group_comm, device)`` returns an object with ``average(grad) ->
float32 numpy`` (the group's mean gradient, on every rank of the group) and ``close()``:

- :class:`GroupReducer` (``auto``): NCCL through torch.distributed for CUDA tensors (one process
  group per learner group, its rendezvous address sent by the group root over MPI), else an MPI
  Allreduce of the host buffer. NCCL refuses two ranks of one communicator on the same GPU (a node
  with fewer GPUs than learner ranks): such a group averages over MPI.
- :class:`HorovodReducer` (``horovod``): ``horovod.torch.allreduce(op=Average)`` with Horovod
  initialised on the group's communicator (``hvd.init(comm=group_comm)``), so each group is a
  Horovod world of its own and the parameter and actor ranks never join one. Horovod 0.28.1 (its
  last release, 2023) compiles as C++14 and PyTorch 2.x headers need C++17: docs/runtime.md gives
  the build.

:class:`MpiGroupReduce` is the group as a learner role sees it (``protocols.GroupReduce``, the serial
runner's twin is ``local.LocalGroupReduce``): the root sends each member its share of a minibatch
(weights, rows ``r::L``, IS window rows) over the group's communicator (TAG_WORK); a member
(:meth:`MpiGroupReduce.serve`) computes its share's gradient and joins the reducer's average, naps long
after PARK, and ends at None.
"""
from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import numpy as np

from hpcrl.runtime.transport import control
from hpcrl.runtime.backoff import Backoff

if TYPE_CHECKING:  # torch is imported where it is used: the serial runner's twins import this module
    import torch

PARK = "park"
"""What a group root sends its members when the group parks (they nap long until work comes)."""


def share_of(minibatch: dict, window: list[np.ndarray] | None, rank: int, size: int
             ) -> tuple[dict, list[np.ndarray] | None]:
    """Rank ``rank``'s share of a minibatch and of its IS window: rows ``rank::size`` (views)."""
    return ({k: v[rank::size] for k, v in minibatch.items()},
            None if window is None else [w[rank::size] for w in window])


def host_rows(batch: dict) -> dict:
    """A share's tensors as host numpy arrays (what travels to a member)."""
    return {k: v.detach().cpu().numpy() for k, v in batch.items()}


def member_work(weights: np.ndarray, minibatch: dict, window: list[np.ndarray] | None, rank: int, size: int) -> dict:
    """What the root sends member ``rank``: the weights, its rows of the minibatch (on the host) and of the IS window."""
    rows, rows_window = share_of(minibatch, window, rank, size)
    return {"weights": weights, "batch": host_rows(rows), "window": rows_window}


class MpiGroupReduce:
    """A learner group over its MPI communicator (``topo.group_comm``): work to the members, the reducer's average.

    The reducer (``make_reducer``) exists only in a group of more than one rank (one rank averages nothing)."""

    def __init__(self, group_comm, backend: str, device: torch.device) -> None:
        self.comm = group_comm
        self.size = group_comm.Get_size()
        self.reducer = make_reducer(backend, group_comm, device) if self.size > 1 else None

    def hand_out(self, weights: np.ndarray, minibatch: dict, window: list[np.ndarray] | None
                 ) -> tuple[dict, list[np.ndarray] | None]:
        for r in range(1, self.size):
            self.comm.send(member_work(weights, minibatch, window, r, self.size), dest=r, tag=control.TAG_WORK)
        return share_of(minibatch, window, 0, self.size)

    def ready(self, tick) -> None:
        """Every member is in the job's own launch: always there."""

    def park(self) -> None:
        self._tell_members(PARK)

    def release(self) -> None:
        self._tell_members(None)

    def _tell_members(self, message) -> None:
        for r in range(1, self.size):
            self.comm.send(message, dest=r, tag=control.TAG_WORK)

    def average(self, grad: torch.Tensor) -> np.ndarray:
        return grad.detach().cpu().numpy() if self.reducer is None else self.reducer.average(grad)

    def serve(self, share, check, beat) -> None:
        """A member's loop: ``share(weights, batch, window)`` for each piece of work from the group root (it
        computes and joins the average); nap long while the root is parked (PARK); close the reducer when the
        root sends None. ``check()`` raises an injected fault, ``beat()`` is the member's sign of life."""
        def keep_waiting() -> bool:  # a sign of life for the watchdog, never a reason to give up
            beat()
            return False

        cap = 2e-3
        while True:
            check()
            work = control.recv_polling(self.comm, 0, control.TAG_WORK, Backoff(5e-5, cap), abandon=keep_waiting)
            if work is None:
                self.close()
                return
            cap = control.PARK_NAP_SECONDS if work == PARK else 2e-3
            if work != PARK:
                share(work["weights"], work["batch"], work["window"])

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.close()


def make_reducer(backend: str, group_comm, device: torch.device):
    """The group's gradient averaging for ``learners.allreduce``: GroupReducer (auto) or HorovodReducer."""
    if backend == "horovod":
        return HorovodReducer(group_comm, device)
    return GroupReducer(group_comm, device)


class GroupReducer:
    """NCCL for CUDA tensors where every rank of the group has a GPU of its own, else MPI Allreduce."""

    def __init__(self, group_comm, device: torch.device) -> None:
        import torch

        self.comm = group_comm
        self.size = group_comm.Get_size()
        self.nccl = (device.type == "cuda" and self.size > 1 and torch.distributed.is_available()
                     and torch.distributed.is_nccl_available())
        if self.nccl:
            gpus = group_comm.allgather((socket.gethostname(), device.index))
            if len(set(gpus)) < len(gpus):
                self.nccl = False
                if group_comm.Get_rank() == 0:
                    print(f"hpcrl: learner group shares GPUs {sorted(set(gpus))} between {self.size} ranks; "
                          "averaging gradients with MPI instead of NCCL", flush=True)
        self._sum = None
        if self.nccl:
            addr = None
            if group_comm.Get_rank() == 0:
                with socket.socket() as s:
                    s.bind(("", 0))
                    addr = f"tcp://{socket.gethostbyname(socket.gethostname())}:{s.getsockname()[1]}"
            addr = group_comm.bcast(addr, root=0)
            torch.distributed.init_process_group("nccl", init_method=addr, rank=group_comm.Get_rank(),
                                                 world_size=self.size)

    def average(self, grad: torch.Tensor) -> np.ndarray:
        if self.size == 1:
            return grad.detach().cpu().numpy()
        if self.nccl:
            import torch

            torch.distributed.all_reduce(grad)
            return (grad / self.size).cpu().numpy()
        from mpi4py import MPI

        g = grad.detach().cpu().numpy()
        if self._sum is None:
            self._sum = np.empty_like(g)
        self.comm.Allreduce(g, self._sum, op=MPI.SUM)
        return self._sum / self.size

    def close(self) -> None:
        import torch

        if self.nccl and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


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
