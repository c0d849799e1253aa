"""Where the live scalars go: one :class:`Logger` per tracker in ``io.loggers``, the same scalars to each.

:class:`~hpcrl.runtime.record.scalars.LiveScalars` decides what to write and when; a logger only writes it:
``scalars(step, values)`` (x = env steps; every value finite), ``flush()`` before a checkpoint, ``close()``.
The backends, each imported when the parameter rank (or the fused loop) opens it, by no other rank:

    tensorboard   event files in RUN_DIR/tensorboard/, through tensorboard's own writer thread
    wandb         a W&B run in RUN_DIR/wandb/, offline unless WANDB_MODE says otherwise (`wandb sync` uploads it)
    mlflow        an MLflow run, experiment = the config's name, in the file store RUN_DIR/mlruns/ unless
                  MLFLOW_TRACKING_URI names another store or server

Nothing leaves the machine unless the user asks for it in the environment: W&B runs offline without WANDB_MODE
(and online without an API key it says so and stays offline: it never prompts for a login), MLflow writes its file
store without MLFLOW_TRACKING_URI, and MLflow's usage telemetry is off (MLFLOW_DISABLE_TELEMETRY=true unless set).

Measured per write of 35 scalars (2 shared cores): tensorboard 0.15 ms of the loop (queueing the event;
its writer thread frames it), wandb 1.2 ms (0.4 ms of CPU: wandb-core, a process of its own, writes the run's
.wandb file), mlflow's file store 5.5 ms (a file append per scalar), so at two writes a second at most about
1% of a core; opening one takes wandb about 1.5 s (its import and wandb-core's start), mlflow about 1.6 s
(its import), once per job.

Resume: the TensorBoard file of the resumed job starts one step past the checkpoint, so TensorBoard drops
the earlier points the resume redoes; the W&B run (the id of the newest run folder in RUN_DIR/wandb/,
``resume="allow"``: offline, a second folder with that id) and the MLflow run (found by its
``hpcrl.run_dir`` tag) go on, and they keep the redone points twice.
"""
from __future__ import annotations

import inspect
import os
import re
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Mapping, Protocol, Sequence, runtime_checkable

from hpcrl.runtime.clock import WALL, Clock

TENSORBOARD_DIR = "tensorboard"
"""The event files' folder in the run directory (``tensorboard --logdir RUN_DIR/tensorboard``)."""
WANDB_DIR = "wandb"
"""The W&B run folders' folder in the run directory (wandb.init's ``dir`` is the run directory)."""
MLFLOW_DIR = "mlruns"
"""The MLflow file store in the run directory (without MLFLOW_TRACKING_URI)."""
MLFLOW_RUN_TAG = "hpcrl.run_dir"
"""The MLflow run's tag holding the run directory: a resumed job finds its run by it."""

PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow-skinny")}
"""io.loggers name -> (the module it imports, the pip package that installs it)."""


@runtime_checkable
class Logger(Protocol):
    """One tracker: writes scalars at env steps, flushes, closes."""

    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class TensorBoardLogger:
    """One event file; :meth:`scalars` queues an event, tensorboard's writer thread writes it (and flushes the
    file every ``flush_seconds``). ``resume_step``: a resumed job's env steps at its checkpoint."""

    def __init__(self, folder: Path, flush_seconds: float, resume_step: int | None = None, clock: Clock = WALL) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self.clock = Event, clock
        self.folder = Path(folder)
        self._writer = EventFileWriter(str(self.folder), max_queue_size=64, flush_secs=flush_seconds)
        if resume_step is not None:
            self._writer.add_event(Event(wall_time=clock.unix(), step=int(resume_step) + 1,
                                         session_log=SessionLog(status=SessionLog.START)))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """One ``Event`` at env step ``step`` holding each value as a ``Summary.Value`` (what
        ``torch.utils.tensorboard.SummaryWriter.add_scalar`` writes, one per event)."""
        event = self._event(wall_time=self.clock.unix(), step=int(step))
        add = event.summary.value.add  # in place: Summary(value=[Summary.Value(...)]) copies, 2.5x the time
        for tag, v in values.items():
            add(tag=tag, simple_value=v)
        self._writer.add_event(event)

    def flush(self) -> None:
        """Everything queued so far on disk (waits for the writer thread)."""
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """A W&B run named after the run directory, in the project named by the config (or WANDB_PROJECT); each
    scalar is plotted over ``env_steps``, logged with it."""

    def __init__(self, run_dir: Path, name: str, resume: bool = False) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE") or "offline"
        if mode in ("online", "run") and not _wandb_has_key(wandb):
            print("hpcrl: io.loggers: wandb: WANDB_MODE=online but no W&B API key (WANDB_API_KEY or `wandb login`); "
                  f"the run is kept offline in {run_dir / WANDB_DIR}", file=sys.stderr, flush=True)
            mode = "offline"
        run_id = wandb_run_id(run_dir) if resume else None
        (run_dir / WANDB_DIR).mkdir(parents=True, exist_ok=True)
        # console off: wandb would wrap this process's stdout and stderr (the progress line, MPI's output);
        # stats off: no system-metrics sampling beside the parameter rank's loop; silent: hpcrl run says where it is
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT") or name, name=run_dir.name, dir=str(run_dir),
                               mode=mode, id=run_id, resume="allow" if run_id else None,
                               settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
        self._defined: set[str] = set()

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag in values.keys() - self._defined:  # env steps, not wandb's own log count, as each tag's x
            self._run.define_metric(tag, step_metric="env_steps")
            self._defined.add(tag)
        self._run.log({"env_steps": int(step), **values})

    def flush(self) -> None:
        """Nothing: wandb-core writes the run's file itself."""

    def close(self) -> None:
        self._run.finish()


