"""The one-node Slurm of scripts/local_slurm.sh: a Slurm job is the block, each app an srun step."""
from __future__ import annotations

import sys
from pathlib import Path

from parsl.config import Config
from parsl.executors import MPIExecutor, ThreadPoolExecutor
from parsl.launchers import SimpleLauncher

from hpcrl.sites.parsl_configs._slurm import DeferredSlurmProvider


def config(*, run_dir: str = "runinfo", partition: str = "debug", walltime: str = "00:10:00",
           python_bin_dir: str | None = None) -> Config:
    python_bin_dir = python_bin_dir or str(Path(sys.executable).parent)
    return Config(
        executors=[
            MPIExecutor(
                label="mpi",
                address="127.0.0.1",  # the compute node is this machine
                max_workers_per_block=1,
                mpi_launcher="srun",
                provider=DeferredSlurmProvider(
                    partition=partition,
                    nodes_per_block=1,
                    init_blocks=1,
                    max_blocks=1,
                    walltime=walltime,
                    exclusive=False,  # the test node is shared with other jobs and tests
                    launcher=SimpleLauncher(),
                    worker_init=f"export PATH={python_bin_dir}:$PATH",  # the worker pool is started by name
                ),
            ),
            ThreadPoolExecutor(label="local", max_threads=2),
        ],
        run_dir=run_dir,
    )
