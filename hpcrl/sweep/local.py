"""A sweep's runs on this machine, ``parallel`` at a time, each an ``hpcrl run`` in a child process.

Which runs: every run not ``done`` (and ``failed`` ones only with ``retry_failed``), in the spec's order. How
each starts: from its checkpoint (``hpcrl run --resume RUN_DIR``) when its directory holds one it can resume
from, else afresh (a directory without a checkpoint, from a run killed before its first one, or a simulated
run with ``launch.sim_actors=node``, is moved aside to ``RUN_DIR.incomplete-N``, not deleted). Run directories are ``SWEEP_DIR/runs/NAME``, logs
``SWEEP_DIR/logs/NAME.log`` (appended to on each attempt).

Stopping: SIGINT or SIGTERM to the sweep is passed to its runs as SIGTERM (each checkpoints and exits 3,
``stopped``); the sweep waits for them and exits 3 too. A sweep killed outright (SIGKILL, a node lost) takes
its runs with it (Linux's parent-death signal sends them SIGTERM), and the next sweep waits until their run
locks are free before it resumes them. One sweep process per directory at a time (``SWEEP_DIR/run.lock``).
"""
from __future__ import annotations

import ctypes
import fnmatch
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpcrl.errors import ConfigError
from hpcrl.io.run_lock import RunLock, in_use
from hpcrl.runtime.record.checkpoint import checkpoint_path
from hpcrl.runtime.signals import EXIT_FINISHED, EXIT_STOPPED
from hpcrl.sweep.spec import SweepRun, SweepSpec
from hpcrl.sweep.state import SweepState, counts

LOCK_WAIT_SECONDS = 300.0
"""Longest wait for a run killed with its sweep to let go of its run directory."""


def run_dir(sweep_dir: Path, run: SweepRun) -> Path:
    return sweep_dir / "runs" / run.name


def run_command(sweep_dir: Path, run: SweepRun) -> list[str]:
    """The run's ``hpcrl run``: resumed from its checkpoint, or started (its directory made free first)."""
    directory = run_dir(sweep_dir, run)
    base = [sys.executable, "-m", "hpcrl", "-q", "run"]
    if checkpoint_path(directory).exists() and can_resume(directory):
        return [*base, "--resume", str(directory)]
    if directory.exists():
        n = 1
        while directory.with_name(f"{directory.name}.incomplete-{n}").exists():
            n += 1
        directory.rename(directory.with_name(f"{directory.name}.incomplete-{n}"))
    return [*base, run.config, *[a for o in (*run.overrides, f"io.run_dir={directory}") for a in ("-o", o)]]


def can_resume(directory: Path) -> bool:
    """Whether ``hpcrl run --resume`` goes on from the run's checkpoint: not a simulated run whose nodes' actor ranks
    ran as one role (``launch.sim_actors=node`` keeps no trajectory files to resume from; runners/sim.py). Such a
    run starts again, deterministic: the same record."""
    from hpcrl.config import load_config

    cfg = load_config(directory / "config.yaml")
    return not (cfg.launch.runner == "sim" and cfg.launch.sim_actors == "node")


def wait_until_free(directory: Path, say) -> None:
    """Wait while a live process holds the run's lock (a run of a killed sweep still checkpointing)."""
    end = time.monotonic() + LOCK_WAIT_SECONDS
    while (holder := in_use(directory)) is not None:
        if time.monotonic() > end:
            raise RuntimeError(holder)
        say(f"waiting for {directory.name}: {holder}")
        time.sleep(2.0)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the sweep process dies (Linux prctl PR_SET_PDEATHSIG), so no run outlives it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


@dataclass
class _Running:
    run: SweepRun
    proc: subprocess.Popen
    started: float
    log: object
    told_to_stop: bool = False


