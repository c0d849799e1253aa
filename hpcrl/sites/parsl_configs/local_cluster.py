"""The Slurm of scripts/local_cluster.sh: a Slurm job of N nodes is the block, each app an srun step."""
from __future__ import annotations

import sys
from pathlib import Path

from parsl.config import Config
from parsl.executors import MPIExecutor, ThreadPoolExecutor
from parsl.launchers import SimpleLauncher

from hpcrl.sites.parsl_configs._slurm import DeferredSlurmProvider

HEAD_ADDRESS = "10.213.0.1"
"""This machine on the cluster's bridge (scripts/local_cluster.sh, default HPCRL_CLUSTER_NET=10.213.0)."""


def config(*, run_dir: str = "runinfo", partition: str = "debug", walltime: str = "00:10:00",
           nodes_per_block: int = 1, address: str = HEAD_ADDRESS, python_bin_dir: str | None = None) -> Config:
    python_bin_dir = python_bin_dir or str(Path(sys.executable).parent)
    return Config(
        executors=[
            MPIExecutor(
                label="mpi",
                address=address,  # the nodes are namespaces: they reach this machine on the bridge only
                max_workers_per_block=1,
                mpi_launcher="srun",
                provider=DeferredSlurmProvider(
                    partition=partition,
                    nodes_per_block=nodes_per_block,
                    init_blocks=1,
                    max_blocks=1,
                    walltime=walltime,
                    exclusive=False,  # the test nodes are shared with other jobs and tests
                    launcher=SimpleLauncher(),
                    worker_init=f"export PATH={python_bin_dir}:$PATH",  # the worker pool is started by name
                ),
            ),
            ThreadPoolExecutor(label="local", max_threads=2),
        ],
        run_dir=run_dir,
        # submit the block at once rather than at Parsl's first strategy pass (5 s by default); on this
        # cluster of namespaces a squeue each second costs nothing (a site's config keeps the default)
        strategy_period=1,
    )