class MLflowLogger:
    """An MLflow run named after the run directory, in the experiment named by the config; each write is one
    ``log_batch`` of metrics at step = env steps."""

    def __init__(self, run_dir: Path, name: str, resume: bool = False, clock: Clock = WALL) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # read when mlflow is imported
        uri = mlflow_uri(run_dir)
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store without it
        from mlflow import MlflowClient
        from mlflow.entities import Metric, RunStatus
        from mlflow.exceptions import MlflowException

        self._metric, self.clock = Metric, clock
        self._client = client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(name)
        try:
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        except MlflowException:  # another run made it in between
            experiment_id = client.get_experiment_by_name(name).experiment_id
        here = str(Path(run_dir).resolve())
        found = client.search_runs([experiment_id], f"tags.`{MLFLOW_RUN_TAG}` = '{here}'", max_results=1) \
            if resume else []
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        else:
            self.run_id = client.create_run(experiment_id, run_name=Path(run_dir).name,
                                            tags={MLFLOW_RUN_TAG: here}).info.run_id

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        ms = int(self.clock.unix() * 1000)
        self._client.log_batch(self.run_id, metrics=[self._metric(tag, float(v), ms, int(step))
                                                     for tag, v in values.items()])

    def flush(self) -> None:
        """Nothing: each write is on disk (or on the server) when log_batch returns."""

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def _wandb_has_key(wandb) -> bool:
    """Whether W&B finds credentials without a prompt (WANDB_API_KEY, netrc, ...); before wandb 0.30, which cannot
    look without prompting, whether WANDB_API_KEY is set."""
    if "prompt" in inspect.signature(wandb.login).parameters:
        return wandb.login(prompt=False, verify=False)
    return bool(os.environ.get("WANDB_API_KEY"))


def wandb_run_id(run_dir: Path) -> str | None:
    """The id of the newest W&B run folder in ``run_dir/wandb`` (``offline-run-DATE_TIME-ID`` or
    ``run-DATE_TIME-ID``, ``-N`` added to a second folder of one id in the same second), or None."""
    folders = (re.fullmatch(r"(?:offline-)?run-(\d{8}_\d{6})-([a-z0-9]+)(?:-(\d+))?", p.name)
               for p in (run_dir / WANDB_DIR).glob("*"))
    runs = [m for m in folders if m]
    return max(runs, key=lambda m: (m.group(1), int(m.group(3) or 0))).group(2) if runs else None


def mlflow_uri(run_dir: Path) -> str:
    """MLFLOW_TRACKING_URI, or the file store in ``run_dir/mlruns`` as a file URI."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (Path(run_dir).resolve() / MLFLOW_DIR).as_uri()


def missing_package(loggers: Sequence[str]) -> str | None:
    """One line naming the pip package of the first logger whose module is not installed, or None."""
    for name in loggers:
        module, package = PACKAGES[name]
        try:
            installed = find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or sys.modules[module] set to None
            installed = False
        if not installed:
            extra = "" if name == "tensorboard" else " (or pip install 'hpcrl[trackers]')"
            drop = "set io.tensorboard=false" if name == "tensorboard" else f"remove {name} from io.loggers"
            return f"io.loggers: {name} needs the {package} package: pip install {package}{extra}, or {drop}"
    return None


def describe(name: str, run_dir: Path, run_name: str) -> str:
    """Where logger ``name`` writes and how to look (``hpcrl run``'s start line)."""
    run_dir = Path(run_dir)
    if name == "tensorboard":
        return f"tensorboard --logdir {run_dir / TENSORBOARD_DIR}"
    if name == "wandb":
        mode = os.environ.get("WANDB_MODE") or "offline"
        if mode == "offline":
            return f"W&B offline run in {run_dir / WANDB_DIR} (upload: wandb sync {run_dir / WANDB_DIR}/offline-run-*)"
        return f"W&B run (WANDB_MODE={mode}), its files in {run_dir / WANDB_DIR}"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return f"MLflow experiment {run_name} at {mlflow_uri(run_dir)}"
    return (f"MLflow experiment {run_name} in {run_dir / MLFLOW_DIR} "
            f"(MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {run_dir / MLFLOW_DIR})")


def open_loggers(run_dir: Path, io, name: str, resume_step: int | None = None, clock: Clock = WALL) -> list[Logger]:
    """The loggers of ``io.loggers`` (``io``: the config's io section; ``name``: the config's name). One that
    cannot start (its package missing on this rank, its server refusing) is left out after one line on stderr:
    the run goes on, run.h5 holds every number."""
    run_dir, resume = Path(run_dir), resume_step is not None
    out: list[Logger] = []
    for logger in io.loggers:
        try:
            if logger == "tensorboard":
                out.append(TensorBoardLogger(run_dir / TENSORBOARD_DIR, io.flush_seconds, resume_step, clock))
            elif logger == "wandb":
                out.append(WandbLogger(run_dir, name, resume))
            else:
                out.append(MLflowLogger(run_dir, name, resume, clock))
        except Exception as exc:  # a tracker's own errors (wandb.Error, MlflowException, ...): the run goes on
            why = missing_package([logger]) if isinstance(exc, ImportError) else None
            print(f"hpcrl: {why or f'io.loggers: {logger}: {type(exc).__name__}: {exc}'}; no live scalars to it",
                  file=sys.stderr, flush=True)
    return out
