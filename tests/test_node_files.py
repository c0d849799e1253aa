"""Node files (``actors.reports: summary``): counted, cut back on --resume and read with run.h5's tables.

A small run directory: run.h5 (its clock starts at Unix 1000) holds one fragment of actor 0 from before the
nodes reported; node 3's file (clock from 1010.5) the later fragments of actors 0 and 1, node 7's (from 1020)
those of actor 2. No MPI: the files are written as the relays and rank 0 write them.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcrl.commands.analyze import load_analysis
from hpcrl.io import RunFile, RunFileError, TrajectoryWriter, read_table, record_counts, traj_filename, truncate_record
from hpcrl.io.node_file import NodeFile, node_filename
from hpcrl.io.rollback import check_not_cut_short

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_run import LAYOUT  # noqa: E402

FRAGMENT = 8 * LAYOUT.num_envs  # steps of one fragment
RUN_START = 1000.0
NODE_STARTS = {3: 1010.5, 7: 1020.0, 9: 1030.0}


def _steps(run_dir: Path, actor: int, fragments: int) -> None:
    """Add ``fragments`` fragments to the actor's trajectory file."""
    path = run_dir / traj_filename(actor)
    w = TrajectoryWriter.open_append(path) if path.is_file() else TrajectoryWriter(path, LAYOUT, actor=actor)
    with w:
        z = np.zeros((8, LAYOUT.num_envs))
        for _ in range(fragments):
            w.append_fragment(np.zeros((8, LAYOUT.num_envs, 4)), z, z, z, z, z, z, 1)


def _fragments(node: NodeFile | RunFile, rows: list[tuple[int, int, float]]) -> None:
    """actors rows (actor, fragment, time) of one fragment each."""
    node.append("actors", {"time": np.array([t for _, _, t in rows]), "actor": np.array([a for a, _, _ in rows]),
                           "fragment": np.array([k for _, k, _ in rows]), "steps": FRAGMENT})


def _episodes(node: NodeFile | RunFile, times: list[float], actor: int = 0) -> None:
    node.append("episodes", {"time": np.array(times), "actor": actor, "env_index": 0, "return": 1.0, "length": 5})


def _node(run_dir: Path, relay: int) -> NodeFile:
    return NodeFile.create(run_dir, relay, unix=lambda: NODE_STARTS[relay])


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """The run at its checkpoint: actor 0's file holds 2 of the 3 fragments its rows report (its steps were not
    flushed yet), actors 1 and 2 hold all theirs."""
    run_dir = tmp_path / "run"
    rank_map = {"rank": np.arange(4), "role": [0, 2, 2, 2], "group": -1, "index": [0, 0, 1, 2], "node": "n0"}
    with RunFile.create(run_dir / "run.h5", "name: nodes\n", rank_map, traj_layout=LAYOUT,
                        unix=lambda: RUN_START) as run:
        _fragments(run, [(0, 0, 0.5)])
        _episodes(run, [0.75])
        run.append("updates", {"time": np.array([1.0]), "version": 1, "round": 0, "num_gradients": 1})
    with _node(run_dir, 3) as node:  # actor 0's fragment 2 lies between actor 1's rows
        _fragments(node, [(0, 1, 1.0), (1, 0, 1.5), (0, 2, 2.25), (1, 1, 3.0)])
        _episodes(node, [2.25, 4.0], actor=1)
        node.flush()
    with _node(run_dir, 7) as node:
        _fragments(node, [(2, 0, 0.5), (2, 1, 1.0)])
        _episodes(node, [1.0], actor=2)
        node.flush()
    for actor, fragments in {0: 2, 1: 2, 2: 2}.items():
        _steps(run_dir, actor, fragments)
    return run_dir


