"""hpcrl: distributed reinforcement learning on MPI. ``import hpcrl`` imports nothing heavy (no torch,
gymnasium, MPI, not even importlib.metadata): every rank of a job starts with it. It registers hpcrl's
env ids with Gymnasium when Gymnasium is imported (now or later: :mod:`hpcrl.gymnasium_hook`)."""
from hpcrl.gymnasium_hook import register_on_gymnasium_import as _register_on_gymnasium_import

__all__ = ["ClusterEnv", "__version__"]
_register_on_gymnasium_import()


def __getattr__(name: str):
    """``hpcrl.ClusterEnv`` and ``hpcrl.__version__`` are looked up on first use."""
    if name == "ClusterEnv":
        from hpcrl.clusterenv import ClusterEnv

        return ClusterEnv
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("hpcrl")
        except PackageNotFoundError:  # running from a source tree that is not installed
            value = "0.1.0"
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'hpcrl' has no attribute {name!r}")
