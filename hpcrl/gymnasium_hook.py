"""Register hpcrl's env ids with Gymnasium whenever Gymnasium gets imported, without importing it here.

``import hpcrl`` must stay light (no gymnasium, numpy or torch: every rank of a job starts with it),
so it cannot import Gymnasium to register. :func:`register_on_gymnasium_import` (called by
``hpcrl/__init__.py``) registers at once when Gymnasium is already imported, and otherwise puts a
finder first on ``sys.meta_path`` that wraps Gymnasium's loader so the registration
(:func:`hpcrl.envs.gymnasium_ids.register_with_gymnasium`) runs right after Gymnasium's own
``import`` finishes; the finder then leaves. Either order of ``import hpcrl`` and ``import gymnasium``
works. This module imports only ``sys``.
"""
from __future__ import annotations

import sys


def _register() -> None:
    from hpcrl.envs.gymnasium_ids import register_with_gymnasium

    register_with_gymnasium()


class _RegisterAfter:
    """Runs Gymnasium's own loader, then registers hpcrl's ids (a loader by protocol: importlib.abc costs
    ~8 ms to import, and ``import hpcrl`` stays light)."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _register()

    def __getattr__(self, name: str):  # get_code, is_package, ... of the real loader
        return getattr(self.loader, name)


class _GymnasiumImportHook:
    """Finds ``gymnasium`` with the other finders and wraps its loader; removes itself after one use."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "gymnasium":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            found = getattr(finder, "find_spec", None) and finder.find_spec(fullname, path, target)
            if found is not None and found.loader is not None:
                found.loader = _RegisterAfter(found.loader)
                return found
        return None


def register_on_gymnasium_import() -> None:
    """Register now if Gymnasium is imported, else right after it is (see the module docstring)."""
    module = sys.modules.get("gymnasium")
    if module is not None and hasattr(module, "register"):
        _register()
    elif module is None and not any(isinstance(f, _GymnasiumImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _GymnasiumImportHook())
