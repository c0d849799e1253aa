"""What the role loops may call on the job's shared objects: one Protocol per transport, two implementations each.

The MPI implementations (``runtime/transport/windows.py``: one-sided windows owned by rank 0;
``runtime/transport/links.py``: point-to-point channels; ``runtime/transport/group_reduce.py``: a learner
group's communicator) and the in-memory twins of the serial runner (``runtime/transport/local.py``)
satisfy these; a role sees only the Protocol, so it runs unchanged under either runner.
``tests/test_transport_protocols.py`` checks both sets against them; ``tests/test_runtime_windows.py``
runs one set of stress bodies (no gradient lost, doubled or torn; no torn weight copy; exact counter
sums) on the windows under mpiexec and on the twins with threads.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch

    from hpcrl.runtime.messages import Report


@runtime_checkable
class Counters(Protocol):
    """Integer words on rank 0 (``runtime/transport/control.py`` names them): atomic add and set, reads, a wait.
    ``add_each`` adds to consecutive words in one operation: a ``read_all`` sees them all changed or none."""

    def add(self, i: int, value: int = 1) -> int: ...
    def add_each(self, first: int, values: Sequence[int]) -> None: ...
    def set(self, i: int, value: int) -> int: ...
    def read(self, i: int) -> int: ...
    def read_all(self) -> np.ndarray: ...
    def wait_until(self, predicate: Callable[[np.ndarray], bool], timeout: float, nap: float = ...) -> bool: ...
    def free(self) -> None: ...


@runtime_checkable
class Mailbox(Protocol):
    """Gradient slots per learner group: a push claims a free slot or waits (back-pressure); rank 0 polls."""

    def try_push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray,
                 stats: Sequence[float] | None = None) -> bool: ...
    def push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray, stats=None,
             timeout: float | None = None, abandon: Callable[[], bool] | None = None, backoff=None) -> float: ...
    def poll(self, limit: int | None = None) -> list[tuple[dict, np.ndarray]]: ...
    def free(self) -> None: ...


@runtime_checkable
class Outbox(Protocol):
    """Where a learner group root's pushes go: rank 0's mailbox itself (a ``Mailbox`` is one), or with
    ``learners.combine: node`` its node's combined push (transport/node_combine.py ``CombiningOutbox``)."""

    def push(self, group: int, seq: int, base_version: int, samples: int, grad: np.ndarray, stats=None,
             timeout: float | None = None, abandon: Callable[[], bool] | None = None, backoff=None) -> float: ...


@runtime_checkable
class NodeGather(Protocol):
    """learners.combine=node: the pushes of a node's group roots gathered at the first of them
    (transport/node_combine.py): ``gather`` returns there every member's (header floats, scaled gradient) in group
    order, on the other roots an empty list, and None once abandoned (``wait()``, called while waiting, said the
    run has stopped). Every implementation also has ``members`` (the node's groups) and ``broken``."""

    def gather(self, meta: np.ndarray, part: np.ndarray, wait: Callable[[], bool]
               ) -> list[tuple[np.ndarray, np.ndarray]] | None: ...
    def close(self) -> None: ...


@runtime_checkable
class Board(Protocol):
    """The newest weights (and a few older versions) on rank 0; a reader never gets a torn copy. ``fetch_rows``
    (the parameter rank): the copies of each version rank 0 served and their bytes, by reader kind (run.h5
    ``weight_fetches``; empty where nothing travels, as in the serial runner)."""

    def publish(self, version: int, flat: np.ndarray, probe: np.ndarray | None = None) -> None: ...
    def latest_version(self) -> int: ...
    def read_latest(self, out: np.ndarray, have: int = -1) -> int: ...
    def read_version(self, version: int, out: np.ndarray) -> bool: ...
    def read_probe(self, out: np.ndarray) -> int: ...
    def versions(self) -> list[int]: ...
    def fetch_rows(self, final: bool = False) -> dict[str, list[int]]: ...
    def free(self) -> None: ...


@runtime_checkable
class Reports(Protocol):
    """Small messages to rank 0 (``hpcrl.runtime.messages``), in the order each sender sent them. ``poll``: a sender
    whose loop waits lets what it holds for others move on (a node's report relay, ``actors.reports: node``)."""

    def send(self, message: Report) -> None: ...
    def poll(self) -> None: ...
    def drain(self) -> list[Report]: ...
    def close(self) -> None: ...


