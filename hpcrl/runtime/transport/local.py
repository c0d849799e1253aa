"""In-memory twins of the job's shared objects, for the serial runner (all roles in one process).

Each class has the interface of its MPI counterpart, so the role loops cannot tell them apart:

=====================  ============================================  =====================
here                   MPI counterpart                               interface
=====================  ============================================  =====================
LocalCounters          windows.CounterWindow                         add, set, read, read_all
LocalMailbox           windows.GradientMailbox                       try_push, push, poll
LocalBoard             windows.WeightBoard                           publish, read_latest, ...
LocalReports           transport.MpiReports                          send, drain, close
LocalFragments         transport.ActorLink / LearnerLink             can_send, send, poll, ...
LocalGroupReduce       group_reduce.MpiGroupReduce                   hand_out, average, serve, ...
=====================  ============================================  =====================

Every object is guarded by one lock (the roles are threads). When any role fails, the runner
sets ``abort``: the next counter read of every other role raises :class:`RunAborted`, so no
role waits for a partner that is gone (the in-process version of MPI_Abort).
"""
from __future__ import annotations

import queue
import threading
from collections import deque

import numpy as np

from hpcrl.runtime.backoff import NoBell, NoChanges
from hpcrl.runtime.messages import PushHeader, Report
from hpcrl.runtime.transport.group_reduce import PARK, host_rows, share_of
from hpcrl.runtime.transport.push import PushLoop

GROUP_WAIT_SECONDS = 0.5
"""Longest a learner group's thread blocks before it beats and looks at the abort flag again."""


class RunAborted(RuntimeError):
    """Another role of the serial run failed; this one stops."""


class LocalCounters:
    """``n`` int64 counters; reads raise :class:`RunAborted` once ``abort`` is set. Every change wakes the
    threads blocked in :meth:`wait_until` (a parked learner group sleeps there, using no CPU)."""

    def __init__(self, n: int, abort: threading.Event, initial: int = 0, changes=NoChanges()):
        """``changes``: the serial runner's :class:`~hpcrl.runtime.backoff.Changes`, moved by every set and add."""
        self.n = n
        self._words = np.full(n, initial, dtype=np.int64)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.abort = abort
        self.changes = changes

    def _check(self) -> None:
        if self.abort.is_set():
            raise RunAborted("another role of this run failed")

    def add(self, i: int, value: int = 1) -> int:
        with self._lock:
            old = int(self._words[i])
            self._words[i] += value
            self._changed.notify_all()
        self.changes.bump()
        return old

    def add_each(self, first: int, values) -> None:
        if first < 0 or first + len(values) > self.n:
            raise IndexError(f"LocalCounters: counters {first}..{first + len(values) - 1} outside 0..{self.n - 1}")
        with self._lock:
            self._words[first:first + len(values)] += np.asarray(values, dtype=np.int64)
            self._changed.notify_all()
        self.changes.bump()

    def set(self, i: int, value: int) -> int:
        with self._lock:
            old = int(self._words[i])
            self._words[i] = value
            self._changed.notify_all()
        self.changes.bump()
        return old

    def wait_until(self, predicate, timeout: float, nap: float | None = None) -> bool:
        """Block until ``predicate(words)`` holds (True) or ``timeout`` seconds pass (False); raises
        :class:`RunAborted` if the run was aborted. ``nap`` is the MPI twin's and is not used here."""
        with self._changed:
            held = self._changed.wait_for(lambda: self.abort.is_set() or bool(predicate(self._words)), timeout)
        self._check()
        return held

    def read(self, i: int) -> int:
        self._check()
        return int(self._words[i])

    def read_all(self) -> np.ndarray:
        self._check()
        with self._lock:
            return self._words.copy()

    def free(self) -> None:
        pass


