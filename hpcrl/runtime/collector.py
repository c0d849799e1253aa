"""Python's garbage collector while an hpcrl process starts: paused, then the start-up's objects made permanent.

Starting a rank or a run imports torch, h5py, Gymnasium and the config classes and builds the role: a few
hundred thousand container objects that live as long as the process. CPython's cyclic collector walks them
again each time a generation fills while they pile up: pausing it saved 0.7-1.3 s of CPU in a short serial run
(a fifth to a quarter of it; docs/results/runtime.md). So a process's entry point pauses collection (:func:`pause`) and,
once its roles are built, :func:`resume` moves everything alive to the permanent generation (``gc.freeze``:
later collections do not walk it either, and forked ranks do not touch those pages) and collects again.

Only a process whose own entry point paused it is changed: ``resume`` does nothing where collection runs (a
program or test that calls ``hpcrl.cli.main`` or a runner itself keeps its collector as it was).
"""
from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """An entry point's first call (``python -m hpcrl``, a rank's ``python -m hpcrl.runtime.runners.mpi``, the
    prestart server)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """The start-up's objects are built: they become permanent for the collector, which runs again."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
