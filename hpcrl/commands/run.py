"""`hpcrl run [CONFIG] [-o KEY=VALUE ...] [--runner mpi|serial] [--resume RUN_DIR] [--inside-mpi] [--ranks N]`.

Without ``--inside-mpi`` this process is the launcher: it resolves and validates the whole
config (nothing is written when anything is wrong) and creates the run directory with the
resolved ``config.yaml``. Under ``launch.runner: mpi`` it starts ``mpiexec`` with the right
number of ranks, shows progress, forwards SIGINT/SIGTERM/SIGUSR1 as a graceful stop (the
parameter rank checkpoints) and enforces ``launch.timeout_seconds``; under ``serial`` it runs
every role in this process (:func:`hpcrl.runtime.runners.serial.run_serial`, same record). With
``--inside-mpi``, or when the process is already one rank of a multi-rank job (srun, PBS
mpiexec), it runs its role.

The single-process algorithms (algo.name ha2c, hddpg: batched envs on one device) need no
MPI: the same run directory is created and :func:`hpcrl.runtime.runners.fused.run_batched` trains in
this process; they have no checkpoints, so ``--resume`` and ``--ranks`` are refused.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hpcrl import launch
from hpcrl.runtime.plan import fuses, why_not_fused
from hpcrl.config import RunConfig, load_config
from hpcrl.errors import ConfigError
from hpcrl.io.run_lock import RunLock
from hpcrl.runtime.runners.prestart import PrestartServer
from hpcrl.runtime.signals import (EXIT_FAILED, EXIT_FINISHED, EXIT_STOPPED, EXIT_TIMEOUT, early_signal,
                                   remember_stop_signals)
from hpcrl.runtime.runners.startup import process_start_unix, record_startup

CONFIG_FILE = "config.yaml"
GRACE_SECONDS = 60.0
"""After a graceful stop request, how long the job may take to checkpoint before it is killed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config (default: hpcrl/configs/cartpole.yaml, CartPole-v1 on 4 ranks)")
    parser.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value, e.g. -o aggregation.d=0.9 (repeatable)")
    parser.add_argument("--runner", choices=("mpi", "serial"),
                        help="where the roles run (sets launch.runner): MPI ranks, or all in this process")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    parser.add_argument("--ranks", type=int, metavar="N",
                        help="total MPI ranks; the ranks beyond the parameter and learner ranks become actors")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="start more local ranks than launch.ranks_per_core x the cores allow")
    parser.add_argument("--inside-mpi", action="store_true",
                        help="this process is already one rank of the job (srun / PBS mpiexec): run its role")


def resolve_config(args: argparse.Namespace, ranks_from: str = "--ranks") -> tuple[RunConfig, Path | None]:
    """The validated config and, for --resume, the existing run directory. Writes nothing."""
    run_dir = None
    if args.resume:
        if args.config:
            raise ConfigError("--resume RUN_DIR takes the config from RUN_DIR; do not also name CONFIG")
        run_dir = Path(args.resume).resolve()
        if not (run_dir / CONFIG_FILE).is_file():
            raise ConfigError(f"--resume: {args.resume!r} is not a run directory (no {CONFIG_FILE})")
    overrides = [*args.overrides, *([f"launch.runner={args.runner}"] if getattr(args, "runner", None) else [])]
    args = argparse.Namespace(**{**vars(args), "overrides": overrides})
    cfg = load_config(run_dir / CONFIG_FILE if run_dir else args.config, args.overrides)
    if fuses(cfg):
        flag = "--resume" if args.resume else "--ranks" if args.ranks is not None else None
        if flag:
            raise ConfigError(f"{flag}: not supported by the fused loop (algo.name={cfg.algo.name} on a batched env "
                              "with one actor and one learner group runs in this process, no checkpoints)")
        validate(cfg)
        return cfg, None
    if run_dir is not None:
        from hpcrl.runtime.record.checkpoint import checkpoint_path, has_checkpoint

        if not has_checkpoint(run_dir):
            raise ConfigError(f"--resume: {args.resume!r} has no checkpoint ({checkpoint_path(run_dir)})")
    if args.ranks is not None:
        learner_ranks = cfg.learners.groups * cfg.learners.ranks_per_group
        actors = args.ranks - 1 - learner_ranks
        if actors < 1:
            raise ConfigError(
                f"{ranks_from} {args.ranks}: too few; this config needs 1 parameter + {learner_ranks} learner ranks "
                f"+ at least 1 actor = {learner_ranks + 2}")
        cfg = load_config(run_dir / CONFIG_FILE if run_dir else args.config,
                          [*args.overrides, f"actors.count={actors}"])
    if run_dir is not None:
        check_resume_changes(load_config(run_dir / CONFIG_FILE), cfg)
    validate(cfg)
    return cfg, run_dir


