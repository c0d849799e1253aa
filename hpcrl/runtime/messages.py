"""Everything a rank tells the parameter rank (rank 0), one frozen dataclass per message.

Each message has one sender and one handler (``roles/parameter.py``'s table ``ParameterRank.handlers``); its
table row, where it is one, comes from ``row()``: its fields are run.h5's columns (io/schema.py), with Unix times
the record shifts to the run's clock. They travel through ``Reports`` (transport/protocols.py): pickled
over MPI in one tag, or in one in-memory queue under the serial runner, in the order each rank sent them.

=====================  ==========================================  =========================================
message                sender                                       handled by (rank 0)
=====================  ==========================================  =========================================
``PushHeader``         the mailbox slot of a gradient or update     ``ParameterRank._arrived``
                       push (transport/windows.py, local.py)
``CombinedPush``       a node's groups' push (learners.combine=     ``ParameterRank._arrived``: a record
                       node), as the pushing group's statistics     per member
                       (transport/node_combine.py)
``FragmentReport``     an actor, per fragment (roles/actor.py)      elastic rule, actors + episodes rows
``NodeReports``        a node's report relay (actors.reports=node:  its fragment reports as one block of rows,
                       transport/node_reports.py)                   the others by their own handlers
``NodeSummary``        a node's report relay (actors.reports=       elastic rule and ledger per actor, the
                       summary: the rows written on the node,       round's episodes, the node file's rows;
                       runtime/record/node_rows.py)                 the others by their own handlers
``ActorParked``        an actor whose park ended                    ``actor_parks`` row
``SamplerEvent``       an actor's joined sampler joined, left or    ``actor_joins`` row
                       was given up (roles/joining_sampler.py)
``Evaluation``         the evaluating actor (roles/actor.py)        ``eval_episodes`` rows
``LearnerActivity``    a learner group root, per batch              learner_activity + learner_cycles rows,
                       (roles/learner.py)                           the algo report, the group's state
``GroupEvent``         a learner group root: its park ended, its    ``elastic_events`` row
                       joining ranks joined or left
``JoiningJob``         a door whose ranks join as a batch job of    ``allocations`` row
                       their own (learners/actors.elastic=jobs)
=====================  ==========================================  =========================================

The other way, rank 0 tells every rank one thing, at start: :class:`Startup` (``runtime/runners/mpi.py``
broadcasts it; the serial runner hands it to each role).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from hpcrl.io.schema import ELASTIC_ACTIONS, ELASTIC_REASONS, PARK_REASONS

ELASTIC_ACTION = {name: i for i, name in enumerate(ELASTIC_ACTIONS)}
"""The code of each elastic action (``GroupEvent.action``, ``SamplerEvent.action``)."""
ELASTIC_REASON = {name: i for i, name in enumerate(ELASTIC_REASONS)}
"""The code of each elastic reason (``GroupEvent.reason``, ``SamplerEvent.reason``)."""
PARK_REASON = {name: i for i, name in enumerate(PARK_REASONS)}
"""The code of each reason an actor's park ended (``ActorParked.reason``)."""


NOT_A_COLUMN = {"column": False}
"""The metadata of a message's field that is not a column of its table row."""
COLUMN_OF = {"episode_return": "return"}
"""A field whose column's name is a Python keyword."""


class TableRow:
    """A message whose fields are the columns of a run.h5 row (but those marked ``NOT_A_COLUMN``)."""

    def row(self) -> dict:
        """The row, with Unix times (the record shifts them to the run's clock)."""
        return {column: getattr(self, name) for name, column in _columns(type(self))}


@functools.cache
def _columns(cls: type) -> tuple[tuple[str, str], ...]:
    """(field, column) of each of a row message's columns, looked up once per class: rank 0 makes a row of every
    fragment and episode, and ``dataclasses.fields`` per row was half of that."""
    return tuple((f.name, COLUMN_OF.get(f.name, f.name)) for f in fields(cls) if f.metadata.get("column", True))


