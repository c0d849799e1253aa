"""ClusterEnv (DETACH + AAPS): a Gymnasium vector env whose copies run on MPI worker ranks.

``hpcrl.ClusterEnv(env_id, num_envs, workers=W, **options)``; see :mod:`hpcrl.clusterenv.env`.
Importing this package imports neither mpi4py nor torch (the constructor does).
"""
from hpcrl.clusterenv.env import ClusterEnv, WorkerError, WorkerLost, WorkerStalled

__all__ = ["ClusterEnv", "WorkerError", "WorkerLost", "WorkerStalled"]
