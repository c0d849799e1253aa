"""The virtual-time world of ``launch.runner: sim``: every role of a job in one process, scheduled by SimPy.

Why SimPy: a role is a loop that blocks (it naps in back-offs, waits on counters, pushes with back-pressure), and
SimPy's processes, resources and conditions are exactly those waits in virtual time, deterministic (events at
one time run in the order they were scheduled), pure Python and small; SimGrid's Python bindings would bring its
platform and network models but a C++ build and an actor API that wants the roles rewritten as its actors.

A role runs unchanged in a thread of its own, but only one thread runs at a time: each role is a SimPy process
whose thread holds the baton until the role waits (its clock's ``sleep``, a compute cost in ``did``, a transfer, a
counter wait); the wait becomes a SimPy event, the baton goes back to the engine, and the thread resumes when
the event fires. Threads (not coroutines) keep torch's per-thread state (``no_grad``, ``inference_mode``) apart.
The real computation happens at each event (a real env step, a real gradient); only time is virtual: each
operation advances its role's time by its cost (hpcrl.cluster_profiles), on one of its node's cores (a
``simpy.Resource``: ranks that share a core queue for it), and every transfer that crosses rank 0's link queues
on that link.

A role that fails ends the world: the others are resumed with :class:`WorldAborted` raised at their wait, so each
closes its files as in the serial runner. Nothing can hang: if every role waits on
an event that nothing can fire, :meth:`VirtualWorld.run` names them.
"""
from __future__ import annotations

import threading
import traceback
from typing import Callable, Generator

import simpy

from hpcrl.runtime.clock import Work

VIRTUAL_EPOCH = 1_767_225_600.0
"""Unix time of a simulated run's virtual second 0 (2026-01-01 00:00 UTC): every run of one config, profile and
seed then writes the same times (``created`` says when, in virtual time; run.h5's ``sim`` attributes say when
it really ran)."""


class WorldAborted(RuntimeError):
    """Raised in a waiting role when another role failed (caught by the runner like the serial runner's RunAborted)."""


class Deadlock(RuntimeError):
    """Every role waits and nothing is scheduled: the message names the waiting roles."""


class Signal:
    """Something that changes (a counter word, a queue): :meth:`notify` wakes every role waiting on it."""

    def __init__(self, world: "VirtualWorld") -> None:
        self.world = world
        self.event = world.env.event()

    def notify(self) -> None:
        if not self.event.triggered:
            self.event.succeed()
            self.event = self.world.env.event()


class Role:
    """One role's thread and its SimPy process: the thread runs only while the process hands it the baton."""

    def __init__(self, world: "VirtualWorld", rank: int, name: str, body: Callable[[], None], clock: "VirtualClock",
                 core: simpy.Resource | None, start: float) -> None:
        self.world, self.rank, self.name, self.body = world, rank, name, body
        self.clock, self.core, self.start = clock, core, start
        # the baton: two locks held by nobody's turn, released to hand it over (a Lock, unlike a Semaphore, is
        # C-level; a lock may be released by another thread than the one that acquired it)
        self._go, self._back = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._back.acquire()
        self.wait: Generator | None = None  # what the role waits for, as a SimPy generator
        self.done, self.waiting_on = False, ""
        self.failure: tuple[BaseException, str] | None = None
        self.cpu_seconds = 0.0  # virtual compute charged (a park's cost is what it adds)
        self.thread = threading.Thread(target=self._main, name=f"hpcrl-sim-{name}", daemon=True)

    # ---- the role's thread -------------------------------------------------------------
    def _main(self) -> None:
        self._go.acquire()
        try:
            if self.world.aborted:
                raise WorldAborted("another role failed")
            self.body()
        except BaseException as exc:  # noqa: BLE001 - handed to the runner
            self.failure = (exc, traceback.format_exc())
        finally:
            self.done = True
            self.world.running -= 1
            self._back.release()

    def hand_back(self, wait: Generator, what: str) -> None:
        """In the role's thread: wait for ``wait`` (a SimPy generator) in virtual time; WorldAborted if the world
        ended meanwhile."""
        if self.world.aborted:  # ending: no more waits (a role's clean-up must not wait for a turn)
            raise WorldAborted("another role of this simulated run failed")
        if self.world.current is not self:
            raise RuntimeError(f"virtual clock of {self.name} used outside its turn (by {threading.current_thread().name})")
        self.wait, self.waiting_on = wait, what
        self._back.release()
        self._go.acquire()
        if self.world.aborted:
            raise WorldAborted("another role of this simulated run failed")

    # ---- the engine's side -------------------------------------------------------------
    def _turn(self) -> None:
        self.world.current = self
        self._go.release()
        self._back.acquire()
        self.world.current = None

    def process(self):
        """The SimPy process: start the thread, then give it the baton after each of its waits."""
        if self.start > 0:
            yield self.world.env.timeout(self.start)
        self.thread.start()
        self._turn()
        while not self.done:
            wait, self.wait = self.wait, None
            yield from wait
            self._turn()
        if self.failure is not None:
            self.world.failed(self)

    def end(self) -> None:
        """After the world ended: let a waiting thread raise WorldAborted and finish."""
        if self.thread.is_alive() and not self.done:
            self._turn()