def _grow(run_dir: Path) -> None:
    """What the job did after its checkpoint: more rows in nodes 3 and 7, node 9's file, more steps."""
    with NodeFile.open_append(run_dir / node_filename(3)) as node:
        _fragments(node, [(1, 2, 5.0)])
        node.flush()
    with NodeFile.open_append(run_dir / node_filename(7)) as node:
        _fragments(node, [(2, 2, 5.0)])
        _episodes(node, [5.0], actor=2)
        node.flush()
    with _node(run_dir, 9) as node:
        _fragments(node, [(5, 0, 1.0)])
        _episodes(node, [1.0], actor=5)
        node.flush()
    _steps(run_dir, 1, 1)
    _steps(run_dir, 2, 1)


def _actor_rows(path: Path) -> list[tuple[int, int]]:
    with h5py.File(path, "r", locking=False) as f:
        n = int(f["actors"].attrs["committed_rows"])
        return list(zip(f["actors/actor"][:n].tolist(), f["actors/fragment"][:n].tolist()))


def test_record_counts_counts_the_node_files_rows_and_steps(run_dir):
    counts = record_counts(run_dir)
    assert counts["nodes"] == {3: {"actors": 4, "episodes": 2}, 7: {"actors": 2, "episodes": 1}}
    assert counts["tables"]["actors"] == 1 and counts["tables"]["episodes"] == 1  # run.h5's own rows
    # actor 0: 3 fragments reported (1 in run.h5, 2 in node 3), 2 on file; actors 1, 2: their rows are node rows
    assert counts["traj_steps"] == {0: 2 * FRAGMENT, 1: 2 * FRAGMENT, 2: 2 * FRAGMENT}
    # rank 0 passes what it heard and opens no node file (another process writes it)
    with RunFile.open_append(run_dir / "run.h5") as run:
        heard = record_counts(run_dir, run_file=run, nodes={3: {"actors": 1, "episodes": 0}}, node_steps={1: FRAGMENT})
    assert heard["nodes"] == {3: {"actors": 1, "episodes": 0}}
    assert heard["traj_steps"] == {0: FRAGMENT, 1: FRAGMENT, 2: 0}


def test_truncate_record_cuts_each_node_file_to_the_checkpoint(run_dir):
    checkpoint = record_counts(run_dir)
    _grow(run_dir)

    removed = truncate_record(run_dir, checkpoint["tables"], checkpoint["traj_steps"], nodes=checkpoint["nodes"])

    # node 3: the row added after the checkpoint, and actor 0's fragment 2, which its file never held
    assert removed["nodes"] == {3: {"actors": 2, "episodes": 0}, 7: {"actors": 1, "episodes": 1},
                                9: {"actors": 1, "episodes": 1}}  # node 9 started after the checkpoint
    assert removed["tables"]["actors"] == 0 and removed["traj_steps"] == {0: 0, 1: FRAGMENT, 2: FRAGMENT}
    assert _actor_rows(run_dir / node_filename(3)) == [(0, 1), (1, 0), (1, 1)]  # the others keep their order
    assert _actor_rows(run_dir / "run.h5") == [(0, 0)]  # actor 0's steps count run.h5's rows first
    assert _actor_rows(run_dir / node_filename(9)) == []
    after = record_counts(run_dir)
    assert after["nodes"] == {3: {"actors": 3, "episodes": 2}, 7: {"actors": 2, "episodes": 1},
                              9: {"actors": 0, "episodes": 0}}
    assert after["traj_steps"] == checkpoint["traj_steps"]
    with NodeFile.open_append(run_dir / node_filename(3)) as node:  # the resumed relay appends after the cut
        _fragments(node, [(1, 2, 6.0)])
        assert node.flush() == {"actors": 4, "episodes": 2}


def test_a_checkpoint_with_no_table_counts_still_cuts_the_node_files(run_dir):
    checkpoint = record_counts(run_dir)
    _grow(run_dir)
    removed = truncate_record(run_dir, {}, {}, nodes=checkpoint["nodes"])
    assert removed == {"tables": {}, "traj_steps": {}, "lost_steps": {},
                       "nodes": {3: {"actors": 1, "episodes": 0}, 7: {"actors": 1, "episodes": 1},
                                 9: {"actors": 1, "episodes": 1}}}
    assert record_counts(run_dir)["nodes"] == {**checkpoint["nodes"], 9: {"actors": 0, "episodes": 0}}


