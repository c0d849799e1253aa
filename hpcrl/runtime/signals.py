"""Stop signals from the first moment of a rank's life, and the exit codes of ``hpcrl run``.

SIGTERM (cancel) and SIGUSR1 (the scheduler's walltime warning) may arrive while a rank is still
importing torch or building its windows. :func:`remember_stop_signals` is the first thing a rank
does: it records such a signal instead of dying of it, and the parameter role acts on it at its
first check (checkpoint, then a clean stop); the other roles ignore it (the parameter role tells
them to stop through the STOP counter).
"""
from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

EXIT_FINISHED = 0
"""The run ended by its stop rule (env steps, target return, wall-clock)."""
EXIT_FAILED = 1
"""A rank or role failed; the record holds what was flushed before."""
EXIT_CONFIG = 2
"""Bad input: nothing was started (one line on stderr)."""
EXIT_STOPPED = 3
"""Stopped by SIGTERM/SIGUSR1 after writing a checkpoint: ``hpcrl run --resume RUN_DIR`` goes on."""
EXIT_TIMEOUT = 124
"""launch.timeout_seconds passed (the job was stopped as by SIGTERM)."""

_received: list[int] = []


def _record(signum, _frame) -> None:
    _received.append(signum)


def remember_stop_signals() -> None:
    """Record SIGTERM/SIGUSR1 from now on instead of dying of them."""
    for s in STOP_SIGNALS:
        signal.signal(s, _record)


def early_signal() -> int | None:
    """The first stop signal recorded since :func:`remember_stop_signals`, if any."""
    return _received[0] if _received else None