@runtime_checkable
class ActorLink(Protocol):
    def can_send(self) -> bool: ...
    def send(self, group: int, fragment: dict) -> float: ...
    def close(self) -> None: ...


@runtime_checkable
class LearnerLink(Protocol):
    def poll(self) -> list[dict]: ...
    def finished(self) -> bool: ...
    def close(self) -> None: ...


@runtime_checkable
class BatchSender(Protocol):
    """The post-processing group's side: prepared batches to the training groups."""

    def send(self, group: int, message: dict) -> None: ...
    def close(self, groups, beat) -> None: ...


@runtime_checkable
class BatchReceiver(Protocol):
    def poll(self) -> list[dict]: ...
    def finished(self) -> bool: ...


@runtime_checkable
class Fragments(Protocol):
    """Fragment channels: an actor's link to the learner groups, a group root's link from the actors."""

    def actor_link(self, actor: int) -> ActorLink: ...
    def learner_link(self, group: int) -> LearnerLink: ...
    def batch_sender(self) -> BatchSender: ...
    def batch_receiver(self, group: int) -> BatchReceiver: ...


Share = Callable[[np.ndarray, dict, "list[np.ndarray] | None"], None]
"""A member's work on one share: ``share(weights, rows, window)`` loads the weights, computes the share's
gradient and joins the group's :meth:`GroupReduce.average`."""


@runtime_checkable
class GroupReduce(Protocol):
    """One learner group's L ranks (``learners.ranks_per_group``) computing one gradient per minibatch.

    The root: ``ready(tick)`` before a batch (a group whose members join as a job step starts and connects them
    there, calling ``tick`` while it waits; the others' members are always there), ``hand_out`` gives member r
    rows ``r::L`` of the minibatch and of the IS window, with the weights, and returns the root's own share;
    ``park`` lets the members nap long (or leave); ``release`` ends them; ``close`` at its end. Every rank:
    ``average`` (the mean of the L shares' gradients). A member: ``serve`` until released. Every
    implementation also has ``size``, L with the root (not a Protocol member: isinstance checks only methods).
    """

    def ready(self, tick: Callable[[], None]) -> None: ...

    def hand_out(self, weights: np.ndarray, minibatch: dict, window: list[np.ndarray] | None
                 ) -> tuple[dict, list[np.ndarray] | None]: ...
    def park(self) -> None: ...
    def release(self) -> None: ...
    def average(self, grad: torch.Tensor) -> np.ndarray: ...
    def serve(self, share: Share, check: Callable[[], None], beat: Callable[[], None]) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class GroupsAllreduce(Protocol):
    """The learner group roots' own allreduce (``learners.topology: allreduce``; transport/groups_allreduce.py):
    ``mean`` of each group's minibatch gradient (and whether any group is stopping), ``sum`` of a few float64
    values per batch; each returns None once the call was abandoned (``wait()``, called while waiting, said the
    run has stopped). Every implementation also has ``size`` (G) and ``broken``."""

    def mean(self, grad: np.ndarray, stopping: bool, wait: Callable[[], bool]) -> tuple[np.ndarray, bool] | None: ...
    def sum(self, values: np.ndarray, wait: Callable[[], bool]) -> np.ndarray | None: ...
    def close(self) -> None: ...


@runtime_checkable
class Joiner(Protocol):
    """A door rank's joining launch, one join at a time (``learners.elastic`` / ``actors.elastic``; made by
    ``hpcrl/join_launch.py``): ``join`` starts the ranks and connects them (``comm``: the door, rank 0, and the
    joined ranks, while they are here; None otherwise), ``lost`` tells that their launch or first process has ended,
    ``drop`` forgets ranks that died, ``leave`` lets released ranks go; ``given_up`` / ``dropped`` say so in one
    line; ``record_job`` reports a joining batch job as an ``allocations`` row. Every implementation also has
    ``comm`` and ``joined_at`` (attributes: isinstance checks only methods)."""

    def join(self, role: list[str], tick: Callable[[], None]) -> tuple[str | None, float]: ...
    def lost(self) -> bool: ...
    def drop(self) -> int: ...
    def leave(self) -> int: ...
    def given_up(self, why: str, what: str, meanwhile: str) -> None: ...
    def dropped(self, code: int, what: str, meanwhile: str) -> None: ...
    def record_job(self, reports: Reports) -> None: ...
