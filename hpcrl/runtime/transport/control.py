"""The small shared state of a job: control counters, message tags, and waiting without spinning.

The parameter rank owns one :class:`~hpcrl.runtime.transport.windows.CounterWindow` whose words
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
EVAL                   set     rounds ended at the newest evaluation request (``eval.every_rounds``)
ACTIVE_ACTORS          set     actor ranks that sample (actors 0 .. ACTIVE_ACTORS-1; the others park;
                               actors.count unless the algorithm scales them, MARLess section 4.4)
CONSUMED               set     env steps the learners have trained on, set before the version they made is
                               published (learners.push=update: a group's lr schedule reads it per batch)
BACKLOG + g            add     fragments sent to group g and not yet trained on (with ``actors.on_policy``: not yet
                               in a published version; rank 0 frees every group's in one ``add_each``,
                               runtime/roles/freed_places.py)
base_word(G, g)        set     policy version group g is computing its gradients with
held_word(G, g)        set     1 while group g has a gradient held back by the admission policy
                               (ssp: a group too far ahead waits before computing more)
heartbeat_word(G, r)   set     rank r's heartbeat: whole seconds since the epoch, refreshed by
                               :class:`Heartbeat` at most once a second from every loop; FINISHED once
                               the rank's role has returned (:func:`mark_finished`)
=====================  ======  ==========================================================

Every wait is a test-and-sleep loop (:class:`~hpcrl.runtime.backoff.Backoff`): MPICH's blocking
calls would poll the network at full speed and take the core from the rank that has work. A parked
learner group or actor waits in ``counters.wait_until`` (a 50 ms nap between reads under MPI, a
condition variable woken by every counter change in the serial runner).
"""
from __future__ import annotations

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.clock import WALL, Clock

STOP, ACTIVE, ACTORS_DONE, LEARNERS_DONE, ENV_STEPS, EVAL, ACTIVE_ACTORS, CONSUMED, BACKLOG = range(9)

TAG_REPORT = 11
"""Any rank -> parameter rank: one pickled report (hpcrl.runtime.messages)."""
TAG_WORK = 12
"""Learner group root -> other ranks of its group: a pickled work item (batch, weights, stop)."""
TAG_SHARE = 15
"""Joined learner rank -> its group's root: the gradient of its share of a minibatch (runtime/transport/joining.py)."""

GRAD_STATS = ("loss", "compute_seconds", "mailbox_wait_seconds", "new_env_steps", "policy_loss",
              "value_loss", "entropy", "kl", "busy_seconds", "inner_steps", "clip_fraction", "fragments")
"""The float64 stats a learner pushes with each gradient, in this order (the mailbox's stats capacity).
busy_seconds: the gradient's learner cycle so far without its waits (for data, for a mailbox slot),
the elastic rule's measure of a group's capacity. inner_steps: optimizer steps the group took to make an
update (learners.push=update; the losses are then their means); 0 for a gradient. fragments: the places the batch
held in the group's backlog (actors.on_policy: rank 0 frees them once the push is in a published version)."""


def base_word(groups: int, g: int) -> int:
    """Counter of group g's current base version (for the IS truncation window of the others)."""
    return BACKLOG + groups + g


def held_word(groups: int, g: int) -> int:
    """Counter set to 1 while group g has a gradient held in the parameter rank's queue (ssp)."""
    return BACKLOG + 2 * groups + g


def heartbeat_word(groups: int, rank: int) -> int:
    """Counter of rank ``rank``'s heartbeat (for the watchdog on the parameter rank)."""
    return BACKLOG + 3 * groups + rank


FINISHED = -1
"""A heartbeat word's value once its rank's role returned: the watchdog no longer watches it (a rank that is done
is not silent while rank 0 shuts the job down)."""


def mark_finished(counters, groups: int, rank: int) -> None:
    """Say that rank ``rank``'s role has returned (each runner calls it after the role's ``run``)."""
    counters.set(heartbeat_word(groups, rank), FINISHED)


def num_counters(groups: int, ranks: int) -> int:
    return BACKLOG + 3 * groups + ranks


