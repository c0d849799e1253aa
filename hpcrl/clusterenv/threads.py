"""The head's torch threads when ClusterEnv's workers share its cores.

torch's default intra-op pool has one OpenMP thread per core, and after each parallel region those
threads spin-wait (libgomp's default) before they sleep. A head whose training loop runs small
networks on that pool keeps every core busy spinning, and worker ranks on the same node get the
scraps: an unmodified CleanRL loop on 2 shared cores stepped 101-136 env steps/s against
1,271-1,987 with one head thread (issue 29). So when ``w`` workers run on the head's host, the head
gets ``max(1, cores - w)`` torch threads (``cores``: the CPUs this process may run on), and its old
setting comes back at ``close()``. Workers get one thread each: local workers start with
``OMP_NUM_THREADS=1`` (:data:`hpcrl.launch.RANK_ENV`), and a worker whose policy or envs use torch
calls ``torch.set_num_threads(torch_threads)`` (:mod:`hpcrl.clusterenv.worker`).

``ClusterEnv(..., head_threads=...)``: ``"auto"`` (the rule above; nothing changes when no worker
shares the head's host), an int (that many threads, always), or ``None`` (leave torch alone). The
head's threads are set only when the head has imported torch (a loop without torch has no pool).
"""
from __future__ import annotations

import os
import socket
import sys

AUTO = "auto"


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask: what Slurm or mpiexec binding gave it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def workers_on_this_host(reports: list[dict]) -> int:
    """How many workers reported the head's hostname."""
    here = socket.gethostname()
    return sum(1 for r in reports if r.get("host") == here)


def head_threads_for(setting, cores: int, sharing: int) -> int | None:
    """Threads for the head's torch pool, or None to leave it (see the module docstring)."""
    if setting is None:
        return None
    if setting == AUTO:
        return max(1, cores - sharing) if sharing else None
    return int(setting)


class HeadThreads:
    """Applies the head's thread count now and restores torch's previous one at :meth:`restore`."""

    def __init__(self, setting, reports: list[dict]):
        self.sharing = workers_on_this_host(reports)
        self.threads = head_threads_for(setting, usable_cores(), self.sharing)
        self.previous = None
        torch = sys.modules.get("torch")
        if self.threads is not None and torch is not None:
            self.previous = torch.get_num_threads()
            torch.set_num_threads(self.threads)

    def restore(self) -> None:
        torch = sys.modules.get("torch")
        if self.previous is not None and torch is not None:
            torch.set_num_threads(self.previous)
            self.previous = None
