"""How much the ``hpcrl`` commands print: ``-q`` (errors and the final summary), the default, ``-v`` (more detail).

``hpcrl -q|-v COMMAND`` or ``hpcrl COMMAND -q|-v`` sets the level once (:func:`set_level`, from
:mod:`hpcrl.cli`); whatever prints reads it when it prints:

- QUIET: ``hpcrl run`` prints no start lines and no progress (line or bar), only warnings and errors (stderr)
  and the end-of-run summary;
- NORMAL: the start lines (runner, run directory, live scalars, start-up time) and a progress line every
  ``io.log_seconds`` (a bar on a terminal);
- VERBOSE: also the plan the run follows and the checkpoint a resume goes on from, and a progress line at
  every update the run reports (at most two a second in-process, one under MPI) with the numbers the plain
  line leaves out (the fused loop's loss terms; the roles' records hold nothing more than the line).

Commands other than ``run`` print their results only, at every level.
"""
from __future__ import annotations

QUIET, NORMAL, VERBOSE = 0, 1, 2
NAMES = {QUIET: "quiet", NORMAL: "normal", VERBOSE: "verbose"}

_level = NORMAL


def set_level(level: int) -> None:
    if level not in NAMES:
        raise ValueError(f"verbosity: {level!r} is not allowed; allowed: {', '.join(map(str, NAMES))}")
    global _level
    _level = level


def level() -> int:
    return _level


def say(*args, **kwargs) -> None:
    """print() unless QUIET (start lines and other news)."""
    if _level >= NORMAL:
        print(*args, **kwargs)


def detail(*args, **kwargs) -> None:
    """print() only when VERBOSE."""
    if _level >= VERBOSE:
        print(*args, **kwargs)
