"""The ClusterEnv AAPS record: one small HDF5 file, two tables (hpcrl.io's Column/TableSpec style).

File attributes: ``kind = "hpcrl.clusterenv"``, ``schema_version``, ``env_id``, ``num_envs``,
``workers``, ``kl_threshold``, ``kl_window``, ``label``, ``start_unix``. Times are seconds since the
ClusterEnv started. ``analysis/hpcrl_analysis/clusterenv.py`` reads it with h5py alone.
"""
from __future__ import annotations

from hpcrl.io.schema import Column, TableSpec

KIND = "hpcrl.clusterenv"
SCHEMA_VERSION = 1


def _c(name, dtype, unit, meaning, required=False):
    return Column(name, dtype, unit, meaning, required)


AAPS = TableSpec("aaps", "One row per worker each time the head publishes new weights (and once at close).", (
    _c("time", "f8", "s", "time of the publish, since the ClusterEnv started", True),
    _c("env_steps", "i8", "steps", "environment steps of all workers so far", True),
    _c("version", "i8", "", "the head's newest policy version (just published)", True),
    _c("worker", "i4", "", "worker index", True),
    _c("kl", "f8", "nats", "running mean of KL(pi_cached || pi_head) over the worker's recent states (seed's AAPS)", True),
    _c("syncs", "i8", "", "weight pulls by this worker so far (cumulative)", True),
    _c("cached_version", "i8", "", "policy version the worker acts with"),
))

EPISODES = TableSpec("episodes", "One row per finished episode (worker-side inference steps).", (
    _c("time", "f8", "s", "time the episode ended, since the ClusterEnv started", True),
    _c("env_steps", "i8", "steps", "environment steps of all workers when it ended", True),
    _c("worker", "i4", "", "worker index", True),
    _c("env_index", "i4", "", "env index within the whole ClusterEnv", True),
    _c("return", "f4", "", "undiscounted episodic return", True),
    _c("length", "i4", "steps", "episode length", True),
    _c("policy_version", "i8", "", "version the worker acted with when the episode ended"),
))

TABLES = (AAPS, EPISODES)