def test_a_node_file_behind_or_missing_is_refused_before_anything_is_cut(run_dir):
    checkpoint = record_counts(run_dir)
    _grow(run_dir)
    before = record_counts(run_dir)
    ahead = {**checkpoint["nodes"], 7: {"actors": 9, "episodes": 1}}
    behind = (r"node-00007\.h5 table 'actors' holds 3 rows, fewer than the 9 the checkpoint counted .* "
              r"hpcrl run --resume .*put back the newer node-00007\.h5$")
    with pytest.raises(RunFileError, match=behind):
        truncate_record(run_dir, checkpoint["tables"], checkpoint["traj_steps"], nodes=ahead)
    with pytest.raises(RunFileError, match=r"node-00005\.h5 is missing, though the checkpoint counted 2 rows of table "
                                           r"'actors' and 0 of table 'episodes' in it"):
        truncate_record(run_dir, checkpoint["tables"], checkpoint["traj_steps"],
                        nodes={**checkpoint["nodes"], 5: {"actors": 2, "episodes": 0}})
    assert record_counts(run_dir) == before
    # a relay that had written no row when the checkpoint was taken: nothing to miss
    removed = truncate_record(run_dir, checkpoint["tables"], checkpoint["traj_steps"],
                              nodes={**checkpoint["nodes"], 5: {"actors": 0, "episodes": 0}})
    assert 5 not in removed["nodes"] and removed["nodes"][9] == {"actors": 1, "episodes": 1}


def test_a_node_file_cut_short_is_one_line_naming_it(run_dir):
    checkpoint = record_counts(run_dir)
    path = run_dir / node_filename(7)
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size // 2)
    with pytest.raises(RunFileError, match=rf"^--resume: {re.escape(str(path))} is cut short \(") as err:
        check_not_cut_short(run_dir)
    assert "\n" not in str(err.value)
    with pytest.raises(RunFileError, match=rf"^--resume: {re.escape(str(path))} is cut short \("):
        truncate_record(run_dir, checkpoint["tables"], checkpoint["traj_steps"], nodes=checkpoint["nodes"])


def test_roll_back_record_passes_the_checkpoints_node_counts(run_dir):
    from hpcrl.runtime.record.checkpoint import save_checkpoint
    from hpcrl.runtime.runners.job import roll_back_record

    checkpoint = record_counts(run_dir)
    save_checkpoint(run_dir, {"version": 1, "record": checkpoint})
    _grow(run_dir)
    assert roll_back_record(run_dir)["nodes"][7] == {"actors": 1, "episodes": 1}
    assert record_counts(run_dir)["nodes"][7] == checkpoint["nodes"][7]


def test_read_table_joins_the_node_files_on_run_h5s_clock(run_dir):
    actors = read_table(run_dir, "actors")
    # node 3's time 2.25 is run time 2.25 + 1010.5 - 1000
    assert actors["time"].tolist() == [0.5, 10.5 + 1.0, 10.5 + 1.5, 12.75, 10.5 + 3.0, 20.5, 21.0]
    assert list(zip(actors["actor"].tolist(), actors["fragment"].tolist())) == [
        (0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0), (2, 1)]
    # without the time column, in the same order
    assert read_table(run_dir / "run.h5", "episodes", ["actor"])["actor"].tolist() == [0, 1, 1, 2]
    assert len(read_table(run_dir, "updates")["time"]) == 1  # the other tables: run.h5's alone


def test_hpcrl_analyze_sees_the_node_rows(run_dir):
    run = load_analysis().load_run(run_dir)
    expected = read_table(run_dir, "actors")
    for column in ("time", "actor", "fragment", "steps"):
        np.testing.assert_array_equal(run.table("actors")[column], expected[column])
    assert run.table("episodes")["time"].tolist() == [0.75, 12.75, 14.5, 21.0]
    assert not any("node" in note for note in run.notes), run.notes
