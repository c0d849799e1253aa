"""The time a role lives in: the wall clock of a real job, or the virtual clock of a simulated one.

Every role reads time, waits and says what work it just did through one :class:`Clock`, the Job's
(``job.clock``), never through the ``time`` module:

- ``now()``: seconds on a monotonic clock (durations, deadlines, the elastic rule's rates);
- ``unix()``: seconds since the epoch (the time of a report or a row; run.h5 stores them from the run's start);
- ``sleep(seconds)``: a nap of a wait loop (:class:`~hpcrl.runtime.backoff.Backoff`);
- ``did(work, count)``: the role has just done ``count`` units of ``work`` (:class:`Work`);
- ``thread_time()``: CPU seconds of the calling thread (a park's cost).

:data:`WALL` is the real one (``did`` costs nothing more: the work took its real time). Under
``launch.runner: sim`` each role has a clock of the virtual-time world (``runtime/virtual_time.py``) where
``did`` advances that role's time by the cluster profile's cost of the work and ``sleep`` lets the other roles
run (hpcrl.cluster_profiles). Roles cannot tell the two apart.
"""
from __future__ import annotations

import enum
import time
from typing import Protocol


class Work(enum.Enum):
    """The computations a cluster profile prices (its ``costs``); the rest of a role's loop costs nothing."""

    ENV_STEPS = "env_steps"
    """Actor: env steps of its vector, each with its policy forward pass (count: steps x envs)."""
    GRADIENT = "gradient"
    """Learner: one minibatch gradient (count: minibatches)."""
    INNER_STEP = "inner_step"
    """Learner under ``learners.push: update``: one optimizer step of its own (count: steps)."""
    PREPARE = "prepare"
    """Learner: the batch's preparation before its minibatches (PPO: GAE; count: env steps)."""
    RECORD = "record"
    """Actor: its fragment written to its trajectory file (count: env steps)."""
    COMBINE = "combine"
    """Learner under ``learners.combine: node``, the node's pusher: one member's gradient added to the node's sum
    (count: members)."""
    ADMIT = "admit"
    """Parameter rank: the admission policy on one arrival."""
    APPLY = "apply"
    """Parameter rank: one optimizer step on an admitted gradient, or the outer step on an update."""


class Clock(Protocol):
    def now(self) -> float: ...
    def unix(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...
    def did(self, work: Work, count: float = 1) -> None: ...
    def thread_time(self) -> float: ...


class WallClock:
    """The real clock of ``mpi`` and ``serial`` jobs."""

    def now(self) -> float:
        return time.monotonic()

    def unix(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def did(self, work: Work, count: float = 1) -> None:
        """Nothing: the work took its own time."""

    def thread_time(self) -> float:
        return time.thread_time()


WALL = WallClock()
