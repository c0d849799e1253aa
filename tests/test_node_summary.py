"""Per-node summaries (``actors.reports: summary``, hpcrl/runtime/record/node_rows.py): a relay's batch becomes the
node file's rows and one NodeSummary of sums, and rank 0's record of the summary keeps the round's statistics that
the same reports give it one by one.

The whole jobs (MPI on 2 "nodes", and virtual time) are in tests/test_node_reports.py beside the other modes."""
from __future__ import annotations

import math
from types import SimpleNamespace

import h5py
import numpy as np

from hpcrl.io.node_file import node_files
from hpcrl.runtime.messages import PARK_REASON, ActorParked, Episode, FragmentReport, NodeSummary
from hpcrl.runtime.record.node_rows import NodeRows
from hpcrl.runtime.record.run_record import RunRecord
from hpcrl.runtime.record.stop_rule import StopRule
from hpcrl.runtime.topology import one_process_rank_map
from hpcrl.runtime.transport.report_packing import FLUSH_SECONDS

IO = SimpleNamespace(compression="gzip", flush_seconds=5.0, loggers=[])
STOP = SimpleNamespace(total_env_steps=10**6, target_return=None, return_window=100, max_wall_seconds=None,
                       max_rounds=None)


class _Clock:
    def __init__(self, unix: float) -> None:
        self.t = unix

    def unix(self) -> float:
        return self.t


def _report(actor: int, i: int, ended: int, normalizer=None) -> FragmentReport:
    episodes = tuple(Episode(time=1000.0 + i, actor=actor, env_index=e, episode_return=1.5 * e + actor, length=3 + e,
                             policy_version=i) for e in range(ended))
    return FragmentReport(time=1000.0 + i, actor=actor, fragment=i, steps=8 + actor, sample_seconds=0.1 * (i + 1),
                          transport_wait_seconds=0.0, weight_sync_seconds=0.01, policy_version=i, group=i % 2,
                          episodes=episodes, normalizer=normalizer)


BATCH = [_report(3, 0, 2, {"n": 0}), _report(1, 0, 0), _report(3, 1, 1, {"n": 1}), _report(1, 1, 1), _report(3, 2, 0)]


def _rows(path, table):
    with h5py.File(path, "r", swmr=True, locking=False) as f:
        n = int(f[table].attrs["committed_rows"])
        return {c: f[table][c][:n] for c in f[table]}, float(f.attrs["start_unix"])


def test_a_batch_becomes_the_node_files_rows_and_their_sums(tmp_path):
    parked = ActorParked(time=5.0, actor=1, parked_seconds=1.0, cpu_seconds=0.0, active_actors=2,
                         reason=PARK_REASON["woken"])
    rows = NodeRows(tmp_path, 7, "gzip", env_steps=lambda: 640, clock=_Clock(999.5), flush_seconds=FLUSH_SECONDS)
    summary = rows.pack(7, [*BATCH[:2], parked, *BATCH[2:]])
    assert summary.node == 7 and summary.reports == (parked,) and summary.rows == (5, 4)
    sums = {int(r[0]): r[1:].tolist() for r in summary.actors}  # fragments, newest, steps, seconds
    assert list(sums) == [3, 1]  # in order of first appearance
    assert sums[3] == [3, 2, 33, 0.1 + 0.2 + 0.3] and sums[1] == [2, 1, 18, 0.1 + 0.2]
    assert summary.episode("actor").tolist() == [3, 3, 3, 1] and summary.episode("length").tolist() == [3, 4, 3, 3]
    assert summary.episode("return").tolist() == [3.0, 4.5, 3.0, 1.0]
    assert summary.normalizers == {3: {"n": 1}}
    [(relay, path)] = node_files(tmp_path).items()
    actors, origin = _rows(path, "actors")
    assert relay == 7 and origin == 999.5
    assert actors["actor"].tolist() == [3, 1, 3, 1, 3] and actors["fragment"].tolist() == [0, 0, 1, 1, 2]
    assert actors["time"].tolist() == [0.5, 0.5, 1.5, 1.5, 2.5]  # from the file's start_unix
    episodes, _ = _rows(path, "episodes")
    assert episodes["env_steps"].tolist() == [640] * 4 and episodes["return"].tolist() == [3.0, 4.5, 3.0, 1.0]
    again = rows.pack(7, [_report(1, 2, 0)])  # the next batch: the counts go on
    assert again.rows == (6, 4) and len(again.episodes) == 0
    rows.close()


def test_rank_0s_record_of_a_summary_keeps_the_rounds_statistics_of_the_reports(tmp_path):
    one = RunRecord.create(tmp_path / "one", IO, "name: t\n", one_process_rank_map(), StopRule(STOP), {})
    summed = RunRecord.create(tmp_path / "summed", IO, "name: t\n", one_process_rank_map(), StopRule(STOP), {})
    for report in BATCH:
        one.fragment(report, env_steps=0)
    rows = NodeRows(tmp_path / "summed", 4, "gzip", env_steps=lambda: 0, clock=_Clock(0.0),
                    flush_seconds=FLUSH_SECONDS)
    summed.node_summary(rows.pack(4, BATCH))
    rows.close()
    a, b = one.current, summed.current
    assert math.isclose(a["actor_seconds"], b["actor_seconds"]) and a["actors"] == b["actors"]
    assert a["returns"] == b["returns"] and a["lengths"] == b["lengths"] and a["episodes"] == b["episodes"] == 4
    assert a["episode_columns"] == b["episode_columns"]
    assert list(one.stop_rule.returns) == list(summed.stop_rule.returns) and one.episodes == summed.episodes
    assert summed.node_rows == {4: {"actors": 5, "episodes": 4}} and summed.node_steps == {3: 33, 1: 18}
    assert one.end_round(0, 0, active=1) == summed.end_round(0, 0, active=1)
    for r in (one, summed):
        r.close()


def test_a_summary_of_no_fragments_is_empty_but_says_the_files_rows(tmp_path):
    rows = NodeRows(tmp_path, 2, "gzip", env_steps=lambda: 0, clock=_Clock(0.0), flush_seconds=FLUSH_SECONDS)
    summary = rows.pack(2, [])
    assert isinstance(summary, NodeSummary) and summary.actors.shape == (0, 5) and summary.rows == (0, 0)
    assert np.asarray(summary.episodes).shape == (0, 4)
    rows.close()
