"""The MPI half of ranks that join a running job (``learners.elastic`` / ``actors.elastic``: steps | jobs).

A door rank (a learner group's root, an actor) has ranks join it while it is active; their launch (the job step
or batch job, its files, its end) is the scheduler's side, in ``hpcrl/join_launch.py`` (its ``Joiner``, which the
roles see only as ``runtime/transport/protocols.py``'s protocol). Here is what travels over MPI:

- :class:`JoinPort`: the door opens a port, accepts once the joining ranks are about to connect (``MPI_Comm_accept``
  has no timeout and holds MPICH's lock: the door, waiting in it, could not even beat), merges the
  intercommunicator into one communicator with the door as rank 0, and disconnects when they leave (or, when they
  died, forgets them: a free or disconnect would wait for the dead);
- :class:`JoinedReduce`: a group root and its joined ranks as a launched group works, in point-to-point messages
  the root polls (shares out, the members' share gradients back to the root, which averages them); a joined rank
  that dies (its job cancelled, its node lost) ends its launch, and the root, which checks that launch while it
  waits (:func:`wait_or_lost`, :func:`process_gone`), drops the joined ranks instead of waiting for ever. The
  minibatch in flight is then trained on the root's own share; every gradient already pushed stays admitted, and
  none is pushed twice;
- :class:`JoiningGroupReduce`: the group root's ``GroupReduce`` for a group whose other ``ranks_per_group - 1``
  ranks join the first time it has a batch after it was activated (or at the start) and leave when it parks (or
  the run ends), so that their node goes back. A join that does not connect in time, or ends first, is given up:
  the root computes alone until the group is parked and activated again. Each join, leave and given-up join is a
  row of ``elastic_events`` (a ``GroupEvent`` report), with its seconds.
"""
from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from hpcrl.runtime.backoff import Backoff
from hpcrl.runtime.messages import ELASTIC_ACTION, ELASTIC_REASON, GroupEvent
from hpcrl.runtime.transport import control
from hpcrl.runtime.transport.group_reduce import member_work, share_of

if TYPE_CHECKING:
    import torch

    from hpcrl.runtime.transport.protocols import Joiner


class JoinLost(Exception):
    """The joined ranks' launch ended while the root waited for them."""


def process_gone(host: str, pid: int) -> bool:
    """True once process ``pid`` on ``host`` (this host only; elsewhere False: the launch's end tells) has exited,
    reaped or not. A send to a rank that died crashes MPICH (a segfault in the UCX path, measured), and the launch
    that started it ends only some milliseconds after it, so the sides look at each other's process before each
    send."""
    if host != socket.gethostname():
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # the state, after "(comm)"
    except (OSError, IndexError):
        return True


def sending(requests: Callable[[], list], lost: Callable[[], bool]) -> None:
    """Start ``requests()`` unless ``lost()``, then :func:`wait_or_lost` for them (:class:`JoinLost` either way)."""
    if lost():
        raise JoinLost("the other side of a joined communicator is gone")
    wait_or_lost(requests(), lost)


def wait_or_lost(requests, lost: Callable[[], bool]) -> None:
    """Wait (sleeping) for ``requests``, checking ``lost()`` (the other side's launch or process is gone) between
    polls: :class:`JoinLost` then (the requests stay pending: the communicator is dropped, never freed)."""
    from mpi4py import MPI

    backoff = Backoff(5e-5, 2e-3)
    while not MPI.Request.Testall(requests):
        if lost():
            raise JoinLost("the other side of a joined communicator is gone")
        backoff.sleep()


class JoinedReduce:
    """The root and its joined ranks over their merged communicator, in polled point-to-point messages.

    ``lost()`` (root: the joined ranks' launch has ended; member: the root is gone) is checked between polls;
    the root raises :class:`JoinLost`, a member RuntimeError."""

    def __init__(self, comm, lost: Callable[[], bool]) -> None:
        self.comm, self.lost = comm, lost
        self.size, self.rank = comm.Get_size(), comm.Get_rank()

    def _wait(self, requests: Callable[[], list]) -> None:
        try:
            sending(requests, self.lost)
        except JoinLost:
            if self.rank:
                raise RuntimeError("the root is gone") from None
            raise

    def hand_out(self, weights: np.ndarray, minibatch: dict, window: list[np.ndarray] | None
                 ) -> tuple[dict, list[np.ndarray] | None]:
        self._wait(lambda: [self.comm.isend(member_work(weights, minibatch, window, r, self.size), dest=r,
                                            tag=control.TAG_WORK) for r in range(1, self.size)])
        return share_of(minibatch, window, 0, self.size)

    def average(self, grad: torch.Tensor) -> np.ndarray:
        """Root: the mean of its own and every member's share gradient; member: its share gradient to the root."""
        mine = np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32)
        if self.rank:
            self._wait(lambda: [self.comm.Isend(mine, dest=0, tag=control.TAG_SHARE)])
            return mine
        theirs = [np.empty_like(mine) for _ in range(1, self.size)]
        self._wait(lambda: [self.comm.Irecv(buf, source=r, tag=control.TAG_SHARE) for r, buf in enumerate(theirs, 1)])
        return (mine + sum(theirs)) / self.size

    def release(self) -> None:
        self._wait(lambda: [self.comm.isend(None, dest=r, tag=control.TAG_WORK) for r in range(1, self.size)])

    def serve(self, share, check) -> None:
        """A member's loop: ``share(weights, batch, window)`` for each piece of work, until None."""
        while True:
            work = control.recv_polling(self.comm, 0, control.TAG_WORK, Backoff(5e-5, 2e-3), abandon=self.lost)
            check()
            if work is None:
                if self.lost():
                    raise RuntimeError("the root is gone")
                return
            share(work["weights"], work["batch"], work["window"])


