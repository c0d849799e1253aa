"""Runners: each builds the Plan's roles and runs them (``mpi``: one rank per role; ``serial``: every role in one
process; ``sim``: every role in one process in virtual time; ``fused``: one device loop), plus fast start
(prestart) and start-up timing.

Every runner is one call, ``run(plan, run_dir, resume=False, progress="plain") -> RunResult``, in the module
:func:`runner` names for ``plan.runner``: ``mpiexec.run`` starts the job's ranks (each runs ``mpi.py``),
``serial.run`` and ``fused.run`` train in this process. ``hpcrl run`` calls the one its plan chose, once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

from hpcrl.runtime.signals import EXIT_FAILED, EXIT_FINISHED, EXIT_STOPPED

RUNNERS = {"mpi": "hpcrl.runtime.runners.mpiexec", "serial": "hpcrl.runtime.runners.serial",
           "fused": "hpcrl.runtime.runners.fused", "sim": "hpcrl.runtime.runners.sim"}
"""plan.runner -> the module whose ``run`` runs the job (imported when it runs)."""


def runner(name: str) -> ModuleType:
    """The module of runner ``name`` (``mpi``, ``serial``, ``sim`` or ``fused``)."""
    return import_module(RUNNERS[name])


@dataclass(frozen=True)
class RunResult:
    """How a job ended, as every runner hands it back (``hpcrl run`` prints ``message`` and exits ``exit_code``)."""

    runner: str
    run_dir: Path
    stop_reason: str = ""
    """The stop rule's reason, or ``signal NAME``; "" when the job ended without a summary (it failed)."""
    summary: Mapping[str, Any] = field(default_factory=dict)
    """The closing summary (:meth:`hpcrl.runtime.record.run_record.RunRecord.summary`); empty without one."""
    exit_code: int = EXIT_FINISHED
    message: str = ""
    """One line for stderr when the job did not end by its stop rule (stopped, timed out, failed)."""
    details: str = ""
    """What goes before the message (a failed role's traceback)."""

    @classmethod
    def ended(cls, runner: str, run_dir: Path, summary: Mapping[str, Any]) -> "RunResult":
        """A job that ended with a summary: by its stop rule, or by a stop signal after a checkpoint."""
        reason = str(summary.get("stop_reason") or "")
        if reason.startswith("signal"):
            return cls(runner, run_dir, reason, summary, EXIT_STOPPED,
                       f"stopped by {reason.split()[-1]} with a checkpoint; go on with `hpcrl run --resume {run_dir}`")
        return cls(runner, run_dir, reason, summary)

    @classmethod
    def failed(cls, runner: str, run_dir: Path, message: str, exit_code: int = EXIT_FAILED,
               details: str = "", summary: Mapping[str, Any] | None = None) -> "RunResult":
        """A job that failed or was ended from outside (``message``: one line, without the ``hpcrl run:``)."""
        summary = summary or {}
        return cls(runner, run_dir, str(summary.get("stop_reason") or ""), summary, exit_code, message, details)