@dataclass(frozen=True)
class PushHeader:
    """A gradient (or update) push as rank 0 copies it out of the mailbox."""

    seq: int
    """The group's push number (from 0, continued on resume)."""
    group: int
    base_version: int
    """The weights version it was computed from."""
    samples: int
    """Rows of the minibatch (or batch) it was computed on."""
    stats: np.ndarray = field(repr=False)
    """Its statistics vector, in the order of ``transport/control.GRAD_STATS``."""
    ticket: int = 0
    """Arrival order among pushes (the mailbox's)."""


@dataclass(frozen=True)
class CombinedPush:
    """learners.combine=node: one push for the groups of a node, its gradient their sum. It travels as the pushing
    group's statistics vector (float64, integers exact below 2**53), laid out ``[members, scaled_for]`` and then
    per member, in group order, ``[group, seq, base_version, samples, *stats]``; the slot's own header is the
    pushing group's."""

    members: tuple[PushHeader, ...]
    """Each group's push as it would have come alone (its ``stats`` in ``GRAD_STATS`` order, ``ticket`` 0)."""
    scaled_for: int
    """Each member's gradient was multiplied by float32(1 / scaled_for) before the sum (the sync step's size)."""

    ROW = 4
    """The integers of a member's row ahead of its statistics: group, seq, base_version, samples."""

    @classmethod
    def capacity(cls, members: int, stats: int) -> int:
        """The floats of the statistics vector of a push of ``members`` groups of ``stats`` statistics each."""
        return 2 + members * (cls.ROW + stats)

    @staticmethod
    def row(member: PushHeader) -> np.ndarray:
        """A member's row (what a group hands its node's pusher, and what the push carries for it)."""
        return np.array([member.group, member.seq, member.base_version, member.samples, *member.stats],
                        dtype=np.float64)

    @classmethod
    def member(cls, row: np.ndarray) -> PushHeader:
        return PushHeader(seq=int(row[1]), group=int(row[0]), base_version=int(row[2]), samples=int(row[3]),
                          stats=np.array(row[cls.ROW:], dtype=np.float64))

    def pack(self) -> np.ndarray:
        return np.concatenate([[len(self.members), self.scaled_for], *(self.row(m) for m in self.members)])

    @classmethod
    def unpack(cls, vector: np.ndarray, stats: int) -> "CombinedPush":
        members = int(vector[0])
        if vector.size != cls.capacity(members, stats):
            raise ValueError(f"CombinedPush: {vector.size} floats do not hold {members} members of {stats} stats")
        rows = vector[2:].reshape(members, cls.ROW + stats)
        return cls(tuple(cls.member(r) for r in rows), int(vector[1]))


@dataclass(frozen=True)
class Episode(TableRow):
    """A training episode that ended on an actor (a row of ``episodes``)."""

    time: float
    actor: int
    env_index: int
    episode_return: float
    length: int
    policy_version: int


@dataclass(frozen=True)
class FragmentReport(TableRow):
    """An actor sent a fragment: its timings (a row of ``actors``), the episodes it ended and the actor's newest
    normalisation statistics (kept by rank 0 for checkpoints)."""

    time: float
    actor: int
    fragment: int
    steps: int
    sample_seconds: float
    transport_wait_seconds: float
    weight_sync_seconds: float
    policy_version: int
    group: int
    """The group it went to (-1: several)."""
    episodes: tuple[Episode, ...] = field(default=(), metadata=NOT_A_COLUMN)
    normalizer: dict | None = field(default=None, repr=False, metadata=NOT_A_COLUMN)


