"""RunRecord: the rows every runner's events make (the fused loop's windows, rank 0's group decisions), the summary."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from hpcrl.io import read_attrs, read_table
from hpcrl.io.schema import ELASTIC_ACTIONS, ELASTIC_REASONS
from hpcrl.runtime.record.run_record import RunRecord
from hpcrl.runtime.record.stop_rule import StopRule
from hpcrl.runtime.topology import one_process_rank_map

IO = SimpleNamespace(compression="gzip", flush_seconds=5.0, loggers=[])
STOP = SimpleNamespace(total_env_steps=10**6, target_return=None, return_window=3, max_wall_seconds=None,
                       max_rounds=None)


def fused_record(run_dir) -> RunRecord:
    return RunRecord.create(run_dir, IO, "name: t\n", one_process_rank_map(), StopRule(STOP),
                            {"runner": "serial", "fused": True})


def test_a_fused_window_makes_one_updates_row_per_iteration_and_an_episodes_row_per_ended_episode(tmp_path):
    record = fused_record(tmp_path)
    T, N, first = 4, 2, 10  # iterations 11, 12, 13: fragments of 4 steps of 2 envs
    times = [1.0, 2.0, 3.0]
    stats = {"critic_loss": np.array([0.5, 0.25, 0.125], np.float32), "q_mean": np.array([1, 2, 3], np.float32)}
    ended = {"row": np.array([0, 9]), "env_index": np.array([1, 0]), "return": np.array([-3.0, 5.0], np.float32),
             "length": np.array([7, 30])}
    record.iterations(first, times, stats, ended, T, N, lr=1e-3, round_index=2)
    record.end_round(2, consumed=13 * T * N)
    assert record.stats(104, 1000, 13, 1, 1, 2, 1.0)["q_mean"] == 3.0  # the newest iteration's numbers
    record.close()
    h5 = tmp_path / "run.h5"
    updates = read_table(h5, "updates")
    assert updates["version"].tolist() == [11, 12, 13] and updates["time"].tolist() == times
    assert updates["loss_mean"].tolist() == [0.5, 0.25, 0.125]  # the first stat is the loss
    assert (updates["lr"] == np.float32(1e-3)).all() and (updates["num_gradients"] == 1).all()
    episodes = read_table(h5, "episodes")
    # step 0 ends in the window's first iteration, step 9 in its third
    assert episodes["policy_version"].tolist() == [10, 12] and episodes["time"].tolist() == [1.0, 3.0]
    assert episodes["env_steps"].tolist() == [(10 * T + 1) * N, (10 * T + 10) * N]
    rounds = read_table(h5, "rounds")
    assert (rounds["round"][0], rounds["env_steps"][0], rounds["env_steps_total"][0]) == (2, 3 * T * N, 13 * T * N)
    assert (rounds["episodes"][0], rounds["updates"][0], rounds["reward_max"][0]) == (2, 3, 5.0)
    assert rounds["loss"][0] == pytest.approx(0.875 / 3)
    # what only the roles measure stays empty
    assert math.isnan(rounds["staleness_mean"][0]) and math.isnan(rounds["learner_seconds"][0])
    assert rounds["active_actors"][0] == -1 and rounds["active_groups"][0] == -1
    assert read_attrs(h5)["fused"] and read_table(h5, "rank_map")["role"].tolist() == [0]


def test_a_window_without_episodes_leaves_the_round_rewards_empty_and_the_summary_counts_every_iteration(tmp_path):
    record = fused_record(tmp_path)
    none = {"row": np.zeros(0, int), "env_index": np.zeros(0, int), "return": np.zeros(0, np.float32),
            "length": np.zeros(0, int)}
    record.iterations(0, [0.5], {"loss": np.array([1.0], np.float32)}, none, 8, 4, lr=0.1, round_index=0)
    record.end_round(0, consumed=32)
    stats = record.stats(32, 1000, 1, 1, 1, 0, 2.0)
    summary = record.summary(stats, "stop.x", tmp_path, device="cpu")
    record.close()
    assert len(read_table(tmp_path / "run.h5", "episodes")["return"]) == 0
    assert math.isnan(read_table(tmp_path / "run.h5", "rounds")["reward_mean"][0])
    assert (summary["gradients"], summary["admitted"], summary["episodes"], summary["device"]) == (1, 1, 0, "cpu")
    assert summary["files"] == {"record": str(tmp_path / "run.h5"), "config": str(tmp_path / "config.yaml")}
    assert summary["return_window"] == 3 and summary["stop_reason"] == "stop.x"


def test_group_events_are_written_with_the_schemas_codes(tmp_path):
    record = fused_record(tmp_path)
    record.group_event(1, "activate", "policies_split", 2)
    record.group_event(1, "park", ELASTIC_REASONS[0], 1, supply=10.0, capacity=5.0, load=2.0, waiting=3)
    record.close()
    rows = read_table(tmp_path / "run.h5", "elastic_events")
    assert [ELASTIC_ACTIONS[a] for a in rows["action"]] == ["activate", "park"]
    assert ELASTIC_REASONS[rows["reason"][0]] == "policies_split" and rows["active_groups"].tolist() == [2, 1]
    assert math.isnan(rows["supply_rate"][0]) and rows["fragments_waiting"].tolist() == [-1, 3]