RESUMABLE = ("stop.", "io.flush_seconds", "io.checkpoint_every", "io.checkpoint_min_seconds", "io.log_seconds",
             "launch.", "eval.", "debug.", "actors.count", "learners.elastic_headroom", "learners.elastic_seconds")
"""Settings a resumed run may change; every other one is part of the state the checkpoint holds."""


def check_resume_changes(before: RunConfig, after: RunConfig) -> None:
    """ConfigError naming the first changed setting that the checkpoint's state depends on."""
    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) and k != "kwargs" else {f"{prefix}{k}": v})
        return out

    old, new = flat(before.model_dump(mode="json")), flat(after.model_dump(mode="json"))
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key) and not key.startswith(RESUMABLE):
            raise ConfigError(f"--resume: {key} would change from {old.get(key)!r} to {new.get(key)!r}, but the "
                              f"checkpoint was made with the first; a resumed run may change only "
                              f"{', '.join(k + '*' if k.endswith('.') else k for k in RESUMABLE)}")


def validate(cfg: RunConfig) -> None:
    """Checks that need more than the config schema: env id, rank plan, algorithm."""
    from hpcrl.envs import check_env_id
    from hpcrl.runtime.topology import plan_roles

    if fuses(cfg):
        from hpcrl.runtime.runners.fused import check_config

        check_config(cfg)
        return
    check_env_id(cfg.env.id)
    from hpcrl.runtime.roles.env_backends import env_kind

    # actors step every kind (gym; batched on the CPU; parallel, agents = instances). Building one env
    # (copy) checks the rest: batched kwargs, one space shared by all agents, rescalable actions.
    if env_kind(cfg.env.id) != "gym" or cfg.env.rescale_actions:
        from hpcrl.runtime.roles.sampler import describe_env

        info = describe_env(cfg.env)
        if getattr(cfg.algo, "agents", None) is not None:
            from hpcrl.marl.agents import check_agent_count

            check_agent_count(cfg, info)  # a wrong count that divides the real one would pass silently
    plan_roles(cfg.num_ranks, cfg.learners.groups, cfg.learners.ranks_per_group, cfg.actors.count)
    if cfg.learners.allreduce == "horovod":
        from hpcrl.runtime.transport.group_reduce import horovod_available

        if not horovod_available():
            raise ConfigError("learners.allreduce: horovod is not installed in this Python (docs/runtime.md shows "
                              "how to build it); allowed here: auto")
    if cfg.launch.container is not None:
        from hpcrl.launch_container import container_prefix

        container_prefix(cfg.launch.container)  # image and binds checked before the run directory exists
    if cfg.debug.raise_on_rank is not None and cfg.debug.raise_on_rank >= cfg.num_ranks:
        raise ConfigError(f"debug.raise_on_rank: {cfg.debug.raise_on_rank} is not a rank of a "
                          f"{cfg.num_ranks}-rank job (allowed: 0..{cfg.num_ranks - 1})")