class LocalMailbox(PushLoop):
    """``slots_per_group`` places per learner group; a full group's push waits (back-pressure). Each push rings
    ``bell`` (rank 0's :class:`~hpcrl.runtime.backoff.Doorbell` under the serial runner)."""

    def __init__(self, num_groups: int, slots_per_group: int, num_params: int, stats_capacity: int = 8,
                 bell=NoBell()):
        self.num_groups, self.slots_per_group = num_groups, slots_per_group
        self.num_params, self.stats_capacity = num_params, stats_capacity
        self._held = [0] * num_groups
        self._queue: deque[tuple[dict, np.ndarray]] = deque()
        self._ticket = 0
        self._lock = threading.Lock()
        self.pushes = 0
        self.bell = bell

    def try_push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray,
                 stats=None) -> bool:
        grad = np.array(grad, dtype=np.float32, copy=True).reshape(-1)
        if grad.size != self.num_params:
            raise ValueError(f"LocalMailbox.push: gradient has {grad.size} values, mailbox holds {self.num_params}")
        stats = np.asarray([] if stats is None else stats, dtype=np.float64).reshape(-1)
        with self._lock:
            if self._held[group] >= self.slots_per_group:
                return False
            self._held[group] += 1
            header = PushHeader(seq=seq, group=group, base_version=base_version, samples=samples,
                                stats=stats.copy(), ticket=self._ticket)
            self._ticket += 1
            self._queue.append((header, grad))
            self.pushes += 1
        self.bell.ring()
        return True

    def poll(self, limit: int | None = None) -> list[tuple[PushHeader, np.ndarray]]:
        out = []
        with self._lock:
            while self._queue and (limit is None or len(out) < limit):
                header, grad = self._queue.popleft()
                self._held[header.group] -= 1
                out.append((header, grad))
        return out

    def free(self) -> None:
        pass


class LocalBoard:
    """The newest ``history`` published versions (params + probe outputs), copied on publish and read."""

    def __init__(self, num_params: int, history: int = 4, probe_size: int = 0, changes=NoChanges()):
        self.num_params, self.history, self.probe_size = num_params, history, probe_size
        self._ring: deque[tuple[int, np.ndarray, np.ndarray]] = deque(maxlen=history)
        self._lock = threading.Lock()
        self.changes = changes  # moved by every publish (the serial runner's)

    def publish(self, version: int, flat: np.ndarray, probe: np.ndarray | None = None) -> None:
        with self._lock:
            if self._ring and version <= self._ring[-1][0]:
                raise ValueError(f"LocalBoard.publish: version {version} not above the latest {self._ring[-1][0]}")
            probe = np.zeros(0, np.float32) if probe is None else np.array(probe, dtype=np.float32)
            self._ring.append((version, np.array(flat, dtype=np.float32, copy=True).reshape(-1), probe))
        self.changes.bump()

    def latest_version(self) -> int:
        with self._lock:
            return self._ring[-1][0] if self._ring else -1

    def read_latest(self, out: np.ndarray, have: int = -1) -> int:
        return self.read_latest_part(out, 0, have)

    def read_latest_part(self, out: np.ndarray, start: int, have: int = -1) -> int:
        with self._lock:
            if not self._ring:
                return -1
            version, params, _ = self._ring[-1]
        if version != have:
            self._copying(version, out.size)
            out[:] = params[start:start + out.size]  # a published copy is never changed: no lock needed to read it
        return version

    def read_version(self, version: int, out: np.ndarray) -> bool:
        with self._lock:
            found = next((params for v, params, _ in self._ring if v == version), None)
        if found is None:
            return False
        self._copying(version, self.num_params)
        out[:] = found
        return True

    def _copying(self, version: int, floats: int) -> None:
        """A reader is about to copy ``floats`` values of ``version`` (the virtual-time twin charges the fetch here)."""

    def read_probe(self, out: np.ndarray) -> int:
        with self._lock:
            if not self._ring:
                return -1
            version, _, probe = self._ring[-1]
            out[:] = probe
            return version

    def versions(self) -> list[int]:
        with self._lock:
            return [v for v, _, _ in self._ring]

    def fetch_rows(self, final: bool = False) -> dict[str, list[int]]:
        """Nothing: in one process no weight bytes travel from the parameter role (run.h5 ``weight_fetches``
        stays empty under the serial runner)."""
        return {}

    def free(self) -> None:
        pass


