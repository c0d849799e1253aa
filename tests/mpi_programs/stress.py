"""One set of stress bodies for the job's shared objects, run on both transports (as mpi4py's nxtval demos run
one counter test on each counter implementation).

A body is written against a team (``rank``, ``size``, ``barrier()``, ``allreduce(x)``: the sum, and the shared
objects it makes: ``mailbox``, ``board``, ``counters``, ``free``) and checks its invariants globally, after
random sleeps: the sum of what arrived equals what was sent, whatever the order.

- :class:`MpiTeam`: ranks of a communicator and the RMA windows (``runtime/transport/windows.py``). Run as
  ``mpiexec -n N python -m mpi4py stress.py NAME ARGS...``: the body runs on COMM_SELF, then COMM_WORLD.
- :class:`ThreadTeam`: threads of this process and the serial runner's twins (``runtime/transport/local.py``):
  :func:`run_threads` runs the body on one thread, then on N.

Invariants (``INVARIANTS``): ``mailbox`` (no gradient lost, doubled or torn; slots free again after a poll;
back-pressure instead of overwriting), ``board`` (no torn weight copy, versions never go back, old versions
by version; then exact counter sums), ``words_together`` (an ``add_each`` is seen whole or not at all). tests/test_runtime_windows.py runs each on both teams.
"""
from __future__ import annotations

import ast
import random
import sys
import threading
import time
from typing import Callable

import numpy as np

# ---- the bodies ------------------------------------------------------------------------------


