from importlib.metadata import version as _v

__all__ = ["ClusterEnv", "__version__"]
try:
    __version__ = _v("hpcrl")
except Exception:  # running from a source tree that is not installed
    __version__ = "0.1.0"


def __getattr__(name: str):
    """``hpcrl.ClusterEnv`` is imported on first use, so ``import hpcrl`` stays cheap (no gymnasium, no MPI)."""
    if name == "ClusterEnv":
        from hpcrl.clusterenv import ClusterEnv

        return ClusterEnv
    raise AttributeError(f"module 'hpcrl' has no attribute {name!r}")
