"""This machine, no scheduler: one block of workers here, each app an mpiexec (Hydra) job."""
from __future__ import annotations

import sys
from pathlib import Path

from parsl.config import Config
from parsl.executors import MPIExecutor, ThreadPoolExecutor
from parsl.launchers import SimpleLauncher
from parsl.providers import LocalProvider


def config(*, run_dir: str = "runinfo", parallel_runs: int = 1, mpiexec_dir: str | None = None) -> Config:
    mpiexec_dir = mpiexec_dir or str(Path(sys.executable).parent)  # pip's mpich wheel puts mpiexec in the venv
    return Config(
        executors=[
            MPIExecutor(
                label="mpi",
                address="127.0.0.1",  # workers run here; no address lookup
                max_workers_per_block=parallel_runs,
                mpi_launcher="mpiexec",
                provider=LocalProvider(
                    launcher=SimpleLauncher(),  # MPIExecutor requires it: one worker pool, apps launch MPI
                    init_blocks=1,
                    max_blocks=1,
                    # Parsl's MPI mode reads the node list from PBS_NODEFILE or SLURM_NODELIST; without a
                    # scheduler we write one, naming this host once per run allowed at the same time
                    worker_init=(
                        f"export PATH={mpiexec_dir}:$PATH; "
                        "export PBS_NODEFILE=$(mktemp); "
                        f"for i in $(seq {parallel_runs}); do hostname >> $PBS_NODEFILE; done"
                    ),
                ),
            ),
            ThreadPoolExecutor(label="local", max_threads=2),  # light Python apps (summaries) in this process
        ],
        run_dir=run_dir,
        # the block here starts at the first strategy pass: Parsl's default period (5 s) would keep every
        # workflow's first run waiting that long on an idle machine; a status check of a local pid is cheap
        strategy_period=1,
    )