def mailbox(team, groups: int, slots: int, pushes: int, params: int, owner_sleep: float, expect_wait: int = 0) -> str:
    """Rank 0 owns the mailbox and polls (napping up to ``2 * owner_sleep``); every other rank pushes ``pushes``
    gradients into group ``(rank - 1) % groups`` (several ranks may share a group), each filled with
    ``rank * 1e5 + seq`` (exact in float32), its pusher in ``samples``. Alone, rank 0 pushes to itself,
    ``slots`` at a time, and polls in between."""
    rank, size = team.rank, team.size
    mb = team.mailbox(groups, slots, params)
    rng = random.Random(1234 + rank)
    pushers = range(1, size) if size > 1 else [0]
    expected = {(r, s) for r in pushers for s in range(pushes)}
    sent_sum, waits = 0.0, []
    if rank in pushers and size > 1:
        group = (rank - 1) % groups
        for seq in range(pushes):
            grad = np.full(params, rank * 1e5 + seq, dtype=np.float32)
            waits.append(mb.push(group, seq, base_version=seq // 3, samples=rank, grad=grad, stats=[seq, -1.0]))
            sent_sum += float(grad.sum(dtype=np.float64))
            if rng.random() < 0.3:
                time.sleep(rng.random() * 1e-3)
    got = []
    if rank == 0:
        deadline, next_seq = time.monotonic() + 40, 0
        while len(got) < len(expected):
            if size == 1 and next_seq < pushes:  # alone: push up to `slots` at a time, then poll
                for _ in range(min(slots, pushes - next_seq)):
                    grad = np.full(params, next_seq, dtype=np.float32)
                    assert mb.try_push(0, next_seq, 0, 0, grad, stats=[next_seq, -1.0])
                    sent_sum += float(grad.sum(dtype=np.float64))
                    next_seq += 1
            got += mb.poll()
            assert time.monotonic() < deadline, f"owner timed out with {len(got)}/{len(expected)} gradients"
            time.sleep(owner_sleep * rng.random() * 2)  # 0: a yield (to the pushers, when they are threads)
    total_sent = team.allreduce(sent_sum)
    if rank == 0:
        keys = [(h.samples, h.seq) for h, _ in got]
        assert len(keys) == len(set(keys)), "duplicate gradient"
        assert set(keys) == expected, f"lost: {sorted(expected - set(keys))[:5]}"
        recv_sum, last = 0.0, {}
        for h, g in got:
            pusher = h.samples
            want = pusher * 1e5 + h.seq if size > 1 else h.seq
            assert (g == np.float32(want)).all(), f"torn or wrong slot from {pusher} seq {h.seq}"
            assert h.group == ((pusher - 1) % groups if size > 1 else 0)
            assert list(h.stats) == [h.seq, -1.0]
            assert h.seq > last.get(pusher, -1), "out of order within a pusher"
            last[pusher] = h.seq
            recv_sum += float(g.sum(dtype=np.float64))
        assert recv_sum == total_sent, (recv_sum, total_sent)
        for group in range(groups):  # every slot is free again: each group takes exactly `slots` more
            full = np.zeros(params, np.float32)
            assert all(mb.try_push(group, -1, 0, 0, full) for _ in range(slots)), f"group {group}: a slot stuck"
            assert not mb.try_push(group, -1, 0, 0, full), f"group {group}: a full group took one more"
        assert len(mb.poll()) == groups * slots and mb.poll() == []
    total_wait = team.allreduce(sum(waits))
    if expect_wait:
        assert total_wait > 0, "a slow owner with few slots must make the learners wait"
    team.free(mb)
    return f"groups={groups} slots={slots} pushes/rank={pushes} wait_total={total_wait:.4f}s"


STOP, READS = 0, 1


def board(team, params: int, history: int, seconds: float) -> str:
    """Rank 0 republishes buffers filled with float(version) (probe: -version) as fast as it can for ``seconds``
    (and until every reader read 20 times); every other rank reads the latest, the version before it and the
    probe, and checks each copy is uniform and equal to the version it came with. Then :func:`counters`."""
    rank, size = team.rank, team.size
    wb = team.board(params, history, 3)
    flags = team.counters(0, 3, 0)
    out, probe = np.empty(params, np.float32), np.empty(3, np.float32)
    assert wb.read_latest(out) == -1 and wb.latest_version() == -1
    team.barrier()
    reads = 0
    if rank == 0:
        v, end = 0, time.monotonic() + seconds
        while time.monotonic() < end or (size > 1 and flags.read(READS) < 20 * (size - 1)):
            wb.publish(v, np.full(params, v, np.float32), np.full(3, -v, np.float32))
            if size == 1:  # alone: read its own board in between
                got = wb.read_latest(out)
                _uniform(out, got, "latest")
                assert got == v
                out[:] = -1.0  # the version held is still the newest: nothing copied
                assert wb.read_latest(out, have=got) == got and (out == -1.0).all()
                assert wb.read_latest(out, have=got - 1) == got  # an older one held: copied
                _uniform(out, got, "latest after have")
                reads += 1
            v += 1
            if size > 1 and history == 1:
                # a reader needs the slot unchanged for one copy of PARAMS floats: back-to-back publishes
                # (about 20 us each) would starve it (a parameter rank publishes once per admitted
                # gradient, a millisecond or more apart); the slot is still rewritten under most reads
                time.sleep(2e-4)
        flags.set(STOP, 1)
        assert wb.versions() == list(range(v - min(history, v), v))
        assert wb.read_version(v - 1, out) and not wb.read_version(v - history - 1, out)
        _uniform(out, v - 1, "by version")
    else:
        last = -1
        while not flags.read(STOP):
            got = wb.read_latest(out)
            if got < 0:  # nothing published yet: out was not written
                continue
            _uniform(out, got, "latest")
            assert got >= last, "version went backwards"
            last = got
            if got >= 1 and wb.read_version(got - 1, out):
                _uniform(out, got - 1, "old version")
            pv = wb.read_probe(probe)
            assert pv >= got, "probe older than the params read before it"
            _uniform(probe, -pv, "probe")
            assert wb.latest_version() >= pv
            reads += 1
            flags.add(READS)
    reads = team.allreduce(reads)
    team.free(wb)
    team.free(flags)
    counters(team, 200)
    return f"size={size} reads={reads}"


def counters(team, adds: int) -> None:
    """Every rank adds ``adds`` times to two words of counters owned by the last rank: the sums are exact."""
    rank, size = team.rank, team.size
    c = team.counters(size - 1, 4, [0, 5, 0, 0])
    for _ in range(adds):
        c.add(0, rank + 1)
        c.add(1, -1)
    team.barrier()
    want0 = adds * size * (size + 1) // 2
    assert c.read(0) == want0, (c.read(0), want0)
    assert c.read(1) == 5 - adds * size
    if rank == 0:
        assert c.set(2, 7) == 0
    team.barrier()
    assert list(c.read_all()) == [want0, 5 - adds * size, 7, 0]
    try:
        c.read(4)
    except IndexError:
        pass
    else:
        raise AssertionError("counter index out of range did not raise")
    team.free(c)


def words_together(team, words: int, seconds: float) -> str:
    """Rank 0 owns the counters and frees places as rank 0 does (``add_each``: -1 on ``words`` consecutive words),
    the other ranks take them (+1 on all of them, also with ``add_each``) and every rank reads between its own
    changes: all ``words`` are equal in every ``read_all``, never some changed and some not. Ends at zero."""
    rank, size = team.rank, team.size
    c = team.counters(0, words + 2, 0)
    up, down = [1] * words, [-1] * words
    reads, end = 0, time.monotonic() + seconds
    rng = random.Random(99 + rank)
    team.barrier()
    while time.monotonic() < end:
        c.add_each(1, down if rank == 0 else up)
        for _ in range(rng.randrange(1, 4)):
            seen = c.read_all()[1:1 + words]
            assert (seen == seen[0]).all(), f"a read saw part of an add_each: {seen.tolist()}"
            reads += 1
        c.add_each(1, up if rank == 0 else down)
    team.barrier()
    assert list(c.read_all()) == [0] * (words + 2)
    try:
        c.add_each(words + 1, [1, 1])
    except IndexError:
        pass
    else:
        raise AssertionError("add_each past the last counter did not raise")
    team.free(c)
    return f"size={size} reads={team.allreduce(reads)}"


def _uniform(buf, value, what):
    assert (buf == np.float32(value)).all(), f"torn {what}: expected {value}, got {np.unique(buf)[:5]}"


INVARIANTS: dict[str, tuple[Callable[..., str], Callable[..., tuple]]] = {
    "mailbox": (mailbox, lambda groups, slots, pushes, params, owner_sleep, expect_wait=0:
                (1, slots, pushes, params, 0.0)),
    "board": (board, lambda params, history, seconds: (params, history, seconds / 4)),
    "words_together": (words_together, lambda words, seconds: (words, seconds / 4)),
}
"""Name -> (body, its arguments for a team of one, the first run)."""

# ---- the teams -------------------------------------------------------------------------------


class MpiTeam:
    """The ranks of ``comm``; shared objects are RMA windows owned by one rank (collective to make and free)."""

    def __init__(self, comm):
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()

    def barrier(self) -> None:
        self.comm.Barrier()

    def allreduce(self, value):
        return self.comm.allreduce(value)

    def mailbox(self, groups: int, slots: int, params: int):
        from hpcrl.runtime.transport.windows import GradientMailbox

        return GradientMailbox(self.comm, 0, groups, slots, params)

    def board(self, params: int, history: int, probe_size: int):
        from hpcrl.runtime.transport.windows import WeightBoard

        return WeightBoard(self.comm, 0, params, history=history, probe_size=probe_size)

    def counters(self, owner: int, n: int, initial):
        from hpcrl.runtime.transport.windows import CounterWindow

        return CounterWindow(self.comm, owner, n, initial=initial)

    def free(self, shared) -> None:
        """Free a window (collective); any later use must raise."""
        shared.free()
        use = {"GradientMailbox": "states", "WeightBoard": "latest_version"}.get(type(shared).__name__)
        try:
            getattr(shared, use)() if use else shared.read(0)
        except RuntimeError:
            return
        raise AssertionError(f"{type(shared).__name__}: use after free did not raise")


class _Threads:
    """What the threads of one ThreadTeam share: a barrier, the values being reduced, the object being made."""

    def __init__(self, size: int, timeout: float):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.values: list = [None] * size
        self.made = None


class ThreadTeam:
    """One thread of a team of threads; shared objects are the serial runner's twins, made by rank 0 and handed
    to the others by reference (as the serial runner hands one set to every role)."""

    def __init__(self, shared: _Threads, rank: int):
        self.shared, self.rank, self.size = shared, rank, shared.size

    def barrier(self) -> None:
        self.shared.barrier.wait()

    def allreduce(self, value):
        self.shared.values[self.rank] = value
        self.barrier()
        total = sum(self.shared.values[1:], self.shared.values[0])
        self.barrier()
        return total

    def _made_by_rank_0(self, make):
        if self.rank == 0:
            self.shared.made = make()
        self.barrier()
        made = self.shared.made
        self.barrier()
        return made

    def mailbox(self, groups: int, slots: int, params: int):
        from hpcrl.runtime.transport.local import LocalMailbox

        return self._made_by_rank_0(lambda: LocalMailbox(groups, slots, params))

    def board(self, params: int, history: int, probe_size: int):
        from hpcrl.runtime.transport.local import LocalBoard

        return self._made_by_rank_0(lambda: LocalBoard(params, history=history, probe_size=probe_size))

    def counters(self, owner: int, n: int, initial):
        from hpcrl.runtime.transport.local import LocalCounters

        return self._made_by_rank_0(lambda: LocalCounters(n, threading.Event(), initial=initial))

    def free(self, shared) -> None:
        self.barrier()
        if self.rank == 0:
            shared.free()


def on_threads(n: int, body: Callable[..., str], args: tuple, timeout: float = 60.0) -> str:
    """``body(team, *args)`` on a team of ``n`` threads; rank 0's result. The first failure is raised (and breaks
    the barrier, so no other thread waits for the failed one); a thread still running after ``timeout`` fails."""
    shared, results, failures = _Threads(n, timeout), [None] * n, []

    def rank(r: int) -> None:
        try:
            results[r] = body(ThreadTeam(shared, r), *args)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
            shared.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True, name=f"rank-{r}") for r in range(n)]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    real = [f for f in failures if not isinstance(f, threading.BrokenBarrierError)]
    if real or failures:
        raise (real or failures)[0]
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"{body.__name__} on {n} threads: {stuck} still running after {timeout} s"
    return results[0]


def run_threads(n: int, name: str, *args) -> str:
    """Invariant ``name`` on one thread, then on ``n`` (the twin of this file's MPI run); the last line it says."""
    body, alone = INVARIANTS[name]
    on_threads(1, body, alone(*args))
    return f"OK {name} {on_threads(n, body, args)}"


def main(argv: list[str]) -> None:
    from mpi4py import MPI

    name, args = argv[0], [ast.literal_eval(a) for a in argv[1:]]
    body, alone = INVARIANTS[name]
    body(MpiTeam(MPI.COMM_SELF), *alone(*args))
    said = body(MpiTeam(MPI.COMM_WORLD), *args)
    if MPI.COMM_WORLD.rank == 0:
        print(f"OK {name} {said}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
