from importlib.metadata import version as _v

__all__ = ["__version__"]
try:
    __version__ = _v("hpcrl")
except Exception:  # running from a source tree that is not installed
    __version__ = "0.1.0"
