"""ALCF Aurora: PBSProProvider blocks, each app a PALS mpiexec; node failures are common, so one retry.

Edit YOUR_ACCOUNT and the queue (debug: 1-2 nodes; debug-scaling: 2-256; prod: 256 or more).
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
           worker_init: str = "module load frameworks", address: str | None = None,
           run_dir: str = "runinfo") -> Config:
    site = load_site("aurora")  # file systems, as in hpcrl submit's scripts
    return Config(
        executors=[
            MPIExecutor(
                label="mpi",
                address=address or interface_address("hsn0"),
                max_workers_per_block=parallel_runs,
                mpi_launcher="mpiexec",  # Aurora MPICH's PALS mpiexec
                provider=PBSProProvider(
                    account=account,
                    queue=queue,
                    scheduler_options=f"#PBS -l filesystems={site.filesystems}",
                    select_options="",
                    cpus_per_node=208,  # PBS ncpus: 104 cores x 2 hardware threads
                    nodes_per_block=nodes_per_block,
                    init_blocks=1,
                    max_blocks=1,
                    walltime=walltime,
                    launcher=SimpleLauncher(),
                    worker_init=f"{worker_init}; export TMPDIR=/tmp",  # each app exports the site's env (ZE_FLAT_...)
                ),
            ),
            ThreadPoolExecutor(label="local", max_threads=2),
        ],
        retries=1,  # a failed node fails the app; the run resumes from its checkpoint on the retry
        run_dir=run_dir,
    )
