"""The small shared state of a job: control counters, message tags, and waiting without spinning.

The parameter rank owns one :class:`~hpcrl.runtime.windows.CounterWindow` whose words
every rank reads and updates atomically (one operation kind per word, as MPI's default
``accumulate_ops`` hint requires):

=====================  ======  ==========================================================
word                   op      meaning
=====================  ======  ==========================================================
STOP                   set     1 once the parameter rank decided to stop
ACTIVE                 set     learner groups that are active (groups 0 .. ACTIVE-1)
ACTORS_DONE            add     actors that finished their last send
LEARNERS_DONE          add     learner groups that left their loop
ENV_STEPS              add     environment steps sampled by all actors
BACKLOG + g            add     fragments sent to group g and not yet trained on
base_word(G, g)        set     policy version group g is computing its gradients with
=====================  ======  ==========================================================

Every wait is a test-and-sleep loop (:class:`~hpcrl.runtime.backoff.Backoff`): MPICH's blocking
calls would poll the network at full speed and take the core from the rank that has work.
"""
from __future__ import annotations

import time

from hpcrl.runtime.backoff import Backoff

STOP, ACTIVE, ACTORS_DONE, LEARNERS_DONE, ENV_STEPS, BACKLOG = range(6)

TAG_EPISODES = 11
"""Actor -> parameter rank: a pickled list of finished episodes (and sampling stats)."""
TAG_WORK = 12
"""Learner group root -> other ranks of its group: a pickled work item (batch, weights, stop)."""
TAG_ACTIVITY = 13
"""Learner group root -> parameter rank: one learner_activity row (a stretch of computation)."""

GRAD_STATS = ("loss", "compute_seconds", "mailbox_wait_seconds", "new_env_steps", "policy_loss",
              "value_loss", "entropy", "kl")
"""The float64 stats a learner pushes with each gradient, in this order (mailbox capacity 8)."""


def base_word(groups: int, g: int) -> int:
    """Counter of group g's current base version (for the IS truncation window of the others)."""
    return BACKLOG + groups + g


def num_counters(groups: int) -> int:
    return BACKLOG + 2 * groups


def wait_request(req, backoff: Backoff | None = None, abandon=None):
    """Wait for an mpi4py request by Test + sleep; returns its result (lowercase API) or None.

    ``abandon()`` returning True stops the wait early (the request stays pending; returns None).
    """
    backoff = backoff or Backoff(5e-5, 2e-3)
    while True:
        done, value = _test(req)
        if done:
            return value
        if abandon is not None and abandon():
            return None
        backoff.sleep()


def _test(req):
    out = req.test()
    if isinstance(out, tuple):
        return out
    return bool(out), None


def recv_polling(comm, source: int, tag: int, backoff: Backoff | None = None, abandon=None):
    """Receive one pickled message without spinning: Iprobe + sleep, then recv."""
    backoff = backoff or Backoff(5e-5, 2e-3)
    while not comm.Iprobe(source=source, tag=tag):
        if abandon is not None and abandon():
            return None
        backoff.sleep()
    return comm.recv(source=source, tag=tag)


class FaultInjector:
    """``debug.raise_on_rank``: that rank raises once ``raise_after_seconds`` of its loop have passed."""

    def __init__(self, debug_cfg, rank: int):
        self.rank = rank
        self.at = (time.monotonic() + debug_cfg.raise_after_seconds
                   if debug_cfg.raise_on_rank is not None and debug_cfg.raise_on_rank == rank else None)

    def check(self) -> None:
        if self.at is not None and time.monotonic() >= self.at:
            raise RuntimeError(f"debug.raise_on_rank={self.rank}: failing on purpose")
