"""Live scalars (issue 27 item 1): the parameter rank's TensorBoard event files, read back with tensorboard's own
EventAccumulator; the progress line's stop-rule heading and ETA."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hpcrl.config import build_config
from hpcrl.io import read_table
from hpcrl.runtime.messages import EvalEpisode, Evaluation
from hpcrl.runtime.plan import make_plan
from hpcrl.runtime.record import scalars
from hpcrl.runtime.record.loggers import TENSORBOARD_DIR, TensorBoardLogger
from hpcrl.runtime.record.progress import ReturnTrend, format_line
from hpcrl.runtime.record.run_record import RunRecord
from hpcrl.runtime.record.stop_rule import StopRule
from hpcrl.runtime.runners import serial
from hpcrl.runtime.topology import one_process_rank_map

sys.path.insert(0, str(Path(__file__).parent))
from test_runtime_serial import tiny  # noqa: E402  (the serial runner's tiny config)

CARTPOLE_HA2C = Path(__file__).resolve().parents[1] / "hpcrl" / "configs" / "cartpole_ha2c.yaml"
STOP = SimpleNamespace(total_env_steps=10**6, target_return=None, return_window=3, max_wall_seconds=None,
                       max_rounds=None)


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the event files in ``folder``: [(step, value), ...], as TensorBoard loads them."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={SCALARS: 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def record(run_dir: Path, tensorboard: bool = True) -> RunRecord:
    io = SimpleNamespace(compression="gzip", flush_seconds=5.0, loggers=["tensorboard"] if tensorboard else [])
    return RunRecord.create(run_dir, io, "name: t\n", one_process_rank_map(), StopRule(STOP),
                            {"runner": "serial", "fused": True})


def window(rec: RunRecord, first: int, losses, returns, round_index: int, T: int = 4, N: int = 2) -> None:
    """A fused-loop window of len(losses) iterations whose first row's episodes end with ``returns``."""
    k = len(returns)
    ended = {"row": np.zeros(k, int), "env_index": np.arange(k), "return": np.asarray(returns, np.float32),
             "length": np.asarray(returns, int)}
    rec.iterations(first, [1.0] * len(losses), {"loss": np.asarray(losses, np.float32)}, ended, T, N, lr=0.1,
                   round_index=round_index)
    rec.end_round(round_index, consumed=(first + len(losses)) * T * N)


def test_rounds_within_half_a_second_are_one_event_over_all_their_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(scalars, "WRITE_SECONDS", 3600.0)  # nothing written before close
    rec = record(tmp_path)
    window(rec, 0, [1.0, 3.0], [10.0, 20.0], 0)
    window(rec, 2, [5.0], [60.0], 1)
    rec.evaluation(Evaluation(time=rec.file.start_unix, round=2, policy_version=3,
                              episodes=(EvalEpisode(0, 7.0, 7), EvalEpisode(1, 9.0, 9))))
    rec.close()
    got = read_scalars(tmp_path / TENSORBOARD_DIR)
    assert got["episode/return_mean"] == [(24, 30.0)]  # one event at the last round's env steps: 3 x 4 x 2
    assert got["episode/return_max"] == [(24, 60.0)] and got["episode/count"] == [(24, 3.0)]
    assert got["train/loss"] == [(24, 3.0)]  # over the three iterations, not the mean of the rounds' means
    assert got["episode/return_window"] == [(24, 30.0)]  # the stop rule's window (3 episodes)
    assert got["eval/return_mean"] == [(24, 8.0)] and got["eval/length_mean"] == [(24, 8.0)]
    assert "staleness/mean" not in got and "gradients/admitted" not in got  # the fused loop has none
    rounds = read_table(tmp_path / "run.h5", "rounds")
    steps_per_second = rounds["env_steps"].sum() / rounds["duration"].sum()
    assert got["throughput/env_steps_per_second"][0][1] == pytest.approx(steps_per_second, rel=1e-5)


def test_a_round_without_episodes_leaves_its_returns_out_and_no_tensorboard_logger_writes_no_folder(tmp_path,
                                                                                                     monkeypatch):
    monkeypatch.setattr(scalars, "WRITE_SECONDS", 0.0)  # every round its own event
    rec = record(tmp_path / "on")
    window(rec, 0, [1.0], [], 0)
    window(rec, 1, [2.0], [5.0], 1)
    rec.close()
    got = read_scalars(tmp_path / "on" / TENSORBOARD_DIR)
    assert got["train/loss"] == [(8, 1.0), (16, 2.0)] and got["episode/return_mean"] == [(16, 5.0)]
    rec = record(tmp_path / "off", tensorboard=False)
    window(rec, 0, [1.0], [5.0], 0)
    rec.close()
    assert rec.scalars is None and not (tmp_path / "off" / TENSORBOARD_DIR).exists()


