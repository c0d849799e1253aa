"""Where a role's wall time goes: phase clocks for the learner cycle and the parameter rank's load.

A :class:`PhaseClock` charges every stretch of a loop's wall time to one phase with
:meth:`~PhaseClock.lap` (the seconds since the previous lap), so the phases add up to the
elapsed time with nothing left out and no timer to forget to stop.

:class:`CycleRecord` is the learner group root's use of it, one row per gradient pushed
(run.h5 table ``learner_cycles``): a cycle runs from the end of the group's previous push to
the end of this one, so time before the first gradient of a batch (waiting for fragments,
post-processing) is charged to that gradient. Parked time (an inactive group) belongs to no
cycle (:meth:`PhaseClock.restart`). The rows travel to the parameter rank with the group's
``learner_activity`` report, one message per batch.
"""
from __future__ import annotations

from typing import Callable

from hpcrl.runtime.clock import WALL, Clock

LEARNER_PHASES = ("idle", "receive", "prepare", "minibatch", "control", "weights", "window", "gradient",
                  "flatten", "allreduce", "push", "push_wait")
"""Phases of a learner cycle: column ``<phase>_seconds`` of ``learner_cycles`` (meanings in io.schema)."""

PARAMETER_PHASES = ("receive", "admit", "apply", "publish", "record", "idle", "other")
"""Phases of the parameter rank's loop: column ``<phase>_seconds`` of ``parameter_load``."""


class PhaseClock:
    """Seconds per phase since the last :meth:`take` (or :meth:`restart`)."""

    def __init__(self, phases: tuple[str, ...], clock: Clock = WALL) -> None:
        self.phases, self.clock = phases, clock
        self.seconds = dict.fromkeys(phases, 0.0)
        self.mark = self.start = clock.now()
        self.cpu_mark: float | None = None  # set by restart, in the role's own thread (or turn, in virtual time)

    def lap(self, phase: str) -> float:
        """Charge the seconds since the previous lap to ``phase``; return them."""
        now = self.clock.now()
        dt = now - self.mark
        self.seconds[phase] += dt
        self.mark = now
        return dt

    def move(self, seconds: float, src: str, dst: str) -> None:
        """Re-charge ``seconds`` already charged to ``src`` to ``dst`` (e.g. the wait inside a push)."""
        seconds = min(seconds, self.seconds[src])
        self.seconds[src] -= seconds
        self.seconds[dst] += seconds

    def restart(self) -> None:
        """Forget the time since the last take (e.g. a park: parked time belongs to no cycle)."""
        self.seconds = dict.fromkeys(self.phases, 0.0)
        self.mark = self.start = self.clock.now()
        self.cpu_mark = self.clock.thread_time()  # the caller's thread: the role's, once it runs

    def cpu_take(self) -> float:
        """CPU seconds of the calling thread since the last ``cpu_take`` or ``restart`` (virtual time: the role's
        priced work)."""
        now = self.clock.thread_time()
        seconds, self.cpu_mark = (0.0 if self.cpu_mark is None else now - self.cpu_mark), now
        return seconds

    def take(self) -> tuple[float, dict[str, float]]:
        """(elapsed seconds, seconds per phase) up to the last lap; counting starts again from it."""
        elapsed, seconds = self.mark - self.start, self.seconds
        self.seconds = dict.fromkeys(self.phases, 0.0)
        self.start = self.mark
        return elapsed, seconds


class CycleRecord:
    """A learner group root's cycle clock and the ``learner_cycles`` rows of its finished cycles."""

    COLUMNS = ("time", "group", "seq", "base_version", "cycle_seconds", *(f"{p}_seconds" for p in LEARNER_PHASES))

    def __init__(self, group: int, clock: Clock = WALL, cpu_time: Callable[[], float] | None = None) -> None:
        """``cpu_time``: the group root thread's CPU seconds (``time.thread_time``) where roles share one interpreter
        (the serial runner); its busy time is then that CPU time plus the seconds it slept standing in for
        compute (:meth:`slept`), not wall time, of which the waits for the interpreter lock would be part."""
        self.group, self.time = group, clock
        self.clock = PhaseClock(LEARNER_PHASES, clock)
        self.lap = self.clock.lap
        self.rows = self._empty()
        self.cpu_time = cpu_time
        self._cpu_start = cpu_time() if cpu_time is not None else 0.0
        self._slept = 0.0

    def restart(self) -> None:
        """Forget the time since the last cycle ended (a park: parked time belongs to no cycle)."""
        self.clock.restart()
        self._new_cycle()

    def slept(self, seconds: float) -> None:
        """The group slept ``seconds`` in place of computing (debug.learner_delay_seconds): busy time."""
        self._slept += seconds

    def _new_cycle(self) -> None:
        if self.cpu_time is not None:
            self._cpu_start = self.cpu_time()
        self._slept = 0.0

    def close(self, seq: int, base_version: int, push_wait: float) -> None:
        """The gradient ``seq`` was just pushed (after ``push_wait`` seconds waiting for a slot): end its cycle."""
        self.clock.lap("push")
        self.clock.move(push_wait, "push", "push_wait")
        elapsed, seconds = self.clock.take()
        self._new_cycle()
        rows = self.rows
        rows["time"].append(self.time.unix())
        rows["group"].append(self.group)
        rows["seq"].append(seq)
        rows["base_version"].append(base_version)
        rows["cycle_seconds"].append(elapsed)
        for p in LEARNER_PHASES:
            rows[f"{p}_seconds"].append(seconds[p])

    def busy_so_far(self) -> float:
        """Seconds of the current cycle up to its last lap, without its waits (for data, for a mailbox slot); with
        ``cpu_time``, its CPU seconds so far and the seconds it slept in place of computing."""
        if self.cpu_time is not None:
            return self.cpu_time() - self._cpu_start + self._slept
        c = self.clock
        return c.mark - c.start - c.seconds["idle"] - c.seconds["push_wait"]

    def take_rows(self) -> dict[str, list]:
        """Rows of the cycles closed since the last call, as column lists (times in Unix seconds)."""
        out, self.rows = self.rows, self._empty()
        return out

    def _empty(self) -> dict[str, list]:
        return {k: [] for k in self.COLUMNS}
