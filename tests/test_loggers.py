"""io.loggers (issue 41 item 6): the live scalars go to TensorBoard, W&B (offline) and MLflow (its file store)
alike, each read back with the tracker's own reader; a tracker whose package is missing is one line before
anything starts; io.tensorboard, the older switch, still removes (or adds) TensorBoard. Nothing here leaves the
machine: W&B runs offline (one test without WANDB_MODE, its server an unused local port), MLflow writes files."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from hpcrl.cli import main as cli_main
from hpcrl.commands.run import check_resume_changes
from hpcrl.config import ConfigError, build_config
from hpcrl.io import read_table
from hpcrl.runtime.messages import EvalEpisode, Evaluation
from hpcrl.runtime.record import scalars
from hpcrl.runtime.record.loggers import MLFLOW_DIR, TENSORBOARD_DIR, WANDB_DIR, open_loggers
from hpcrl.runtime.record.run_record import RunRecord
from hpcrl.runtime.record.stop_rule import StopRule
from hpcrl.runtime.topology import one_process_rank_map

sys.path.insert(0, str(Path(__file__).parent))
from test_runtime_serial import tiny  # noqa: E402  (the serial runner's tiny config)
from test_tensorboard import STOP, read_scalars, window  # noqa: E402  (TensorBoard's reader, a fused-loop window)

ALL = ["tensorboard", "wandb", "mlflow"]


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    """W&B offline, its settings and caches under tmp_path; MLflow's file store, no telemetry."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_PROJECT", "WANDB_API_KEY", "WANDB_BASE_URL", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the logger sets it; put back after the test


def trackers():
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")


def wandb_points(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the W&B run folders in ``run_dir/wandb`` (oldest first): [(env_steps, value), ...], read from
    their .wandb files: wandb's transaction log, a 7-byte header, then LevelDB log records (32 KiB blocks, a 7-byte
    header per fragment: CRC, length, type), each record a protobuf ``wandb_internal.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((run_dir / WANDB_DIR).glob("*run-*/run-*.wandb")):
        data, pos, part = path.read_bytes(), 7, b""
        while pos + 7 <= len(data):
            room = 32768 - pos % 32768
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            if room < 7 or kind == 0:  # the block's zero padding
                pos += room
                continue
            part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # FULL or LAST: a whole record
                record, part = pb.Record.FromString(part), b""
                if record.WhichOneof("record_type") == "history":
                    row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                           for item in record.history.item}
                    for tag, value in row.items():
                        if not tag.startswith("_") and tag != "env_steps":
                            out.setdefault(tag, []).append((row["env_steps"], value))
    return out


