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

MPICH's blocking calls poll the network at full speed, which on an oversubscribed node
takes the core from the rank that has work. Every wait here is a test-and-sleep loop.
"""
from __future__ import annotations

import time

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


class Sleeper:
    """Back-off for idle loops: sleep 50 us doubling to ``cap``; ``reset`` after useful work."""

    def __init__(self, first: float = 5e-5, cap: float = 2e-3):
        self.first, self.cap = first, cap
        self.delay = first

    def idle(self) -> None:
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap)

    def reset(self) -> None:
        self.delay = self.first


def wait_request(req, sleeper: Sleeper | None = None, abandon=None):
    """Wait for an mpi4py request by Test + sleep; returns its result (lowercase API) or None.

    ``abandon()`` returning True stops the wait early (the request stays pending; returns None).
    """
    sleeper = sleeper or Sleeper()
    while True:
        done, value = _test(req)
        if done:
            return value
        if abandon is not None and abandon():
            return None
        sleeper.idle()


def _test(req):
    out = req.test()
    if isinstance(out, tuple):
        return out
    return bool(out), None


def recv_polling(comm, source: int, tag: int, sleeper: Sleeper | None = None, abandon=None):
    """Receive one pickled message without spinning: Iprobe + sleep, then recv."""
    sleeper = sleeper or Sleeper()
    while not comm.Iprobe(source=source, tag=tag):
        if abandon is not None and abandon():
            return None
        sleeper.idle()
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