def create_run_dir(cfg: RunConfig) -> Path:
    """Make the run directory (never reusing one) and write the resolved config.yaml."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.io.run_dir.format(name=cfg.name, time=stamp)).resolve()
    path, n = base, 1
    try:
        while True:
            try:
                path.mkdir(parents=True, exist_ok=False)
                break
            except FileExistsError:
                n += 1
                path = base.with_name(f"{base.name}-{n}")
        tmp = path / (CONFIG_FILE + ".tmp")
        tmp.write_text(cfg.to_yaml())
        os.replace(tmp, path / CONFIG_FILE)
    except OSError as exc:
        raise ConfigError(f"io.run_dir: cannot create {path} ({exc.strerror or exc}); "
                          "pick a writable place with -o io.run_dir=PATH") from None
    return path


def main(args: argparse.Namespace) -> int:
    remember_stop_signals()  # a cancel during start-up ends the run cleanly as a cancel
    inside = launch.job_rank(os.environ)
    if args.inside_mpi or inside is not None:
        from hpcrl.runtime.runners.mpi import start_inside_job

        if args.ranks is not None and inside is not None and inside[1] and inside[1] != args.ranks:
            raise ConfigError(f"--ranks {args.ranks}: this job has {inside[1]} ranks")
        cfg = resolve_config(args)[0]  # every mistake is reported before MPI starts
        if not cfg.uses_mpi:
            raise ConfigError("launch.runner=serial runs in one process, not as ranks of an MPI job; "
                              "start `hpcrl run CONFIG` once, without mpiexec, srun or --inside-mpi")

        def config_for(size: int) -> RunConfig:
            """The config for a job of ``size`` ranks: the ranks beyond parameter + learners are actors."""
            return resolve_config(argparse.Namespace(**{**vars(args), "ranks": size}), "MPI job size")[0]

        progress = "tty" if sys.stdout.isatty() else "plain"
        run_dir = Path(args.resume).resolve() if args.resume else None
        return start_inside_job(config_for, run_dir, resume=run_dir is not None,
                                make_run_dir=create_run_dir, progress=progress)
    command_unix = process_start_unix()
    # the ranks' libraries are imported by the prestart server while this process checks the config
    server = start_prestart() if args.runner != "serial" else None
    job_ran = False
    try:
        cfg, run_dir = resolve_config(args)
        check_local_machine(cfg, oversubscribe=args.oversubscribe)
        if server is not None and not uses_prestart(cfg):
            server.stop(wait=0)
            server = None
        if args.config is None and run_dir is None:
            print("hpcrl run: no CONFIG given: the default job, hpcrl/configs/cartpole.yaml", flush=True)
        if fuses(cfg):
            return run_in_process(cfg)
        if cfg.algo.fused_loop:  # never left silently: say why the roles run it
            print(f"hpcrl run: {cfg.algo.name} runs on the roles, not the fused loop: {why_not_fused(cfg)}", flush=True)
        mpiexec = launch.find_mpiexec(cfg.launch) if cfg.uses_mpi else None
        if run_dir is None:
            run_dir = create_run_dir(cfg)
        with RunLock(run_dir):  # one run or resume of a directory at a time
            if args.resume and (args.overrides or args.ranks is not None or args.runner):
                (run_dir / CONFIG_FILE).write_text(cfg.to_yaml())  # the resumed run continues with the new values
            if not cfg.uses_mpi:
                code = run_serial_here(cfg, run_dir, resume=args.resume is not None)
            else:
                cmd = launch.local_command(cfg.launch, cfg.num_ranks, run_dir, mpiexec=mpiexec,
                                           flavour=launch.mpi_flavour(mpiexec), resume=args.resume is not None,
                                           progress="pipe")
                code = supervise(cmd, cfg, run_dir, extra_env=server.environ if server else None)
            job_ran = True
            report_startup(run_dir, command_unix, show=code == EXIT_FINISHED)
            return code
    finally:
        if server is not None:  # after a job its children have ended; before one (a mistake) nothing waits
            server.stop(wait=10.0 if job_ran else 0.0)


def start_prestart() -> PrestartServer | None:
    """The prestart server for this run's ranks, or None when it cannot start (the ranks then import for themselves)."""
    try:
        return PrestartServer(launch.rank_environment(os.environ))
    except OSError as exc:
        print(f"hpcrl run: no prestart server ({exc}); every rank imports its libraries itself", file=sys.stderr)
        return None