def mlflow_points(run_dir: Path, experiment: str):
    """The one MLflow run of ``experiment`` in ``run_dir/mlruns`` and its scalars: [(step, value), ...]."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / MLFLOW_DIR).resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run, {tag: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag)]
                 for tag in run.data.metrics}


def assert_same(got: dict, want: dict) -> None:
    """The same tags at the same steps with the same values (TensorBoard keeps float32)."""
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag


def test_every_logger_gets_the_same_scalars_at_the_same_env_steps(tmp_path, monkeypatch):
    trackers()
    monkeypatch.setattr(scalars, "WRITE_SECONDS", 0.0)  # every round its own write
    io = SimpleNamespace(compression="gzip", flush_seconds=5.0, loggers=ALL)
    rec = RunRecord.create(tmp_path, io, "name: tiny\n", one_process_rank_map(), StopRule(STOP),
                           {"runner": "serial", "fused": True}, name="tiny")
    window(rec, 0, [1.0, 3.0], [10.0, 20.0], 0)
    window(rec, 2, [5.0], [], 1)  # no episodes: its returns are left out everywhere
    rec.evaluation(Evaluation(time=rec.file.start_unix, round=2, policy_version=3,
                              episodes=(EvalEpisode(0, 7.0, 7), EvalEpisode(1, 9.0, 9))))
    rec.close()
    tb = read_scalars(tmp_path / TENSORBOARD_DIR)
    assert tb["train/loss"] == [(16, 2.0), (24, 5.0)] and tb["episode/return_mean"] == [(16, 15.0)]
    assert tb["eval/return_mean"] == [(24, 8.0)]
    assert_same(wandb_points(tmp_path), tb)
    run, points = mlflow_points(tmp_path, "tiny")
    assert_same(points, tb)
    assert run.info.run_name == tmp_path.name and run.info.status == "FINISHED"


def test_a_resumed_job_goes_on_in_the_same_wandb_and_mlflow_runs_and_wandb_is_offline_by_default(tmp_path,
                                                                                                 monkeypatch, capsys):
    trackers()
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # were it online, nothing would answer
    io = SimpleNamespace(flush_seconds=5.0, loggers=["wandb", "mlflow"])
    for resume_step, steps in ((None, (100, 200)), (150, (250,))):  # the checkpoint at 150; 200 is redone
        live = scalars.LiveScalars(open_loggers(tmp_path, io, "tiny", resume_step), resume_step or 0)
        assert len(live.loggers) == 2, capsys.readouterr().err
        for step in steps:
            live.step = step
            live.evaluation([{"return": step / 10, "length": 1}])
        live.close()
    folders = sorted(p.name for p in (tmp_path / WANDB_DIR).glob("*run-*"))
    assert len(folders) == 2 and all(f.startswith("offline-run-") for f in folders)
    assert len({f.split("-")[3] for f in folders}) == 1  # offline-run-DATE_TIME-ID[-N]: one W&B run id
    want = [(100, 10.0), (200, 20.0), (250, 25.0)]
    assert wandb_points(tmp_path)["eval/return_mean"] == want
    assert mlflow_points(tmp_path, "tiny")[1]["eval/return_mean"] == want  # the one run, found by its tag


@pytest.mark.slow
def test_a_serial_run_with_all_three_loggers_writes_the_same_scalars_to_each(tmp_path, capsys):
    trackers()
    run_dir = tmp_path / "run"
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny(run_dir, stop={"total_env_steps": 640, "target_return": None})))
    assert cli_main(["run", str(config), "-o", "io.loggers=[tensorboard,wandb,mlflow]"]) == 0
    out = capsys.readouterr().out
    assert f"hpcrl run: live scalars: tensorboard --logdir {run_dir / TENSORBOARD_DIR}\n" in out
    assert f"hpcrl run: live scalars: W&B offline run in {run_dir / WANDB_DIR}" in out
    assert f"hpcrl run: live scalars: MLflow experiment tiny in {run_dir / MLFLOW_DIR}" in out
    tb = read_scalars(run_dir / TENSORBOARD_DIR)
    assert tb["train/loss"][-1][0] == read_table(run_dir / "run.h5", "rounds")["env_steps_total"][-1]
    assert "gradients/admitted" in tb and "staleness/mean" in tb  # the roles' tags too
    assert_same(wandb_points(run_dir), tb)
    assert_same(mlflow_points(run_dir, "tiny")[1], tb)


@pytest.mark.parametrize("logger, package", [("wandb", "wandb"), ("mlflow", "mlflow-skinny")])
def test_a_missing_tracker_package_is_one_line_before_anything_starts(tmp_path, monkeypatch, capsys, logger,
                                                                      package):
    monkeypatch.setitem(sys.modules, logger, None)  # `import wandb` fails as if it were not installed
    run_dir = tmp_path / "run"
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny(run_dir)))
    assert cli_main(["run", str(config), "-o", f"io.loggers=[tensorboard,{logger}]"]) == 2
    err = capsys.readouterr().err
    assert err == (f"hpcrl run: error: io.loggers: {logger} needs the {package} package: pip install {package} "
                   f"(or pip install 'hpcrl[trackers]'), or remove {logger} from io.loggers\n")
    assert not run_dir.exists()
    # a rank whose environment lacks it (the check passed elsewhere) goes on with the other loggers
    opened = open_loggers(tmp_path, SimpleNamespace(flush_seconds=5.0, loggers=["tensorboard", logger]), "tiny")
    assert [type(x).__name__ for x in opened] == ["TensorBoardLogger"]
    assert capsys.readouterr().err == (f"hpcrl: io.loggers: {logger} needs the {package} package: pip install "
                                       f"{package} (or pip install 'hpcrl[trackers]'), or remove {logger} from "
                                       f"io.loggers; no live scalars to it\n")
    opened[0].close()


def test_io_tensorboard_removes_or_adds_tensorboard_and_config_yaml_keeps_io_loggers_alone():
    assert build_config({}).io.loggers == ["tensorboard"]
    assert build_config({}, ["io.tensorboard=false"]).io.loggers == []
    cfg = build_config({}, ["io.loggers=[tensorboard,wandb,mlflow]", "io.tensorboard=false"])
    assert cfg.io.loggers == ["wandb", "mlflow"] and cfg.io.tensorboard is False
    saved = yaml.safe_load(cfg.to_yaml())
    assert saved["io"]["loggers"] == ["wandb", "mlflow"] and "tensorboard" not in saved["io"]
    again = build_config(saved, ["io.tensorboard=true"])  # a resume's override on the saved config
    assert again.io.loggers == ["wandb", "mlflow", "tensorboard"] and again.io.tensorboard is True
    assert build_config({}, ["io.loggers=mlflow"]).io.loggers == ["mlflow"]
    check_resume_changes(build_config({}), again)  # a resumed run may change its trackers
    with pytest.raises(ConfigError, match=r"io.loggers: wandb appears twice"):
        build_config({}, ["io.loggers=[wandb,tensorboard,wandb]"])
    with pytest.raises(ConfigError, match=r"io.loggers.0: Input should be 'tensorboard', 'wandb' or 'mlflow'"):
        build_config({}, ["io.loggers=[comet]"])
