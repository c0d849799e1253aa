"""`hpcrl info`: versions, the MPI library and launcher, devices, registered environments.

Imports torch and mpi4py only inside :func:`main`, and never initialises MPI in a way that
needs a launcher: ``MPI.Get_library_version`` works in a singleton process.
"""
from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--envs", action="store_true", help="also list every Gymnasium environment id")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def main(args: argparse.Namespace) -> int:
    import hpcrl
    from hpcrl import launch
    from hpcrl.config import LaunchConfig
    from hpcrl.envs import hpcrl_env_ids

    rows = [("hpcrl", hpcrl.__version__), ("python", f"{platform.python_version()} ({sys.executable})")]
    rows += [(d, _version(d)) for d in ("torch", "gymnasium", "mujoco", "h5py", "numpy", "mpi4py", "mpich",
                                       "pettingzoo", "parsl")]
    try:
        mpiexec = launch.find_mpiexec(LaunchConfig())
        rows.append(("mpiexec", f"{mpiexec} ({launch.mpi_flavour(mpiexec)})"))
    except Exception as exc:  # noqa: BLE001 - info reports, it does not fail
        rows.append(("mpiexec", f"none: {exc}"))
    try:
        from mpi4py import MPI

        rows.append(("MPI library", MPI.Get_library_version().strip().splitlines()[0]))
        rows.append(("MPI standard", "%d.%d" % MPI.Get_version()))
    except Exception as exc:  # noqa: BLE001
        rows.append(("MPI library", f"unavailable: {exc}"))
    try:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            rows.append(("CUDA devices", ", ".join(names)))
        else:
            rows.append(("CUDA devices", "none (CPU only)"))
        rows.append(("torch threads", str(torch.get_num_threads())))
    except Exception as exc:  # noqa: BLE001
        rows.append(("torch", f"unavailable: {exc}"))
    import os

    rows.append(("CPU cores", str(os.cpu_count())))
    inside = launch.job_rank(os.environ)
    rows.append(("inside an MPI job", f"rank {inside[0]} of {inside[1]}" if inside else "no"))
    rows.append(("hpcrl environments", ", ".join(hpcrl_env_ids()) or "none"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if args.envs:
        import gymnasium

        print("Gymnasium environments: " + ", ".join(sorted(gymnasium.registry)))
    return 0
