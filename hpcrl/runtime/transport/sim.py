"""The job's shared objects in virtual time (``launch.runner: sim``): the serial runner's in-memory twins
(``runtime/transport/local.py``) whose operations cost what the cluster profile says and whose waits are the
virtual-time world's (``runtime/virtual_time.py``), so the role loops run unchanged.

=====================  ==============================================================================
here                   what an operation costs the role that makes it (its clock's ``compute``/``transfer``)
=====================  ==============================================================================
SimCounters            nothing (a few bytes); ``wait_until`` waits for the next change in virtual time
SimMailbox             a push: ``push`` on the learner, then its bytes over rank 0's link (remote learner);
                       a poll: ``receive`` on rank 0 per gradient taken; a push waiting for a slot wakes
                       on its group's news, at the back-off's next tick (not every tick)
SimBoard               a publish: ``publish`` on rank 0, before the version is visible; a read of a newer
                       version: ``fetch`` on the reader, then the bytes over rank 0's link (remote reader);
                       with launch.weight_tree an actor's read goes through ``SimWeightTree``; with node
                       weight caches only a node's first read of a version does, the others are a ``fetch``
SimWeightTree          an actor's read of a version its node's source relay lacks: each stale relay above it
                       filled top down (``fetch`` and the bytes over the source's link, then out to the
                       relay over the relay's link), then the copy from its source, as the MPI tree does
SimReports             a drain: ``report`` on rank 0 per message
SimFragments           a send: ``fragment_send`` on the actor; the fragment reaches its group's root after
                       the link's latency and bytes (a remote root)
SimGroupsAllreduce     learners.topology=allreduce: the groups' roots meet; the sum is every root's
                       ``allreduce_seconds(bytes)`` after the last one arrives (no core: the network's work)
SimNodeGather          learners.combine=node: a node's group roots meet per push; the node's pusher has every
                       part when the last arrives (a node's memory: no network time); the sum is its own work
=====================  ==============================================================================

A call made outside any role's turn (the runner's own set-up, as rank 0 publishes the first version) costs
nothing.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hpcrl.runtime.transport.groups_allreduce import LocalGroupsAllreduce
from hpcrl.runtime.transport.local import (LocalBoard, LocalCounters, LocalFragments, LocalLearnerLink,
                                           LocalMailbox, LocalReports)
from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.transport import control
from hpcrl.runtime.virtual_time import Signal, VirtualWorld


@dataclass(frozen=True)
class TransportPrices:
    """Seconds of each transport operation and where the ranks are (made by the sim runner from the profile)."""

    push: Callable[[int], float]
    receive: Callable[[int], float]
    publish: Callable[[int], float]
    fetch: Callable[[int], float]
    fragment_send: float
    report: float
    link_times: Callable[[int, int, int], tuple[float, float]]
    """(rank, other rank, bytes) -> (the latency, the seconds the bytes hold the sender's link) between their nodes
    ((0, 0) on one node)."""


class GroupNews:
    """A signal per learner group for what its root, waiting for a free mailbox slot, can see change: a slot of
    the group freed (rank 0 took a push), a fragment reaching the group, the run stopping."""

    def __init__(self, world: VirtualWorld) -> None:
        self.world = world
        self._signals: dict[int, Signal] = {}
        self._stop_watchers: list[Signal] = []

    def signal(self, group: int) -> Signal:
        if group not in self._signals:
            self._signals[group] = self.world.signal()
        return self._signals[group]

    def notify(self, group: int) -> None:
        if group in self._signals:
            self._signals[group].notify()

    def watch_stop(self, signal: Signal) -> Signal:
        """``signal`` is notified too when the run stops: a meeting's, whose members then look at ``wait()`` at
        once, as under MPI they poll it between tests of the collective (not a heartbeat's virtual second later)."""
        self._stop_watchers.append(signal)
        return signal

    def notify_all(self) -> None:
        """The run stopped."""
        for signal in (*self._signals.values(), *self._stop_watchers):
            signal.notify()


class _Notifying:
    """The ``changes`` of the in-memory twins (their ``bump()`` on each change) as a virtual-time signal."""

    def __init__(self, signal: Signal) -> None:
        self.signal = signal

    def bump(self) -> None:
        self.signal.notify()


class _Charges:
    """What the sim twins share: the world, the prices, rank 0's link (one transfer at a time), the groups' news and
    the actors'."""

    def __init__(self, world: VirtualWorld, prices: TransportPrices) -> None:
        self.world, self.prices = world, prices
        self.rank0_link = world.resource(1)
        self.news = GroupNews(world)
        self.actor_news = world.signal()  # what an actor waiting for room to send looks at changed (ActorNap)

    def compute(self, seconds: float, what: str) -> None:
        role = self.world.current
        if role is not None:
            role.clock.compute(seconds, what)

    def to_or_from_rank0(self, rank: int, nbytes: int, what: str) -> None:
        """``nbytes`` between ``rank`` and rank 0, on rank 0's shared link (nothing on rank 0's node)."""
        self.over(self.rank0_link, rank, 0, nbytes, what)

    def over(self, link, a: int, b: int, nbytes: int, what: str) -> None:
        """``nbytes`` between ranks ``a`` and ``b``, holding ``link`` (one transfer at a time) while they move, then
        the latency, which does not hold it (a NIC has many messages in flight: bandwidth is what they share)."""
        role = self.world.current
        latency, moving = self.prices.link_times(a, b, nbytes)
        if role is not None and latency + moving > 0:
            role.clock.transfer(moving, link, what, latency)

    def caller_rank(self) -> int | None:
        role = self.world.current
        return None if role is None else role.rank


class SimCounters(LocalCounters):
    """Counter words whose every change wakes the roles waiting in :meth:`wait_until` (and a change of STOP every
    learner group waiting for a mailbox slot)."""

    def __init__(self, n: int, world: VirtualWorld, news: GroupNews, actor_news: Signal | None = None,
                 actor_words: int = 0):
        """``actor_news``: notified by a change of the first ``actor_words`` words (the control words up to the
        backlogs: what an actor waiting for room reads; not the heartbeats)."""
        super().__init__(n, threading.Event())  # the world ends the roles; this abort flag is never set
        self.world, self.news = world, news
        self.actor_news, self.actor_words = actor_news, actor_words
        self.changed = world.signal()

    def add(self, i: int, value: int = 1) -> int:
        old = super().add(i, value)
        self._notify_change(i)
        return old

    def add_each(self, first: int, values) -> None:
        super().add_each(first, values)
        self._notify_change(first)

    def set(self, i: int, value: int) -> int:
        old = super().set(i, value)
        self._notify_change(i)
        return old

    def _notify_change(self, i: int) -> None:
        self.changed.notify()
        if i < self.actor_words:
            self.actor_news.notify()
        if i == control.STOP:
            self.news.notify_all()

    def wait_until(self, predicate, timeout: float, nap: float | None = None) -> bool:
        end = self.world.env.now + timeout
        while not predicate(self._words):
            left = end - self.world.env.now
            if left <= 0:
                return False
            self.world.current.clock.wait_for(self.changed, left, "a counter")
        return True


class SimMailbox(LocalMailbox):
    def __init__(self, charges: _Charges, num_groups: int, slots_per_group: int, num_params: int,
                 stats_capacity: int = 8):
        super().__init__(num_groups, slots_per_group, num_params, stats_capacity)
        self.charges = charges

    def try_push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray, stats=None) -> bool:
        if self._held[group] >= self.slots_per_group:  # only this group's root fills its slots: still free below
            return False
        c = self.charges
        c.compute(c.prices.push(self.num_params), "a push")
        rank = c.caller_rank()
        if rank is not None:
            c.to_or_from_rank0(rank, 4 * self.num_params, "a push's bytes")
        return super().try_push(group, seq, base_version, samples, grad, stats)

    def poll(self, limit: int | None = None):
        got = super().poll(limit)
        if got:
            for group in {header.group for header, _ in got}:
                self.charges.news.notify(group)
            self.charges.compute(len(got) * self.charges.prices.receive(self.num_params), "receiving pushes")
        return got

    def _nap(self, group: int, backoff: Backoff) -> None:
        """The learner's nap until its group's news (a slot freed, a fragment in, the stop): :func:`nap_on_news`,
        woken once instead of once a virtual millisecond while rank 0 is busy with other groups' pushes."""
        if self.charges.world.current is None:
            backoff.sleep()
            return
        nap_on_news(backoff, self.charges.news.signal(group), "a mailbox slot")


def nap_on_news(backoff: Backoff, news: Signal, what: str) -> None:
    """One nap of ``backoff`` that ends at its tick, as polling would, but without the ticks at which nothing the
    napper looks at has changed: wait for ``news`` or a virtual second's turn (the napper's heartbeat), then sleep
    on to the first of the back-off's ticks from then. The napper looks again at the virtual time it would have
    nap by nap (a nap in which nothing it sees changes does nothing), woken once instead of at every tick."""
    clock = backoff.clock
    start, delay = clock.now(), backoff.delay
    clock.wait_for(news, math.floor(start) + 1 - start, what)
    seen = clock.now()
    tick = start + delay
    while tick < seen:
        delay = min(delay * 2, backoff.cap)
        tick += delay
    if tick > seen:
        clock.sleep(tick - seen)
    backoff.waited += tick - start
    backoff.delay = min(delay * 2, backoff.cap)


class ActorNap(Backoff):
    """An actor's back-off while it waits for room to send (actor.wait_for_groups), in virtual time: its naps end
    at the MPI runner's ticks, skipping those at which nothing it looks at changed (``news``: the control counter
    words, a fragment delivered or taken, a version published: :class:`_Charges`' ``actor_news``)."""

    def __init__(self, clock, news: Signal):
        super().__init__(5e-5, 5e-3, clock)  # the MPI runner's (runners/mpi.py actor_nap)
        self.news = news

    def sleep(self) -> None:
        nap_on_news(self, self.news, "room to send a fragment")


class SimWeightTree:
    """launch.weight_tree in virtual time: the relays of runtime/transport/weight_tree.py as versions held, each on
    its node's link (one transfer at a time), numbered and filled as there. ``leaders[i]``: node i's first actor
    rank; ``node_of``: each actor rank's node number."""

    def __init__(self, charges: _Charges, fanout: int, leaders: list[int], node_of: dict[int, int]) -> None:
        from hpcrl.runtime.transport.weight_tree import has_children, source_of

        self.charges, self.fanout, self.leaders, self.node_of = charges, fanout, leaders, node_of
        self.source_of = lambda i: source_of(i, fanout)
        self.keeps = [has_children(i, fanout, len(leaders)) for i in range(len(leaders))]
        self.held = [-1] * len(leaders)  # the version each relay holds
        self.links = {i: charges.world.resource(1) for i, keeps in enumerate(self.keeps) if keeps}
        self.fills = 0

    def reads(self, rank: int) -> bool:
        return rank in self.node_of

    def fetch(self, rank: int, version: int, floats: int) -> None:
        """``rank``'s read of ``version`` (``floats`` values) through the tree, priced on its clock."""
        node = self.node_of[rank]
        target = node if self.keeps[node] else self.source_of(node)
        stale, at = [], target
        while at >= 0 and self.held[at] < version:
            stale.append(at)
            at = self.source_of(at)
        for relay in reversed(stale):  # the fills unwind from the top: each relay from its source
            self._copy(self.source_of(relay), rank, floats, "a relay's fill from its source")
            self._send(rank, relay, floats)
            self.held[relay] = version
            self.fills += 1
        if not stale:  # a filler holds what it wrote last (its target's version) already
            self._copy(target, rank, floats, "a weight fetch through the tree")

    def _copy(self, source: int, rank: int, floats: int, what: str) -> None:
        c = self.charges
        c.compute(c.prices.fetch(floats), what)
        if source < 0:
            c.to_or_from_rank0(rank, 4 * floats, f"{what}'s bytes")
        else:
            c.over(self.links[source], self.leaders[source], rank, 4 * floats, f"{what}'s bytes")

    def _send(self, rank: int, relay: int, floats: int) -> None:
        self.charges.over(self.links[relay], rank, self.leaders[relay], 4 * floats, "a relay's fill's bytes")


class SimBoard(LocalBoard):
    def __init__(self, charges: _Charges, num_params: int, history: int = 4, probe_size: int = 0,
                 tree: SimWeightTree | None = None, cache_node: Callable[[int], str | None] | None = None):
        """``cache_node``: with launch.node_weight_cache on, an actor rank's node (None for other ranks)."""
        super().__init__(num_params, history, probe_size)
        self.charges, self.tree, self.cache_node = charges, tree, cache_node
        self.cached: dict[str, int] = {}  # the version each node's weight cache holds

    def publish(self, version: int, flat: np.ndarray, probe: np.ndarray | None = None) -> None:
        self.charges.compute(self.charges.prices.publish(self.num_params), "a publish")
        super().publish(version, flat, probe)
        self.charges.actor_news.notify()  # actors.on_policy: a new version gives an actor a new share of places

    def _copying(self, version: int, floats: int) -> None:
        """The reader's fetch of ``floats`` values: ``fetch`` on its core, then the bytes over rank 0's link (none for
        rank 0)."""
        c = self.charges
        rank = c.caller_rank()
        if rank is None or rank == 0:
            return
        node = None if self.cache_node is None else self.cache_node(rank)
        if node is not None:  # launch.node_weight_cache: the node's first reader of a version fetches it for all
            if self.cached.get(node, -1) >= version:
                c.compute(c.prices.fetch(floats), "a copy from the node's weight cache")
                return
            self.cached[node] = version
        if self.tree is not None and self.tree.reads(rank):
            self.tree.fetch(rank, version, floats)
            return
        c.compute(c.prices.fetch(floats), "a weight fetch")
        c.to_or_from_rank0(rank, 4 * floats, "a weight fetch's bytes")


class SimReports(LocalReports):
    def __init__(self, charges: _Charges):
        super().__init__()
        self.charges = charges

    def drain(self, most: int | None = None):
        got = super().drain(most)
        if got:
            self.charges.compute(len(got) * self.charges.prices.report, "reports")
        return got


class SimFragments(LocalFragments):
    """Fragment queues whose fragments arrive after their link's time (sent at once: the actor goes on)."""

    def __init__(self, charges: _Charges, layout, num_groups: int, num_actors: int, max_in_flight: int,
                 root_of_group: Callable[[int], int]):
        # a fragment delivered or taken changes what an actor waiting for room sees (its fragments in flight)
        super().__init__(layout, num_groups, num_actors, max_in_flight, threading.Event(),
                         changes=_Notifying(charges.actor_news))
        self.charges, self.root_of_group = charges, root_of_group
        self.travelling = 0  # sent, not yet arrived

    def learner_link(self, group: int) -> "SimLearnerLink":
        return SimLearnerLink(self, group)

    def _deliver(self, group: int, actor: int, packed: dict) -> None:
        """The sender pays ``fragment_send``; the fragment reaches the group's root after the link's time (at once
        on its node)."""
        c = self.charges
        c.compute(c.prices.fragment_send, "a fragment send")
        rank = c.caller_rank()
        seconds = 0.0 if rank is None else sum(c.prices.link_times(rank, self.root_of_group(group), self.layout.nbytes))
        self.travelling += 1

        def arrive(_event=None) -> None:
            self.travelling -= 1
            super(SimFragments, self)._deliver(group, actor, packed)
            c.news.notify(group)

        if seconds > 0:
            c.world.env.timeout(seconds).callbacks.append(arrive)
        else:
            arrive()


class SimLearnerLink(LocalLearnerLink):
    def finished(self) -> bool:
        """Every actor closed, and nothing on its way or waiting for this group."""
        return super().finished() and self.hub.travelling == 0


class SimGroupsAllreduce(LocalGroupsAllreduce):
    """The group roots' allreduce in virtual time: each waits (a heartbeat's virtual second at a time, or until the
    run stops) for the last root, and every root has the sum ``seconds(bytes)`` after that one arrived."""

    def __init__(self, world: VirtualWorld, news: GroupNews, groups: int, seconds: Callable[[int], float]) -> None:
        super().__init__(groups)
        self.world, self.seconds = world, seconds
        self.met = news.watch_stop(world.signal())
        self.ready_at = 0.0

    def _sum(self, group: int, part: np.ndarray, wait: Callable[[], bool]) -> np.ndarray | None:
        if self.broken:
            return None
        clock = self.world.current.clock
        generation = self.generation
        if self._arrive(group, part):  # the last root: the sum, ready for all after the network's time
            self.ready_at = self.world.env.now + self.seconds(part.nbytes)
            self.met.notify()
        if not _meeting_ends(self, generation, clock, wait, "the other groups' allreduce"):
            return None
        result = self.result.copy()
        if self.ready_at > self.world.env.now:
            clock.sleep(self.ready_at - self.world.env.now)
        return result


def _meeting_ends(meeting, generation: int, clock, wait: Callable[[], bool], what: str) -> bool:
    """Wait, a heartbeat's virtual second at a time, until ``meeting`` (SimGroupsAllreduce, SimNodeGather) has moved
    past ``generation``: True; False once ``wait()`` says the run has stopped, which breaks the meeting for all."""
    while meeting.generation == generation:
        if wait():
            meeting.broken = True
            meeting.met.notify()
            return False
        clock.wait_for(meeting.met, 1.0, what)
    return True


class SimNodeGather:
    """A node's group roots' gather (learners.combine=node) in virtual time: each root's part waits, a heartbeat's
    virtual second at a time, for the node's last; then the node's pusher (its first group) has them all in group
    order and the others go on (an empty list), as with MPI's Igather of a gradient (a rendezvous)."""

    def __init__(self, world: VirtualWorld, news: GroupNews, groups: list[int]) -> None:
        self.world, self.groups, self.members = world, groups, len(groups)
        self.met = news.watch_stop(world.signal())
        self.parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.result: list[tuple[np.ndarray, np.ndarray]] = []
        self.generation = 0
        self.broken = False

    def for_group(self, group: int) -> "SimNodeMember":
        return SimNodeMember(self, group)

    def gather(self, group: int, meta: np.ndarray, part: np.ndarray, wait: Callable[[], bool]
               ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        if self.broken:
            return None
        generation = self.generation
        self.parts[group] = (meta.copy(), part.copy())
        if len(self.parts) == self.members:
            self.result, self.parts = [self.parts[g] for g in self.groups], {}
            self.generation += 1
            self.met.notify()
        if not _meeting_ends(self, generation, self.world.current.clock, wait, "the other groups of its node"):
            return None
        return self.result if group == self.groups[0] else []


class SimNodeMember:
    """Group ``group``'s handle on its node's :class:`SimNodeGather` (``protocols.NodeGather``)."""

    def __init__(self, shared: SimNodeGather, group: int) -> None:
        self.shared, self.group, self.members = shared, group, shared.members

    @property
    def broken(self) -> bool:
        return self.shared.broken

    def gather(self, meta: np.ndarray, part: np.ndarray, wait: Callable[[], bool]
               ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        return self.shared.gather(self.group, meta, part, wait)

    def close(self) -> None:
        pass