@dataclass(frozen=True)
class FragmentColumns:
    """Fragment reports as columns: what rank 0 appends as a whole instead of report by report (``actors.reports:
    node``), with the same values and order as their rows."""

    actors: dict = field(repr=False)
    """The ``actors`` rows' columns (``FragmentReport.row()``'s), one value per fragment, in the order they came."""
    episodes: dict = field(repr=False)
    """The ``episodes`` rows' columns (``Episode.row()``'s) of the episodes they ended, fragment by fragment."""
    normalizers: dict = field(repr=False)
    """Each actor's newest normalisation statistics among them (rank 0 keeps only an actor's newest)."""

    @classmethod
    def of(cls, reports: list[FragmentReport]) -> "FragmentColumns":
        episodes = [e for r in reports for e in r.episodes]
        return cls(actors=_as_columns(FragmentReport, reports), episodes=_as_columns(Episode, episodes),
                   normalizers={r.actor: r.normalizer for r in reports if r.normalizer is not None})

    def __len__(self) -> int:
        return len(self.actors["actor"])


def _as_columns(cls: type, messages: list) -> dict[str, list]:
    """The row columns of ``messages`` (all of class ``cls``) as lists (they unpickle far faster than arrays)."""
    return {column: [getattr(m, name) for m in messages] for name, column in _columns(cls)}


@dataclass(frozen=True)
class NodeReports:
    """The reports a node's actors sent since the last of these (``actors.reports: node``: one message to rank 0
    per node and flush instead of one per fragment): the fragment reports as columns, the other messages as
    they are, each actor's in the order it sent them."""

    node: int
    """The node's relay, as a world rank."""
    fragments: FragmentColumns
    reports: tuple = ()
    """The node's actors' other messages (``ActorParked``, ``SamplerEvent``, ``Evaluation``)."""

    @classmethod
    def of(cls, relay: int, batch: list) -> "NodeReports":
        """``batch``'s fragment reports as columns, its other messages as they are."""
        return cls(node=relay, fragments=FragmentColumns.of([m for m in batch if type(m) is FragmentReport]),
                   reports=tuple(m for m in batch if type(m) is not FragmentReport))


@dataclass(frozen=True)
class NodeSummary:
    """What rank 0 needs of the reports a node's actors sent since the last of these (``actors.reports: summary``),
    whose ``actors`` and ``episodes`` rows the node's relay wrote to its own file (io/node_file.py): per actor
    sums, the episodes' numbers, how many rows the node file holds now, and the other messages as they are."""

    node: int
    """The node's relay, as a world rank (its file: nodes/node-RRRRR.h5)."""
    actors: np.ndarray = field(repr=False)
    """One row per actor that sent fragments: :data:`ACTOR_SUMS` (float64; counts are exact)."""
    episodes: np.ndarray = field(repr=False)
    """One row per episode the fragments ended, in their order: :data:`EPISODE_NUMBERS`."""
    normalizers: dict = field(repr=False)
    """Each actor's newest normalisation statistics among the fragments."""
    rows: tuple[int, int]
    """The node file's committed ``actors`` and ``episodes`` rows once this message's were written."""
    reports: tuple = ()
    """The node's actors' other messages (``ActorParked``, ``SamplerEvent``, ``Evaluation``)."""

    ACTOR_SUMS = ("actor", "fragments", "newest_fragment", "steps", "sample_seconds")
    EPISODE_NUMBERS = ("actor", "env_index", "return", "length")

    def actor_sum(self, name: str) -> np.ndarray:
        """One of :data:`ACTOR_SUMS`, per actor."""
        return self.actors[:, self.ACTOR_SUMS.index(name)]

    def episode(self, name: str) -> np.ndarray:
        """One of :data:`EPISODE_NUMBERS`, per episode."""
        return self.episodes[:, self.EPISODE_NUMBERS.index(name)]


@dataclass(frozen=True)
class ActorParked(TableRow):
    """An actor's park ended (a row of ``actor_parks``; ``reason``: an index of io.schema's PARK_REASONS)."""

    time: float
    actor: int
    parked_seconds: float
    cpu_seconds: float
    active_actors: int
    reason: int


