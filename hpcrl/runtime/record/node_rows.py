"""The node's half of the record under ``actors.reports: summary``: a relay's batch of reports, its fragment rows
written to the node's own file, rank 0 sent only their sums.

A node's report relay (``transport/node_reports.py``, or the virtual-time twin ``local_node_reports.py``) turns each
batch into one upward message through a :class:`NodeRows`: the ``actors`` rows (one per fragment) and the
``episodes`` rows of the batch's fragment reports go to ``nodes/node-RRRRR.h5`` (io/node_file.py), which is flushed,
and rank 0 gets a :class:`~hpcrl.runtime.messages.NodeSummary`: per actor its fragments, newest fragment number,
steps and sampling seconds (what the elastic rule, the actor ledger and the round's statistics use), each episode's
actor, env index, return and length (the stop rule, the round's rewards, ``algo.end_round``'s episodes), and the
file's committed rows (rank 0's checkpoint). Rank 0's work is then per message and actor, not per fragment.

An episode row's ``env_steps`` (the run's env steps when it was recorded) is the env-step counter as the relay reads
it when it writes the batch, where rank 0 would read it when it records the message.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from hpcrl.io.node_file import NodeFile
from hpcrl.runtime.clock import Clock
from hpcrl.runtime.messages import FragmentColumns, FragmentReport, NodeSummary, Report


class NodeRows:
    """One relay's writer of its node's rows (opened at the first batch: a relay that never flushes makes no file).

    ``env_steps``: reads the run's env-step counter; ``clock``: the relay's (its Unix times are the rows');
    ``flush_seconds``: the longest a report waits in the relay."""

    every_actor = False  # rank 0's work is per message: send every flush_seconds (transport/report_packing.py)

    def __init__(self, run_dir: Path, relay: int, compression: str, env_steps: Callable[[], int], clock: Clock,
                 flush_seconds: float):
        self.flush_seconds = flush_seconds  # transport/report_packing.py's summary_interval(relays)
        self.run_dir, self.relay, self.compression = run_dir, relay, compression
        self.env_steps, self.clock = env_steps, clock
        self.file: NodeFile | None = None

    def pack(self, relay: int, batch: list[Report]) -> NodeSummary:
        """``batch``'s fragment rows into the node file (flushed), the summary of them and its other messages."""
        if self.file is None:
            self.file = NodeFile.create(self.run_dir, self.relay, self.compression, unix=self.clock.unix)
        f = FragmentColumns.of([m for m in batch if type(m) is FragmentReport])
        rows = self._write(f)
        return NodeSummary(node=relay, actors=_actor_sums(f.actors), episodes=_episode_numbers(f.episodes),
                           normalizers=f.normalizers, rows=rows,
                           reports=tuple(m for m in batch if type(m) is not FragmentReport))

    def _write(self, f: FragmentColumns) -> tuple[int, int]:
        node = self.file
        if len(f):
            node.append("actors", {**f.actors, "time": node.now_of(f.actors["time"])})
        n = len(f.episodes["actor"])
        if n:
            node.append("episodes", {**f.episodes, "time": node.now_of(f.episodes["time"]),
                                     "env_steps": np.full(n, self.env_steps(), dtype=np.int64)})
        committed = node.flush()
        return committed["actors"], committed["episodes"]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _actor_sums(actors: dict) -> np.ndarray:
    """Per actor (in order of first appearance): fragments, newest fragment number, steps, sampling seconds."""
    ids = np.asarray(actors["actor"], dtype=np.int64)
    if not ids.size:
        return np.zeros((0, len(NodeSummary.ACTOR_SUMS)))
    unique, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    newest = np.full(unique.size, -1, dtype=np.int64)
    np.maximum.at(newest, inverse, np.asarray(actors["fragment"], dtype=np.int64))
    sums = np.column_stack([
        unique, np.bincount(inverse, minlength=unique.size), newest,
        np.bincount(inverse, np.asarray(actors["steps"], dtype=np.float64), unique.size),
        np.bincount(inverse, np.asarray(actors["sample_seconds"], dtype=np.float64), unique.size)]).astype(np.float64)
    return sums[np.argsort(first, kind="stable")]


def _episode_numbers(episodes: dict) -> np.ndarray:
    """The episodes' actor, env index, return and length (their ``episodes`` columns), one row each."""
    columns = [episodes[c] for c in NodeSummary.EPISODE_NUMBERS]
    return np.column_stack(columns).astype(np.float64) if columns[0] else np.zeros((0, len(columns)))
