"""One compute thread per rank, or per job run in one process: torch's, and the BLAS that numpy calls.

Under the MPI runner a rank's core is its own; the serial and virtual-time runners take turns on one core's worth
of time. numpy's OpenBLAS starts a thread per core when it loads, and its idle threads spin while they wait for
work. Measured on the 2-core VM: two virtual-time jobs side by side took 192 CPU s each, 12 CPU s each with one BLAS
thread (docs/results/sim.md). ``OMP_NUM_THREADS=1`` in the environment, which hpcrl's launches set
(:mod:`hpcrl.job_env`), stops it before numpy loads; a process that is already running (the serial and
virtual-time runners, a rank that someone else's launcher started) limits the pools here, through threadpoolctl.
"""
from __future__ import annotations


def one_compute_thread() -> None:
    """torch's intra-op threads and the BLAS pools numpy loaded: one each, from now on in this process."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")
