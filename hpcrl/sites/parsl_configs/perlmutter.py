"""NERSC Perlmutter: SlurmProvider blocks of whole nodes, each app an srun step over some of them.

NERSC recommends running the workflow itself in "detached head" mode (on a login node in tmux/screen,
or in its own small job). Edit YOUR_ACCOUNT; GPU nodes by default, constraint="cpu" for CPU nodes.
"""
from __future__ import annotations

from parsl.config import Config
from parsl.executors import MPIExecutor, ThreadPoolExecutor
from parsl.launchers import SimpleLauncher

from hpcrl.sites import load_site
from hpcrl.sites.parsl_configs import interface_address
from hpcrl.sites.parsl_configs._slurm import DeferredSlurmProvider


def config(*, account: str = "YOUR_ACCOUNT", qos: str = "debug", constraint: str = "gpu",
           nodes_per_block: int = 1, parallel_runs: int = 1, walltime: str = "00:30:00",
           worker_init: str = "module load python", address: str | None = None,
           run_dir: str = "runinfo") -> Config:
    site = load_site(f"perlmutter-{constraint}")  # hpcrl/sites/perlmutter-gpu.yaml or perlmutter-cpu.yaml
    gpus = f"#SBATCH --gpus-per-node={site.gpus_per_node}" if site.gpus_per_node else ""
    return Config(
        executors=[
            MPIExecutor(
                label="mpi",
                address=address or interface_address("hsn0"),  # the high-speed network reaches the compute nodes
                max_workers_per_block=parallel_runs,  # apps at once in one block: nodes_per_block / nodes per app
                mpi_launcher="srun",
                provider=DeferredSlurmProvider(
                    account=account,
                    qos=qos,
                    constraint=constraint,
                    nodes_per_block=nodes_per_block,
                    init_blocks=1,
                    max_blocks=1,
                    walltime=walltime,
                    scheduler_options=gpus,  # no per-task GPU options: apps share nodes' GPUs by local rank
                    launcher=SimpleLauncher(),
                    worker_init=worker_init,
                ),
            ),
            ThreadPoolExecutor(label="local", max_threads=2),
        ],
        run_dir=run_dir,
    )