def test_a_resumed_run_starts_a_new_event_file_that_drops_the_points_past_its_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(scalars, "WRITE_SECONDS", 0.0)
    folder = tmp_path / TENSORBOARD_DIR
    first = TensorBoardLogger(folder, 5.0)
    for step in (100, 200, 300):  # the checkpoint was at 150; 200 and 300 are redone by the resumed job
        first.scalars(step, {"train/loss": step / 100})
    first.close()
    # a resumed job is a later process; in this one, a file named within the same second would sort by tensorboard's
    # per-process file counter as text ('10' before '9'), and then load before the first job's
    time.sleep(1.01 - time.time() % 1)
    resumed = TensorBoardLogger(folder, 5.0, resume_step=150)
    resumed.scalars(250, {"train/loss": 9.0})
    resumed.close()
    assert len(list(folder.iterdir())) == 2
    assert read_scalars(folder) == {"train/loss": [(100, 1.0), (250, 9.0)]}


def test_progress_line_shows_the_stop_rule_it_heads_to_and_the_eta_of_its_step_budget():
    stats = {"env_steps": 100_000, "total_steps": 300_000, "elapsed": 60.0, "episodes": 10, "mean_return": 200.0,
             "version": 5, "staleness": 0.5, "active_groups": 1, "groups": 1, "round": 4, "target_return": 475.0,
             "max_wall_seconds": None, "max_rounds": None}
    line = format_line(stats, target_eta=750.0)
    assert "return 200.0 -> 475 in 12:30" in line and line.endswith("ETA 02:00"), line  # 200,000 more at 1,667/s
    assert "-> 475 in -" in format_line(stats)  # no trend yet
    assert format_line({**stats, "max_wall_seconds": 90.0}).endswith("ETA 00:30 wall")  # the wall limit first
    assert format_line({**stats, "target_return": None, "env_steps": 1000}).endswith("ETA 4:59:00")
    assert "->" not in format_line({**stats, "target_return": None})
    assert format_line({**stats, "env_steps": 0}).endswith("ETA -")  # no rate yet


def test_progress_line_fits_80_columns_leaving_out_the_least_needed_numbers_first():
    huge = {"env_steps": 123_456_789_012, "total_steps": 999_999_999_999, "elapsed": 9_999_999.9, "episodes": 98_765_432,
            "mean_return": -123_456.7, "version": 12_345_678, "staleness": 1234.5, "active_groups": 2000,
            "groups": 2000, "round": 9_876_543, "target_return": 1_000_000.0, "max_wall_seconds": None,
            "max_rounds": 99_999_999}
    small = {**huge, "env_steps": 4000, "total_steps": 50_000, "elapsed": 12.5, "episodes": 40, "mean_return": 21.5,
             "version": 8, "staleness": 0.25, "active_groups": 1, "groups": 1, "round": 2, "target_return": None,
             "max_rounds": None}
    assert len(format_line(small)) <= 80 and "ep 40" in format_line(small)  # room for everything
    assert "learners" not in format_line(small) and "round" not in format_line(small)  # one group, no round limit
    wide = format_line({**small, "groups": 2, "max_rounds": 9}, width=120)
    assert "learners 1/2" in wide and "round 2" in wide
    line = format_line(huge, target_eta=5e6)
    assert len(line) <= 80, (len(line), line)
    assert line.startswith("[9999999.9 s] steps 123.5G (12%)") and "-> 1e+06 in 57.9d" in line
    assert "round" not in line and " ep " not in line  # the least needed numbers went first
    assert line.endswith("ETA 821.8d")  # (999,999,999,999 - 123,456,789,012) steps at 12,346 per s
    assert format_line(huge, width=200).count("  ") > line.count("  ")  # a wide line keeps them