class VirtualClock:
    """A role's clock (runtime/clock.py ``Clock``) in the world: time is the engine's, waits hand the baton
    back, ``did`` holds one of the node's cores for the work's cost (``price(work, count)`` seconds)."""

    def __init__(self, world: "VirtualWorld", price: Callable[[Work, float], float]) -> None:
        self.world, self.price = world, price
        self.role: Role | None = None  # set by VirtualWorld.spawn

    def now(self) -> float:
        return self.world.env.now

    def unix(self) -> float:
        return VIRTUAL_EPOCH + self.world.env.now

    def sleep(self, seconds: float) -> None:
        self.role.hand_back(_timeout(self.world.env, seconds), "a nap")

    def did(self, work: Work, count: float = 1) -> None:
        self.compute(self.price(work, count), work.value)

    def compute(self, seconds: float, what: str) -> None:
        """``seconds`` of work on one of this role's node's cores (queued while they are busy)."""
        if seconds > 0:
            self.role.cpu_seconds += seconds
            core = self.role.core
            if isinstance(core, Cores) and core.time_slice is not None:
                self.role.hand_back(_sliced(self.world.env, core, seconds), what)
            else:
                self.role.hand_back(_holding(self.world.env, core, seconds), what)

    def transfer(self, seconds: float, link: simpy.Resource | None, what: str, latency: float = 0.0) -> None:
        """A transfer whose bytes hold ``link`` (rank 0's, shared) for ``seconds``, then ``latency`` (not held)."""
        if seconds > 0 or latency > 0:
            self.role.hand_back(_holding(self.world.env, link, seconds, latency), what)

    def wait_for(self, signal: Signal, seconds: float, what: str) -> None:
        """Until ``signal`` is notified or ``seconds`` pass."""
        self.role.hand_back(_until(self.world.env, signal, seconds), what)

    def thread_time(self) -> float:
        return self.role.cpu_seconds


class VirtualWorld:
    def __init__(self) -> None:
        self.env = simpy.Environment()
        self.roles: list[Role] = []
        self.current: Role | None = None
        self.aborted = False
        self.first_failure: Role | None = None
        self.running = 0  # roles whose body has not returned

    def signal(self) -> Signal:
        return Signal(self)

    def resource(self, capacity: int) -> simpy.Resource:
        return simpy.Resource(self.env, capacity=capacity)

    def cores(self, count: int, time_slice: float | None = None) -> "Cores":
        return Cores(self.env, count, time_slice)

    def spawn(self, rank: int, name: str, body: Callable[[], None], clock: VirtualClock,
              core: simpy.Resource | None, start: float = 0.0) -> Role:
        """Rank ``rank``'s role ``body`` (its loop), on one of ``core``'s places, starting at virtual ``start``."""
        role = Role(self, rank, name, body, clock, core, start)
        clock.role = role
        self.roles.append(role)
        self.running += 1
        return role

    def failed(self, role: Role) -> None:
        if self.first_failure is None and not isinstance(role.failure[0], WorldAborted):
            self.first_failure = role

    def run(self) -> None:
        """Run until every role is done, or one failed (the others then end with WorldAborted). Raises
        :class:`Deadlock`."""
        for role in self.roles:
            self.env.process(role.process())
        try:
            while self.running and self.first_failure is None:
                if self.env.peek() == simpy.core.Infinity:
                    waiting = [f"{r.name} ({r.waiting_on})" for r in self.roles if not r.done]
                    raise Deadlock(f"simulated run: every role waits and nothing can wake them at virtual second "
                                   f"{self.env.now:.3f}: {', '.join(waiting)}")
                self.env.step()
        finally:
            self.aborted = self.aborted or not all(r.done for r in self.roles)
            for role in self.roles:
                role.end()
            for role in self.roles:
                if role.thread.is_alive():
                    role.thread.join(30.0)


def _timeout(env: simpy.Environment, seconds: float):
    yield env.timeout(seconds)


def _holding(env: simpy.Environment, resource: simpy.Resource | None, seconds: float, then: float = 0.0):
    """``seconds`` holding one place of ``resource`` (a node's core, rank 0's link), queued while none is free, then
    ``then`` seconds without it (a transfer's latency): one hand-back for both."""
    if resource is None or seconds <= 0:
        yield env.timeout(seconds + then)
        return
    with resource.request() as req:
        yield req
        yield env.timeout(seconds)
    if then > 0:
        yield env.timeout(then)


class Cores(simpy.Resource):
    """A node's cores: ``count`` places, and the slice its ranks share them in when more want one than it has
    (cluster_profiles.Profile.time_slice_seconds; None: each piece of work holds its core to the end)."""

    def __init__(self, env: simpy.Environment, count: int, time_slice: float | None) -> None:
        super().__init__(env, capacity=count)
        self.time_slice = time_slice


def _sliced(env: simpy.Environment, cores: Cores, seconds: float):
    """``seconds`` of work on one of ``cores``, round robin: the work runs a slice at a time, and after a slice goes
    to the back of the queue if another rank waits for a core."""
    left = seconds
    while left > 1e-12:
        with cores.request() as req:
            yield req
            while left > 1e-12:
                step = min(cores.time_slice, left)
                yield env.timeout(step)
                left -= step
                if cores.queue:
                    break


def _until(env: simpy.Environment, signal: Signal, seconds: float):
    yield env.any_of([signal.event, env.timeout(seconds)])