def last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def run_local(spec: SweepSpec, sweep_dir: Path, parallel: int | None = None, retry_failed: bool = False,
              say=print, only: list[str] | None = None) -> int:
    """Run what is left of the sweep (``only``: of the runs whose names match one of these shell patterns); the exit
    code: 0 when every run asked for is done, 3 when stopped by a signal, 1 when one failed or is left."""
    sweep_dir = Path(sweep_dir)
    state = SweepState(sweep_dir)
    data = state.open(spec)
    parallel = parallel or spec.parallel
    (sweep_dir / "logs").mkdir(exist_ok=True)
    (sweep_dir / "runs").mkdir(exist_ok=True)
    wanted = ("pending", "stopped", "running", *(("failed",) if retry_failed else ()))
    asked = selected(spec, only)
    todo = [name for name in asked if data["runs"][name]["status"] in wanted]
    c = counts(data)
    say(f"sweep {spec.name}: {len(spec.runs)} runs ({c['done']} done, {c['failed']} failed), {len(todo)} to run"
        f"{f' (--only: {len(asked)} runs)' if only else ''}, {parallel} at a time, in {sweep_dir}")
    stopping: list[int] = []

    def on_signal(signum, _frame) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    running: list[_Running] = []
    try:
        with RunLock(sweep_dir):
            while (todo and not stopping) or running:
                while todo and len(running) < parallel and not stopping:
                    name = state.claim([todo.pop(0)], wanted)
                    if name is None:
                        continue
                    run = spec.run(name)
                    wait_until_free(run_dir(sweep_dir, run), say)
                    log = open(sweep_dir / "logs" / f"{name}.log", "ab")
                    cmd = run_command(sweep_dir, run)
                    log.write(f"\n$ {' '.join(cmd)}\n".encode())
                    log.flush()
                    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            preexec_fn=_die_with_parent, env={**os.environ, "OMP_NUM_THREADS": "1"})
                    state.update(name, pid=proc.pid, started_unix=time.time())
                    running.append(_Running(run, proc, time.monotonic(), log))
                    say(f"started {name}{' (resumed)' if '--resume' in cmd else ''}")
                if stopping:
                    for r in running:  # once: a second SIGTERM could land while the run closes its files
                        if r.proc.poll() is None and not r.told_to_stop:
                            r.proc.send_signal(signal.SIGTERM)
                            r.told_to_stop = True
                time.sleep(0.2)
                for r in [r for r in running if r.proc.poll() is not None]:
                    running.remove(r)
                    r.log.close()
                    _finished(state, sweep_dir, r, say)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    data = state.read()
    c = counts(data)
    say(f"sweep {spec.name}: {c['done']} of {len(spec.runs)} runs done, {c['failed']} failed, "
        f"{c['stopped'] + c['running'] + c['pending']} left" + (" (stopped by a signal)" if stopping else ""))
    if stopping:
        return EXIT_STOPPED
    return 0 if all(data["runs"][name]["status"] == "done" for name in asked) else 1


def selected(spec: SweepSpec, only: list[str] | None) -> list[str]:
    """The names of the spec's runs that match one of the shell patterns ``only`` (None: every run); a pattern that
    matches none is refused in one line."""
    names = [r.name for r in spec.runs]
    if not only:
        return names
    for pattern in only:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise ConfigError(f"--only {pattern!r} matches none of the sweep's runs ({names[0]} ... {names[-1]}; "
                              "hpcrl sweep SPEC --list names them)")
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in only)]


def run_task(spec: SweepSpec, sweep_dir: Path, index: int, say=print) -> int:
    """An array task: the sweep's run ``index`` (started, or resumed), in the foreground; SIGTERM or SIGUSR1 to the
    task stop the run (it checkpoints). The run's exit code: 0 done, 3 stopped, 1 failed."""
    sweep_dir = Path(sweep_dir)
    state = SweepState(sweep_dir)
    data = state.open(spec)
    if not 0 <= index < len(spec.runs):
        raise ConfigError(f"--task {index}: the sweep has runs 0..{len(spec.runs) - 1}")
    run = spec.runs[index]
    if data["runs"][run.name]["status"] == "done":
        say(f"{run.name} is done already")
        return 0
    (sweep_dir / "logs").mkdir(exist_ok=True)
    (sweep_dir / "runs").mkdir(exist_ok=True)
    state.claim([run.name], ("pending", "stopped", "running", "failed"))
    wait_until_free(run_dir(sweep_dir, run), say)
    stopping: list[int] = []
    proc: subprocess.Popen | None = None

    def on_signal(signum, _frame) -> None:
        if not stopping and proc is not None and proc.poll() is None:  # once (see run_local)
            proc.send_signal(signal.SIGTERM)
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        with open(sweep_dir / "logs" / f"{run.name}.log", "ab") as log:
            cmd = run_command(sweep_dir, run)
            log.write(f"\n$ {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=_die_with_parent, env={**os.environ, "OMP_NUM_THREADS": "1"})
            state.update(run.name, pid=proc.pid, started_unix=time.time())
            say(f"started {run.name}{' (resumed)' if '--resume' in cmd else ''}")
            started = time.monotonic()
            while proc.poll() is None:
                time.sleep(0.5)
            failed = _finished(state, sweep_dir, _Running(run, proc, started, log), say)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 1 if failed else (0 if proc.returncode == EXIT_FINISHED else EXIT_STOPPED)


def _finished(state: SweepState, sweep_dir: Path, r: _Running, say) -> int:
    """Record how run ``r`` ended; 1 if it failed."""
    code, seconds = r.proc.returncode, time.monotonic() - r.started
    name = r.run.name
    if code == EXIT_FINISHED:
        status = "done"
    elif code in (EXIT_STOPPED, -signal.SIGTERM):
        status = "stopped"
    else:
        status = "failed"
    message = "" if status == "done" else last_line(sweep_dir / "logs" / f"{name}.log")
    data = state.read()
    total = data["runs"][name].get("seconds", 0.0) + seconds
    after = counts(state.update(name, status=status, exit=code, seconds=round(total, 1), message=message, pid=None))
    say(f"{status} {name} after {seconds:.0f} s (exit {code}){': ' + message if status == 'failed' else ''} "
        f"[{after['done']}/{sum(after.values())} done]")
    return int(status == "failed")