def test_the_target_eta_follows_the_recent_trend_of_the_return():
    trend = ReturnTrend()
    assert trend.seconds_to(100.0) is None
    for t, r in [(10, 0.0), (20, 5.0), (30, 30.0), (40, 40.0), (50, 50.0), (60, 60.0)]:  # 1 return/s from t=30
        trend.add({"elapsed": t, "mean_return": r})
    assert trend.seconds_to(100.0) == pytest.approx(40.0)  # the early points (before half the run) left out
    assert trend.seconds_to(50.0) == 0.0  # reached
    trend.add({"elapsed": 70, "mean_return": float("nan")})  # no episode yet: nothing learnt from it
    falling = ReturnTrend()
    for t, r in [(10, 50.0), (20, 40.0), (30, 30.0)]:
        falling.add({"elapsed": t, "mean_return": r})
    assert falling.seconds_to(100.0) is None


def test_a_plain_view_prints_lines_with_the_target_eta_of_the_records_it_saw():
    import io

    from hpcrl import verbosity
    from hpcrl.runtime.record.progress import ProgressView

    out = io.StringIO()
    view = ProgressView(tty=False, log_seconds=0.0, stream=out)
    old = verbosity.level()
    verbosity.set_level(verbosity.NORMAL)
    try:
        for t in (10, 20, 30, 40):
            view.update({"env_steps": t * 100, "total_steps": 100_000, "elapsed": float(t), "mean_return": 2.0 * t,
                         "target_return": 480.0, "episodes": t, "version": t, "staleness": 0.0, "active_groups": 1,
                         "groups": 1, "round": 1, "max_wall_seconds": None, "max_rounds": None})
    finally:
        verbosity.set_level(old)
    lines = out.getvalue().splitlines()
    assert "-> 480 in -" in lines[0] and "-> 480 in 03:20" in lines[-1], lines  # 400 more at 2 per s
    assert all(len(x) <= 80 for x in lines)


@pytest.mark.slow
def test_a_serial_run_writes_scalars_tensorboard_reads_back(tmp_path):
    run_dir = tmp_path / "run"
    cfg = build_config(tiny(run_dir, stop={"total_env_steps": 1500, "target_return": 400}))
    result = serial.run(make_plan(cfg), run_dir, progress="plain")
    assert cfg.io.loggers == ["tensorboard"] and result.stop_reason.startswith("stop.total_env_steps")
    got = read_scalars(run_dir / TENSORBOARD_DIR)
    for tag in ("episode/return_mean", "episode/length_mean", "throughput/env_steps_per_second", "train/loss",
                "train/kl", "staleness/mean", "gradients/admitted", "gradients/queued", "learners/active_groups",
                "learner_cycle/gradient_seconds"):
        assert got.get(tag), tag
    h5 = run_dir / "run.h5"
    rounds, grads = read_table(h5, "rounds"), read_table(h5, "gradients")
    steps = [s for s, _ in got["train/loss"]]
    assert steps == sorted(steps) and steps[-1] == rounds["env_steps_total"][-1]  # x: env steps, every round written
    assert len(steps) <= len(rounds["round"])  # never more than one event a round
    # every gradient admitted in an ended round is counted once in gradients/admitted
    ended = (grads["admitted"] == 1) & (grads["round"] < len(rounds["round"]))
    assert sum(v for _, v in got["gradients/admitted"]) == ended.sum()
    assert all(v >= 0 for _, v in got["staleness/mean"])
    # the last point holds the round the run stopped in: the summary's return and env steps
    last_step, last_window = got["episode/return_window"][-1]
    assert last_window == pytest.approx(result.summary["mean_return"]) and last_step == result.summary["env_steps"]


@pytest.mark.slow
def test_the_fused_loop_writes_scalars_and_hpcrl_run_prints_the_tensorboard_line(tmp_path, capsys):
    from hpcrl.cli import main as cli_main

    run_dir = tmp_path / "fused"
    rc = cli_main(["run", str(CARTPOLE_HA2C), "-o", "env.num_envs=16", "-o", "stop.total_env_steps=2560",
                   "-o", "stop.target_return=null", "-o", f"io.run_dir={run_dir}"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"hpcrl run: live scalars: tensorboard --logdir {run_dir / TENSORBOARD_DIR}\n" in out
    got = read_scalars(run_dir / TENSORBOARD_DIR)
    for tag in ("episode/return_mean", "throughput/env_steps_per_second", "train/loss", "train/entropy"):
        assert got.get(tag), tag
    assert got["train/loss"][-1][0] == 2560  # 20 iterations of 16 x 8 steps
    assert "staleness/mean" not in got