@dataclass(frozen=True)
class SamplerEvent(TableRow):
    """An actor's joined sampler joined, left or was given up (a row of ``actor_joins``; ``action`` and
    ``reason``: indices of io.schema's ELASTIC_ACTIONS and ELASTIC_REASONS)."""

    time: float
    actor: int
    action: int
    reason: int
    seconds: float
    active_actors: int


@dataclass(frozen=True)
class EvalEpisode(TableRow):
    """One greedy evaluation episode (an eval env copy)."""

    env_index: int
    episode_return: float
    length: int


@dataclass(frozen=True)
class Evaluation:
    """The evaluation rank 0 asked for after ``round`` rounds (rows of ``eval_episodes``)."""

    time: float
    round: int
    policy_version: int
    episodes: tuple[EvalEpisode, ...]


@dataclass(frozen=True)
class GroupState:
    """Update push: a group's optimizer state after its update ``seq`` (rank 0 keeps it for the checkpoint)."""

    group: int
    seq: int
    state: dict = field(repr=False)


@dataclass(frozen=True)
class LearnerActivity(TableRow):
    """A learner group trained (or prepared) a batch: a row of ``learner_activity``, its gradients' cycles
    (columns of ``learner_cycles``), the algorithm's report for ``algo.end_round`` and, with update push, the
    group's optimizer state."""

    time_start: float
    time_end: float
    group: int
    compute_seconds: float
    samples: int
    cycles: dict = field(repr=False, metadata=NOT_A_COLUMN)
    """Columns of ``learner_cycles`` (record/cycle_profile.py ``CycleRecord.take_rows``)."""
    algo_report: Any = field(default=None, repr=False, metadata=NOT_A_COLUMN)
    """``algo.learner_report(batch)``: opaque to the runtime, handed to ``algo.end_round``."""
    group_state: GroupState | None = field(default=None, metadata=NOT_A_COLUMN)


@dataclass(frozen=True)
class GroupEvent(TableRow):
    """A learner group's park ended, or its joining ranks joined, left or were given up (a row of
    ``elastic_events``; ``action`` and ``reason``: indices of io.schema's ELASTIC_ACTIONS and ELASTIC_REASONS)."""

    time: float
    group: int
    action: int
    reason: int
    active_groups: int
    parked_seconds: float
    cpu_seconds: float


@dataclass(frozen=True)
class JoiningJob:
    """The batch job a door's joining ranks run in (a row of ``allocations``: ``columns`` are
    record/allocation.py ``batch_job``'s)."""

    time: float
    columns: dict

    def row(self) -> dict:
        return {"time": self.time, **self.columns}


@dataclass(frozen=True)
class Startup:
    """What rank 0 tells every rank at start (the one message the other way): where the run stands, so that a
    resumed job goes on numbering and normalising where the checkpoint left it."""

    start_unix: float
    """The run's clock: run.h5's times count from it."""
    version: int
    """The weights version rank 0 published first."""
    seq_next: tuple[int, ...]
    """Each learner group's next push number."""
    fragment_next: tuple[int, ...]
    """Each actor's next fragment number."""
    normalizers: tuple[dict | None, ...] = field(repr=False)
    """Each actor's normalisation statistics at the checkpoint (None: fresh)."""
    group_states: dict[int, dict] = field(default_factory=dict, repr=False)
    """Update push: each group's optimizer state after its newest update taken."""


Report = (FragmentReport | NodeReports | NodeSummary | ActorParked | SamplerEvent | Evaluation | LearnerActivity
          | GroupEvent | JoiningJob)
"""What travels through ``Reports`` (every message here but the mailbox's ``PushHeader``)."""

REPORTS = (FragmentReport, NodeReports, NodeSummary, ActorParked, SamplerEvent, Evaluation, LearnerActivity, GroupEvent,
           JoiningJob)
