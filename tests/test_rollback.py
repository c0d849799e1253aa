"""hpcrl.io.rollback: a synthetic run grows past its checkpoint and is cut back to the counts stored there."""
from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcrl.io import (RunFile, RunFileError, TrajectoryWriter, read_table, read_trajectory, record_counts,
                      traj_filename, truncate_record)
from hpcrl.io.schema import NEVER_CUT, TABLES, TRAJ_FIELD_NAMES

CUT = [name for name in TABLES if name not in NEVER_CUT]  # allocations: a job that ran was billed

sys.path.insert(0, str(Path(__file__).parent))
from synthetic_run import LAYOUT, write_synthetic_run  # noqa: E402

ACTORS = 3


def _snapshot(run_dir):
    tables = {name: read_table(run_dir, name) for name in TABLES}
    traj = {a: read_trajectory(run_dir / traj_filename(a)) for a in range(ACTORS)}
    return tables, traj


def _grow(run_dir, rng):
    """What a job does after its last checkpoint: more rows and steps (returns how many of each)."""
    added_rows = {"episodes": 5, "updates": 3, "gradients": 4}
    with RunFile.open_append(run_dir / "run.h5") as run:
        run.append("episodes", {"time": np.arange(5.0), "actor": 0, "env_index": 0, "return": 1.0, "length": 1})
        run.append("updates", {"time": np.arange(3.0), "version": 99, "round": 9, "num_gradients": 1})
        run.append("gradients", {"time": np.arange(4.0), "group": 0, "seq": 9, "base_version": 9, "admitted": 1,
                                 "reason": 0})
        run.append("allocations", {"time": np.array([4.0]), "scheduler": 0, "job_id": b"77"})  # a job that ran
        counts_mid = record_counts(run_dir, run_file=run)  # the parameter rank's way: its own open writer
    added_steps = {0: 16, 2: 32}
    for actor, steps in added_steps.items():
        with TrajectoryWriter.open_append(run_dir / traj_filename(actor)) as w:
            T = steps // LAYOUT.num_envs
            z = np.zeros((T, LAYOUT.num_envs))
            w.append_fragment(rng.normal(size=(T, LAYOUT.num_envs, 4)), z, z, z, z, z, z, 77)
    return added_rows, added_steps, counts_mid


def test_truncate_record_cuts_back_to_the_checkpoint_counts(tmp_path):
    run_dir = tmp_path / "run"
    write_synthetic_run(run_dir, rounds=3, actors=ACTORS)
    at_checkpoint = record_counts(run_dir)
    assert at_checkpoint["tables"]["episodes"] == len(read_table(run_dir, "episodes")["time"]) > 0
    assert at_checkpoint["traj_steps"] == {a: 3 * 2 * 8 * LAYOUT.num_envs for a in range(ACTORS)}
    before_tables, before_traj = _snapshot(run_dir)
    added_rows, added_steps, counts_mid = _grow(run_dir, np.random.default_rng(0))
    assert counts_mid["tables"]["episodes"] == at_checkpoint["tables"]["episodes"] + 5
    with h5py.File(run_dir / traj_filename(1), "a", locking=False) as f:  # actor 1 was killed mid-flush
        for k in TRAJ_FIELD_NAMES:
            f[k].resize(f[k].shape[0] + 8, axis=0)

    removed = truncate_record(run_dir, at_checkpoint["tables"], at_checkpoint["traj_steps"])

    assert removed["tables"] == {name: added_rows.get(name, 0) for name in CUT}
    assert list(read_table(run_dir, "allocations")["job_id"]) == [b"77"]  # never cut
    assert removed["traj_steps"] == {0: 16, 1: 0, 2: 32}  # actor 1's uncommitted steps were never counted
    after_tables, after_traj = _snapshot(run_dir)
    for name in CUT:
        for col, values in before_tables[name].items():
            np.testing.assert_array_equal(after_tables[name][col], values, err_msg=f"{name}.{col}")
    for a in range(ACTORS):
        for k, values in before_traj[a].items():
            np.testing.assert_array_equal(after_traj[a][k], values)
        with h5py.File(run_dir / traj_filename(a), "r", locking=False) as f:  # closed cleanly, plain open works
            assert f["obs"].shape[0] == at_checkpoint["traj_steps"][a]
    assert record_counts(run_dir) == at_checkpoint
    with RunFile.open_append(run_dir / "run.h5") as run:  # the resumed job appends right after the cut
        run.append("updates", {"time": 1e3, "version": 1234, "round": 3, "num_gradients": 1})
    versions = read_table(run_dir, "updates")["version"]
    assert versions[-1] == 1234 and len(versions) == at_checkpoint["tables"]["updates"] + 1