class LocalReports:
    """Small messages to the parameter role (hpcrl.runtime.messages), one FIFO queue; each send rings ``bell``."""

    def __init__(self, bell=NoBell()):
        self._queue: deque = deque()
        self._lock = threading.Lock()
        self.bell = bell

    def send(self, message: Report) -> None:
        with self._lock:
            self._queue.append(message)
        self.bell.ring()

    def poll(self) -> None:
        """Nothing waits here: every report is in the queue when it was sent."""

    def drain(self, most: int | None = None) -> list[Report]:
        with self._lock:
            n = len(self._queue) if most is None else min(most, len(self._queue))
            out = [self._queue.popleft() for _ in range(n)]
        return out

    def close(self) -> None:
        pass


class LocalFragments:
    """Fragment queues of the learner groups; each fragment is packed and unpacked with the same
    layout as over MPI (so a learner sees the same dtypes and shapes under either runner)."""

    def __init__(self, layout, num_groups: int, num_actors: int, max_in_flight: int, abort: threading.Event,
                 bells: list | None = None, changes=NoChanges()):
        """``bells``: a bell per group (the serial runner's learner Doorbells), rung by each fragment or batch
        delivered to it; None: nobody naps on them. ``changes``: moved by each fragment delivered or taken (an
        actor waiting for room to send wakes)."""
        self.layout, self.abort = layout, abort
        self.changes = changes
        self.max_in_flight = max_in_flight
        self._queues = [deque() for _ in range(num_groups)]
        self._bells = bells if bells is not None else [NoBell() for _ in range(num_groups)]
        self._batches = LocalBatches(num_groups, abort, self._bells)
        self._in_flight = [0] * num_actors
        self._closed = [False] * num_actors
        self._lock = threading.Lock()

    def actor_link(self, actor: int) -> "LocalActorLink":
        return LocalActorLink(self, actor)

    def _deliver(self, group: int, actor: int, packed: dict) -> None:
        """A sent fragment into its group's queue (at once; the virtual-time twin after its link's time)."""
        with self._lock:
            self._queues[group].append((actor, packed))
        self._bells[group].ring()
        self.changes.bump()

    def learner_link(self, group: int) -> "LocalLearnerLink":
        return LocalLearnerLink(self, group)

    def batch_sender(self) -> "LocalBatches":
        return self._batches

    def batch_receiver(self, group: int) -> "LocalBatchReceiver":
        return LocalBatchReceiver(self._batches, group)


class LocalBatches:
    """The post-processing group's prepared batches to the other groups (twin of ``transport.BatchSender``):
    a queue per group."""

    def __init__(self, num_groups: int, abort: threading.Event, bells: list):
        self.abort = abort
        self._queues = [deque() for _ in range(num_groups)]
        self._ended = [False] * num_groups
        self._lock = threading.Lock()
        self._bells = bells

    def send(self, group: int, message: dict) -> None:
        with self._lock:
            self._queues[group].append(message)
        self._bells[group].ring()

    def close(self, groups, beat) -> None:
        with self._lock:
            for g in groups:
                self._ended[g] = True


class LocalBatchReceiver:
    def __init__(self, hub: LocalBatches, group: int):
        self.hub, self.group = hub, group

    def poll(self) -> list[dict]:
        with self.hub._lock:
            q = self.hub._queues[self.group]
            out = list(q)
            q.clear()
        return out

    def finished(self) -> bool:
        if self.hub.abort.is_set():
            raise RunAborted("another role of this run failed")
        with self.hub._lock:
            return self.hub._ended[self.group] and not self.hub._queues[self.group]


class LocalActorLink:
    def __init__(self, hub: LocalFragments, actor: int):
        self.hub, self.actor = hub, actor

    def can_send(self) -> bool:
        return self.hub._in_flight[self.actor] < self.hub.max_in_flight

    def send(self, group: int, fragment: dict) -> float:
        frag = dict(fragment)
        frag.setdefault("actor", self.actor)
        packed = self.hub.layout.unpack(self.hub.layout.pack(frag), copy=False)
        with self.hub._lock:
            self.hub._in_flight[self.actor] += 1
        self.hub._deliver(group, self.actor, packed)
        return 0.0

    def close(self) -> None:
        with self.hub._lock:
            self.hub._closed[self.actor] = True