def uses_prestart(cfg: RunConfig) -> bool:
    """True when the ranks of this local run are forked from a prestart server (hpcrl.runtime.runners.prestart)."""
    return cfg.uses_mpi and cfg.launch.prestart and cfg.launch.container is None and not fuses(cfg)


def report_startup(run_dir: Path, command_unix: float, show: bool = True) -> None:
    """Record the seconds from the command to the first environment step (run.h5 startup_seconds); print them
    when ``show`` (not after a failure, whose message stays the last line)."""
    seconds = record_startup(run_dir, command_unix)
    if seconds is not None and show:
        print(f"hpcrl run: first environment step {seconds:.2f} s after the command "
              "(run.h5 attribute startup_seconds)", flush=True)


def check_local_machine(cfg: RunConfig, oversubscribe: bool = False) -> None:
    """What a local launch needs of this machine: not too many ranks per core, a GPU if learners.device=cuda."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ranks = 1 if fuses(cfg) else cfg.num_ranks
    limit = cfg.launch.ranks_per_core * cores
    if ranks > limit and not oversubscribe:
        raise ConfigError(f"actors.count: {ranks} ranks on {cores} cores is more than launch.ranks_per_core="
                          f"{cfg.launch.ranks_per_core:g} per core ({limit:g}); use fewer actors, raise "
                          "launch.ranks_per_core, or pass --oversubscribe")
    if cfg.learners.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("learners.device: cuda, but torch sees no CUDA device on this machine; "
                              "allowed here: auto, cpu")


def run_in_process(cfg: RunConfig) -> int:
    """The fused loop (hpcrl.runtime.plan.fuses): train in this process with run_batched; progress and summary
    as for the roles.

    SIGTERM stops like Ctrl-C: run.h5 is closed with everything fetched so far (exit code 130).
    """
    from hpcrl.runtime.runners.fused import run_batched

    run_dir = create_run_dir(cfg)
    progress = "tty" if sys.stdout.isatty() else "plain"
    if progress == "plain":
        print(f"hpcrl run: {cfg.algo.name} on {cfg.env.num_envs} x {cfg.env.id} in this process "
              f"(launch.runner=serial, fused loop), run directory {run_dir}", flush=True)

    def stop(_signum, _frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        run_batched(cfg, run_dir, progress=progress)
    finally:
        signal.signal(signal.SIGTERM, old)
    return 0


def run_serial_here(cfg: RunConfig, run_dir: Path, resume: bool) -> int:
    """launch.runner=serial: every role in this process; a failed role is one line plus its traceback."""
    from hpcrl.runtime.runners.serial import RoleFailed, run_serial

    progress = "tty" if sys.stdout.isatty() else "plain"
    if progress == "plain":
        print(f"hpcrl run: {cfg.num_ranks} roles in this process (launch.runner=serial), run directory {run_dir}",
              flush=True)
    try:
        stop_reason = run_serial(cfg, run_dir, resume=resume, progress=progress)
    except RoleFailed as exc:
        print(exc.details, file=sys.stderr, end="")
        print(f"hpcrl run: {exc}; run directory {run_dir}", file=sys.stderr)
        return EXIT_FAILED
    if stop_reason.startswith("signal"):
        print(f"hpcrl run: stopped by {stop_reason.split()[-1]} with a checkpoint; go on with "
              f"`hpcrl run --resume {run_dir}`", file=sys.stderr)
        return EXIT_STOPPED
    return EXIT_FINISHED


def supervise(cmd: list[str], cfg: RunConfig, run_dir: Path, extra_env: dict[str, str] | None = None) -> int:
    """Run mpiexec, render its progress, forward stop signals, enforce the timeout."""
    from hpcrl.runtime.record.progress import ProgressView, parse_line

    view = ProgressView(log_seconds=cfg.io.log_seconds)
    if not view.tty:
        print(f"hpcrl run: {cfg.num_ranks} ranks, run directory {run_dir}", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**launch.rank_environment(os.environ), **(extra_env or {})}, start_new_session=True)
    # a stop signal is passed on once the ranks run (their first progress line): before that it would
    # kill ranks still starting; one that came before mpiexec was started waits the same way
    state = {"stop_requested_at": None, "killed": False, "timed_out": False, "stuck_starting": False,
             "pending": early_signal()}
    if state["pending"] is not None:
        state["stop_requested_at"] = time.monotonic()

    def graceful(signum, _frame):
        if state["stop_requested_at"] is not None and signum == signal.SIGINT:
            _kill(proc)  # second Ctrl-C: no more waiting
            state["killed"] = True
            return
        state["stop_requested_at"] = time.monotonic()
        # mpiexec (Hydra) forwards SIGTERM/SIGUSR1 to every rank; the parameter rank checkpoints
        state["pending"] = signal.SIGUSR1 if signum == signal.SIGUSR1 else signal.SIGTERM

    old = {s: signal.signal(s, graceful) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    summary: dict = {}
    reader = threading.Thread(target=_pump, args=(proc, view, summary, parse_line), daemon=True)
    reader.start()
    start = time.monotonic()
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            if state["pending"] is not None and "progress" in summary:
                _signal(proc, state.pop("pending"))
                state["pending"] = None
            now = time.monotonic()
            limit = cfg.launch.timeout_seconds
            if limit is not None and now - start > limit and state["stop_requested_at"] is None:
                state["timed_out"] = True
                state["stop_requested_at"] = now
                _signal(proc, signal.SIGTERM)
            if "progress" not in summary and now - start > cfg.launch.startup_seconds and not state["killed"]:
                _kill(proc)  # the role loops' watchdog runs only once every rank has started
                state["killed"] = state["stuck_starting"] = True
            t = state["stop_requested_at"]
            if t is not None and now - t > GRACE_SECONDS and not state["killed"]:
                _kill(proc)
                state["killed"] = True
        reader.join(timeout=5)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    view.finish(summary.get("summary"))
    rc = proc.returncode
    stop_reason = str((summary.get("summary") or {}).get("stop_reason") or "")
    if state["stuck_starting"]:
        print(f"hpcrl run: the ranks reported no progress within launch.startup_seconds="
              f"{cfg.launch.startup_seconds:g} of the start (a rank stuck starting); ended the job: run directory "
              f"{run_dir}", file=sys.stderr)
        return EXIT_FAILED
    if state["timed_out"]:
        print(f"hpcrl run: stopped after launch.timeout_seconds={cfg.launch.timeout_seconds}", file=sys.stderr)
        return EXIT_TIMEOUT
    if stop_reason.startswith("signal"):
        print(f"hpcrl run: stopped by {stop_reason.split()[-1]} with a checkpoint; go on with "
              f"`hpcrl run --resume {run_dir}`", file=sys.stderr)
        return EXIT_STOPPED
    if rc != 0:
        first = f"{summary['failed']}; " if "failed" in summary else ""
        print(f"hpcrl run: the MPI job failed (exit code {rc}): {first}run directory {run_dir}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FINISHED


FAILED_LINE = re.compile(r"^\[rank \d+\] hpcrl: (rank \d+.*? failed: .*); aborting the job$")
"""runtime.runners.mpi._abort's first line: which rank, role and host failed, and the error."""


def _pump(proc: subprocess.Popen, view, summary: dict, parse_line) -> None:
    for line in proc.stdout:
        line = line.rstrip("\n")
        rec = parse_line(line)
        if rec is None:
            failed = FAILED_LINE.match(line)
            if failed and "failed" not in summary:  # the rank that failed first, not the ones aborted after it
                summary["failed"] = failed[1]
            view.echo(line)
        elif rec.get("kind") == "progress":
            summary["progress"] = rec  # the ranks are running
            view.update(rec)
        elif rec.get("kind") == "summary":
            summary["summary"] = rec


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