def test_truncate_record_never_lengthens_and_names_bad_input(tmp_path):
    run_dir = tmp_path / "run"
    write_synthetic_run(run_dir, rounds=1, actors=ACTORS)
    counts = record_counts(run_dir)
    more = {name: n + 10 for name, n in counts["tables"].items()}
    # a checkpoint that counted more rows than run.h5 holds is refused, naming a table, and nothing is cut
    with pytest.raises(RunFileError, match=r"table '\w+' holds \d+ rows, fewer than the \d+ the checkpoint counted"):
        truncate_record(run_dir, more, {0: 10 ** 6})
    assert record_counts(run_dir) == counts
    removed = truncate_record(run_dir, counts["tables"], {0: 10 ** 6, 7: 5})  # actor 7 has no file: nothing to cut
    assert removed == {"tables": {name: 0 for name in CUT}, "traj_steps": {0: 0, 7: 0}, "lost_steps": {}, "nodes": {}}
    assert record_counts(run_dir) == counts
    with pytest.raises(RunFileError, match="no table 'epsiodes'"):
        truncate_record(run_dir, {"epsiodes": 1}, {})
    with pytest.raises(RunFileError, match="no such run file"):
        truncate_record(tmp_path / "nowhere", {"episodes": 1}, {})


def test_roll_back_cuts_a_trajectory_file_started_after_the_checkpoint(tmp_path):
    """A resume with more actors, killed before its first checkpoint: the new actor's file is not in the
    checkpoint's record, so its steps are not counted either; the next resume cuts it to 0 steps."""
    from hpcrl.runtime.record.checkpoint import save_checkpoint
    from hpcrl.runtime.runners.job import roll_back_record

    run_dir = tmp_path / "run"
    write_synthetic_run(run_dir, rounds=2, actors=ACTORS)
    counts = record_counts(run_dir)
    known = {a: s for a, s in counts["traj_steps"].items() if a < ACTORS - 1}  # the last actor came later
    save_checkpoint(run_dir, {"version": 1, "record": {"tables": counts["tables"], "traj_steps": known}})
    removed = roll_back_record(run_dir)
    assert removed["traj_steps"] == {**{a: 0 for a in known}, ACTORS - 1: counts["traj_steps"][ACTORS - 1]}
    assert record_counts(run_dir)["traj_steps"] == {**known, ACTORS - 1: 0}


def test_a_live_writers_file_is_counted_from_its_writer_and_a_closed_one_from_the_file(tmp_path):
    """The in-process runners' checkpoint: a file a writer of this process holds counts the writer's committed
    steps without being opened again (what a fresh reader would find there); after close, the file is read."""
    from hpcrl.io.readers import read_trajectory_steps
    from hpcrl.io.traj_file import held_committed_steps

    write_synthetic_run(tmp_path)
    path = tmp_path / traj_filename(1)
    before = read_trajectory_steps(path)
    w = TrajectoryWriter.open_append(path)
    T = 4
    z = np.zeros((T, LAYOUT.num_envs))
    w.append_fragment(np.zeros((T, LAYOUT.num_envs, 4)), z, z, z, z, z, z, 5)
    assert held_committed_steps(path) == before  # buffered steps are not committed
    w.flush()
    assert held_committed_steps(path) == before + T * LAYOUT.num_envs
    from hpcrl.io.rollback import _on_disk_steps

    assert _on_disk_steps(path, checked=True) == before + T * LAYOUT.num_envs  # what record_counts takes
    assert held_committed_steps(tmp_path / traj_filename(0)) is None  # no writer here holds it
    w.close()
    assert held_committed_steps(path) is None
    assert read_trajectory_steps(path) == before + T * LAYOUT.num_envs