class LocalLearnerLink:
    def __init__(self, hub: LocalFragments, group: int):
        self.hub, self.group = hub, group

    def poll(self) -> list[dict]:
        with self.hub._lock:
            q = self.hub._queues[self.group]
            out = []
            while q:
                actor, frag = q.popleft()
                self.hub._in_flight[actor] -= 1
                out.append(frag)
        if out:
            self.hub.changes.bump()
        return out

    def finished(self) -> bool:
        if self.hub.abort.is_set():
            raise RunAborted("another role of this run failed")
        with self.hub._lock:
            return all(self.hub._closed) and not self.hub._queues[self.group]

    def close(self) -> None:
        pass


class LocalGroup:
    """One learner group's ranks as threads: a work queue per member, and the average as a barrier (every rank
    leaves its gradient; the last to come sums them in rank order, as MPI's two-rank Allreduce does, and
    divides by the group's size). :meth:`rank` is one rank's view (a :class:`LocalGroupReduce`)."""

    def __init__(self, size: int, abort: threading.Event):
        self.size, self.abort = size, abort
        self.work = [queue.SimpleQueue() for _ in range(size)]  # [0]: the root's, unused
        self._grads: list[np.ndarray | None] = [None] * size
        self._arrived, self._round = 0, 0
        self._mean: np.ndarray | None = None
        self._done = threading.Condition()

    def rank(self, r: int) -> "LocalGroupReduce":
        return LocalGroupReduce(self, r)

    def average(self, rank: int, grad: np.ndarray) -> np.ndarray:
        """The mean of the group's gradients once every rank has left its own (RunAborted if the run fails)."""
        with self._done:
            self._grads[rank] = grad
            self._arrived += 1
            mine = self._round
            if self._arrived == self.size:  # everyone else waits below: their gradients stay as they are
                total = self._grads[0].copy()
                for g in self._grads[1:]:
                    total += g
                self._mean = total / self.size
                self._grads, self._arrived, self._round = [None] * self.size, 0, mine + 1
                self._done.notify_all()
            while self._round == mine:
                if self.abort.is_set():
                    raise RunAborted("another role of this run failed")
                self._done.wait(GROUP_WAIT_SECONDS)
            return self._mean  # a new array each round: no later round overwrites it


class LocalGroupReduce:
    """One rank of a :class:`LocalGroup` (twin of ``group_reduce.MpiGroupReduce``): the shares travel as host
    copies through the members' queues, so a member never shares memory with the root."""

    def __init__(self, group: LocalGroup, rank: int):
        self.group, self.rank = group, rank

    @property
    def size(self) -> int:
        return self.group.size

    def ready(self, tick) -> None:
        """Every member is always there."""

    def hand_out(self, weights: np.ndarray, minibatch: dict, window: list[np.ndarray] | None
                 ) -> tuple[dict, list[np.ndarray] | None]:
        size = self.group.size
        for r in range(1, size):
            rows, rows_window = share_of(minibatch, window, r, size)
            batch = {k: v.copy() for k, v in host_rows(rows).items()}
            rows_window = None if rows_window is None else [w.copy() for w in rows_window]
            self.group.work[r].put({"weights": weights.copy(), "batch": batch, "window": rows_window})
        return share_of(minibatch, window, 0, size)

    def park(self) -> None:
        for r in range(1, self.group.size):
            self.group.work[r].put(PARK)

    def release(self) -> None:
        for r in range(1, self.group.size):
            self.group.work[r].put(None)

    def average(self, grad) -> np.ndarray:
        return self.group.average(self.rank, grad.detach().cpu().numpy())

    def serve(self, share, check, beat) -> None:
        """A member's loop: ``share(weights, batch, window)`` for each piece of work, until the root's None.
        Blocks on its queue (parked or not), waking every GROUP_WAIT_SECONDS to beat and to see an abort."""
        work_queue = self.group.work[self.rank]
        while True:
            check()
            beat()
            try:
                work = work_queue.get(timeout=GROUP_WAIT_SECONDS)
            except queue.Empty:
                if self.group.abort.is_set():
                    raise RunAborted("another role of this run failed") from None
                continue
            if work is None:
                return
            if work != PARK:  # parked: nothing to do but keep waiting (blocked, no naps to lengthen)
                share(work["weights"], work["batch"], work["window"])

    def close(self) -> None:
        pass