class Heartbeat:
    """A role's sign of life: ``beat()`` from every loop (also while waiting); one counter write a second."""

    def __init__(self, counters, groups: int, rank: int, clock: Clock = WALL):
        self.counters, self.word, self.clock = counters, heartbeat_word(groups, rank), clock
        self.last = 0

    def beat(self) -> None:
        now = int(self.clock.unix())
        if now != self.last:
            self.last = now
            self.counters.set(self.word, now)


class RankSilent(RuntimeError):
    """The watchdog ended the job: its message names the silent rank (said in one line, no traceback: the
    rank that raises it, rank 0, is not the one that failed)."""


class Watchdog:
    """Parameter rank: a rank whose heartbeat has not changed for ``warn`` seconds is named in a
    warning; after ``limit`` seconds :meth:`check` raises, which ends the job (both runners)."""

    def __init__(self, roles: list[str], nodes: list[str], groups: int, warn: float, limit: float,
                 clock: Clock = WALL):
        self.roles, self.nodes, self.groups = roles, nodes, groups
        self.warn, self.limit, self.clock = warn, limit, clock
        start = clock.now()
        self.seen = {r: (None, start) for r in range(1, len(roles))}
        self.warned: set[int] = set()

    def check(self, words) -> list[str]:
        """Warnings to print now (each stuck rank once); past the limit raises RuntimeError naming the rank quiet
        the longest (a hung node's ranks stop first; ranks that then wait on them go quiet after)."""
        now, out, stuck = self.clock.now(), [], []
        for r, (value, since) in self.seen.items():
            beat = int(words[heartbeat_word(self.groups, r)])
            if beat == FINISHED:
                self.warned.discard(r)
                continue
            if beat != value:
                self.seen[r] = (beat, now)
                self.warned.discard(r)
                continue
            quiet = now - since
            who = f"rank {r} ({self.roles[r]} on {self.nodes[r]})"
            if quiet >= self.limit:
                stuck.append((quiet, beat, who))
            elif quiet >= self.warn and r not in self.warned:
                self.warned.add(r)
                out.append(f"hpcrl: warning: {who} has made no progress for {quiet:.0f} s "
                           f"(the job ends after launch.watchdog_seconds={self.limit:g})")
        if stuck:  # the oldest heartbeat first (the watchdog's own clock only starts when it first sees a value)
            quiet, _, who = max(stuck, key=lambda q: (q[0], -q[1]))
            raise RankSilent(f"{who} made no progress for {quiet:.0f} s (launch.watchdog_seconds="
                             f"{self.limit:g}); ending the job")
        return out


PARK_NAP_SECONDS = 0.05
"""Under MPI, a parked learner group or actor reads the counters this often (about 20 small reads a second)."""


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
    """``debug.raise_on_rank``: that rank raises once ``raise_after_seconds`` of its loop have passed;
    ``debug.learner_delay_seconds``: a learner's :meth:`slow_down` sleeps that long (until
    ``learner_delay_until_seconds``); ``debug.slow_actor``: the injector made for that actor (``actor``, its
    index) sleeps ``slow_actor_seconds`` instead."""

    def __init__(self, debug_cfg, rank: int, actor: int | None = None, clock: Clock = WALL):
        self.rank, self.clock = rank, clock
        now = clock.now()
        self.at = (now + debug_cfg.raise_after_seconds
                   if debug_cfg.raise_on_rank is not None and debug_cfg.raise_on_rank == rank else None)
        if actor is None:
            self.delay, self.delay_for = debug_cfg.learner_delay_seconds, debug_cfg.learner_delay_until_seconds
        else:
            self.delay = debug_cfg.slow_actor_seconds if actor == debug_cfg.slow_actor else 0.0
            self.delay_for = None
        self.delay_until: float | None = None

    def slow_down(self) -> float:
        """Sleep the delay, for ``learner_delay_until_seconds`` after the first call (a gradient) if that is set;
        the seconds slept."""
        if not self.delay:
            return 0.0
        now = self.clock.now()
        if self.delay_until is None:
            self.delay_until = float("inf") if self.delay_for is None else now + self.delay_for
        if now < self.delay_until:
            self.clock.sleep(self.delay)
            return self.delay
        return 0.0

    def check(self) -> None:
        if self.at is not None and self.clock.now() >= self.at:
            raise RuntimeError(f"debug.raise_on_rank={self.rank}: failing on purpose")
