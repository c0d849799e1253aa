"""ALCF Polaris: PBSProProvider blocks, each app a PALS mpiexec over some of the block's nodes.

Edit YOUR_ACCOUNT and the queue (debug: 1-2 nodes; debug-scaling: up to 10; prod: 10 or more).
"""
from __future__ import annotations

from parsl.config import Config
from parsl.executors import MPIExecutor, ThreadPoolExecutor
from parsl.launchers import SimpleLauncher
from parsl.providers import PBSProProvider

from hpcrl.sites import load_site
from hpcrl.sites.parsl_configs import interface_address


def config(*, account: str = "YOUR_ACCOUNT", queue: str = "debug", nodes_per_block: int = 2,
           parallel_runs: int = 1, walltime: str = "00:30:00",
           worker_init: str = "module use /soft/modulefiles; module load conda; conda activate base",
           address: str | None = None, run_dir: str = "runinfo") -> Config:
    site = load_site("polaris")  # cores, GPUs and file systems, as in hpcrl submit's scripts
    return Config(
        executors=[
            MPIExecutor(
                label="mpi",
                address=address or interface_address("bond0"),  # Polaris login nodes reach compute nodes on bond0
                max_workers_per_block=parallel_runs,
                mpi_launcher="mpiexec",  # Cray PALS mpiexec
                provider=PBSProProvider(
                    account=account,
                    queue=queue,
                    # every file system the job touches must be listed, or PBS may start it during an outage
                    scheduler_options=f"#PBS -l filesystems={site.filesystems}",
                    select_options=f"ngpus={site.gpus_per_node}",
                    cpus_per_node=site.cores_per_node * site.threads_per_core,  # PBS ncpus counts hardware threads
                    nodes_per_block=nodes_per_block,
                    init_blocks=1,
                    max_blocks=1,
                    walltime=walltime,
                    launcher=SimpleLauncher(),
                    # TMPDIR on /tmp: a long scratch path overflows AF_UNIX socket names (ALCF, 2025)
                    worker_init=f"{worker_init}; export TMPDIR=/tmp",
                ),
            ),
            ThreadPoolExecutor(label="local", max_threads=2),
        ],
        run_dir=run_dir,
    )