class JoinPort:
    """The door's side of one join's connection: an MPI port, and the intercommunicator it accepted merged into one
    communicator with the door as rank 0 (:attr:`comm`, None while no ranks are joined)."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.comm = None
        self._inter = None

    def open(self) -> str:
        """Open a port; its name (what the joining ranks connect to)."""
        from mpi4py import MPI

        self.name = MPI.Open_port()
        return self.name

    def accept(self):
        """Accept the joining ranks and merge (the door low, rank 0). ``MPI_Comm_accept`` has no timeout and holds
        MPICH's lock: call it only once they are about to connect."""
        from mpi4py import MPI

        self._inter = MPI.COMM_SELF.Accept(self.name)
        self.comm = self._inter.Merge(high=False)
        return self.comm

    def disconnect(self) -> None:
        """They are leaving (and disconnect on their side): free, disconnect (waits for them), close the port."""
        self.comm.Free()
        self._inter.Disconnect()
        self.close()

    def close(self) -> None:
        """Close the port (no ranks joined, or they are gone)."""
        from mpi4py import MPI

        MPI.Close_port(self.name)
        self.comm = None

    def forget(self) -> None:
        """The joined ranks died: close the port and drop their communicators unfreed (a free or disconnect would
        wait for the dead)."""
        self.close()
        self._inter = None


class JoiningGroupReduce:
    """The group root's :class:`protocols.GroupReduce` for a group whose members join and leave."""

    def __init__(self, group: int, size: int, joiner: Joiner, counters, reports) -> None:
        self.group, self.size = group, size
        self.joiner = joiner  # the launch of the group's other size - 1 ranks (hpcrl/join_launch.py)
        self.counters, self.reports = counters, reports
        self.inner: JoinedReduce | None = None  # over the root and the joined ranks, while they are here
        self.given_up = False  # this activation's join failed: the root computes alone until the next one

    # ---- join and leave ----------------------------------------------------------------------
    def ready(self, tick: Callable[[], None]) -> None:
        if self.inner is None and not self.given_up:
            self._join(tick)

    def _join(self, tick: Callable[[], None]) -> None:
        why, waited = self.joiner.join(["--group", str(self.group)], tick)
        if why is not None:
            self.given_up = True
            self._event("join_given_up", why, waited)
            self.joiner.given_up(why, f"learner group {self.group}: its {self.size - 1} joining rank(s)",
                                 "the group's root computes alone until it is parked")
            return
        self.inner = JoinedReduce(self.joiner.comm, self.joiner.lost)
        self._event("joined", "job_step", waited)
        self.joiner.record_job(self.reports)

    def _lost(self) -> None:
        """The joined ranks' launch ended while the root waited for them: drop them, say so, go on alone."""
        seconds = time.monotonic() - self.joiner.joined_at
        code = self.joiner.drop()
        self.inner = None
        self.given_up = True
        self._event("left", "join_ended", seconds)
        self.joiner.dropped(code, f"learner group {self.group}: its joined ranks",
                            "the group's root computes alone until it is parked")

    def _leave(self) -> None:
        """Release the joined ranks, disconnect; they exit and their step ends."""
        if self.inner is None:
            self.given_up = False  # the next activation tries again
            return
        try:
            self.inner.release()
        except JoinLost:
            self._lost()
            self.given_up = False
            return
        seconds = time.monotonic() - self.joiner.joined_at
        code = self.joiner.leave()
        self.inner = None
        self._event("left", "job_step" if code == 0 else "join_ended", seconds)

    def _event(self, action: str, reason: str, seconds: float) -> None:
        self.reports.send(GroupEvent(time=time.time(), group=self.group, action=ELASTIC_ACTION[action],
                                     reason=ELASTIC_REASON[reason],
                                     active_groups=int(self.counters.read(control.ACTIVE)), parked_seconds=seconds,
                                     cpu_seconds=0.0))

    # ---- protocols.GroupReduce ---------------------------------------------------------------
    def hand_out(self, weights: np.ndarray, minibatch: dict, window: list[np.ndarray] | None
                 ) -> tuple[dict, list[np.ndarray] | None]:
        if self.inner is not None:
            try:
                return self.inner.hand_out(weights, minibatch, window)
            except JoinLost:
                self._lost()
        return share_of(minibatch, window, 0, 1)  # given up or lost: the whole minibatch is the root's

    def average(self, grad: torch.Tensor) -> np.ndarray:
        if self.inner is not None:
            try:
                return self.inner.average(grad)
            except JoinLost:  # this minibatch's gradient is the root's own share's
                self._lost()
        return grad.detach().cpu().numpy()

    def park(self) -> None:
        self._leave()

    def release(self) -> None:
        self._leave()

    def serve(self, share, check, beat) -> None:
        raise TypeError("a joining group's members serve in hpcrl.runtime.runners.join, not in the job's launch")

    def close(self) -> None:
        self._leave()
