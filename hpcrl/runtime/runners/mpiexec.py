"""``launch.runner: mpi`` from ``hpcrl run``: start the job's ranks under a local ``mpiexec`` and watch them.

Each rank runs :mod:`hpcrl.runtime.runners.mpi` (``--progress pipe``); this process renders their
progress lines, forwards SIGINT/SIGTERM/SIGUSR1 as a graceful stop once the ranks run (the parameter
rank checkpoints; a second Ctrl-C kills the job), ends a job whose ranks report nothing within
``launch.startup_seconds``, ends one whose parameter rank falls silent for ``launch.watchdog_seconds``
(:class:`ParameterWatch`: rank 0 watches every other rank, this process watches rank 0), stops one past
``launch.timeout_seconds``, and hands back the summary the parameter rank printed, or the first rank
failure mpiexec reported.
"""
from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Mapping

from hpcrl import launch, verbosity
from hpcrl.runtime import collector
from hpcrl.runtime.record.checkpoint import said_here
from hpcrl.runtime.runners import RunResult
from hpcrl.runtime.runners.rank_exits import ExitOrder
from hpcrl.runtime.plan import Sections
from hpcrl.runtime.signals import EXIT_STOPPED, EXIT_TIMEOUT, early_signal

GRACE_SECONDS = 60.0
"""After a graceful stop request, how long the job may take to checkpoint before it is killed."""

FAILED_LINE = re.compile(r"^\[rank \d+\] hpcrl: (rank \d+.*? failed: .*); aborting the job$"
                         r"|^\[rank 0\] hpcrl: (rank \d+ \(.*?\) made no progress for .*?); ending the job$")
"""runtime.runners.mpi._abort's first line: which rank, role and host failed, and the error; or rank 0's
watchdog naming the silent rank."""
BANNER_PID = re.compile(r"^=\s+PID (\d+) RUNNING AT (\S+)")
BANNER_CODE = re.compile(r"^=\s+(?:EXIT CODE|KILLED BY SIGNAL): (\d+)")
"""MPICH hydra's report of the first process it saw end badly (with prestart: a rank's stand-in)."""
KILLED_LINE = re.compile(r"^hpcrl: rank (\d+) \(pid \d+ on (\S+)\) was killed by (signal \d+ \(\w+\))$")
"""A prestart stand-in's line when its rank died of a signal (runners.prestart.killed_line)."""


class ParameterWatch:
    """The launcher's watchdog for rank 0, which runs the other ranks' watchdog and so has none of its own.

    Rank 0's progress lines (``@@hpcrl``, one a second while its loop runs; :mod:`~hpcrl.runtime.record.progress`)
    are its heartbeat. Silent for ``launch.watchdog_warn_seconds``: one warning line; for
    ``launch.watchdog_seconds``: :meth:`check` returns how long, and the launcher ends the job (a stopped,
    hung or dead-locked parameter rank; a dead one ends the job through mpiexec)."""

    def __init__(self, launch_cfg, who: str):
        self.warn, self.limit, self.who = launch_cfg.watchdog_warn_seconds, launch_cfg.watchdog_seconds, who
        self.warned = False

    def check(self, last_line: float | None, now: float, echo) -> float | None:
        """Seconds since rank 0's last progress line (monotonic ``last_line``) once past the limit, else None;
        ``echo(line)`` gets the warning, once per silence."""
        if last_line is None:  # not started yet: launch.startup_seconds covers that
            return None
        quiet = now - last_line
        if quiet >= self.limit:
            return quiet
        if quiet < self.warn:
            self.warned = False
        elif not self.warned:
            self.warned = True
            echo(f"hpcrl: warning: {self.who} has made no progress for {quiet:.0f} s "
                 f"(the job ends after launch.watchdog_seconds={self.limit:g})")
        return None

    def message(self, quiet: float, run_dir: Path) -> str:
        """The launcher's last line when it ended the job for rank 0's silence."""
        return (f"{self.who} made no progress for {quiet:.0f} s (launch.watchdog_seconds={self.limit:g}); "
                f"ended the job: {how_to_go_on(run_dir)}")


def how_to_go_on(run_dir: Path) -> str:
    """``hpcrl run --resume`` from the last checkpoint (named), or that there is none yet."""
    from hpcrl.runtime.record.checkpoint import checkpoint_path, has_checkpoint

    return (f"`hpcrl run --resume {run_dir}` goes on from its last checkpoint ({checkpoint_path(run_dir)})"
            if has_checkpoint(run_dir) else f"it has no checkpoint yet: run directory {run_dir}")


def run(plan, run_dir: Path, resume: bool = False, progress: str = "plain",
        environ: Mapping[str, str] | None = None) -> RunResult:
    """Run the plan's job as ``plan.num_ranks`` local MPI ranks (``environ``: variables added for the ranks,
    e.g. the prestart server's); ``progress`` tty shows a bar, plain periodic lines."""
    collector.resume()  # the launcher builds no role (runtime/collector.py)
    s = plan.sections
    if resume:  # a record file cut short: one line and the way on now, not rank 0's abort after the start
        from hpcrl.io.rollback import check_not_cut_short

        check_not_cut_short(run_dir)
    mpiexec = launch.find_mpiexec(s.launch)
    flavour = launch.mpi_flavour(mpiexec)
    cmd = launch.local_command(s.launch, plan.num_ranks, run_dir, mpiexec=mpiexec,
                               flavour=flavour, resume=resume, progress="pipe")
    if flavour == "openmpi":
        needed, line = launch.openmpi_environment({**os.environ, **(environ or {})})
        environ = {**(environ or {}), **needed}
        if line:
            verbosity.say(f"hpcrl run: {line}", flush=True)
    return supervise(cmd, s, Path(run_dir), environ, tty=progress == "tty", roles=_role_names(plan))


def _role_names(plan) -> list[str]:
    """Each world rank's role as the launcher's lines name it (``actor 1``, ``learner group 0``, ``parameter``)."""
    from hpcrl.runtime.topology import plan_roles

    launched = plan.sections.learners.launched_ranks_per_group
    roles = plan_roles(plan.num_ranks, plan.groups, launched, plan.actors, plan.shards)
    first_actor = plan.shards + plan.groups * launched
    return [f"actor {rank - first_actor}" if r.role == "actor" else f"learner group {r.group}" if r.role == "learner"
            else f"parameter shard {r.group_rank}" if r.role == "shard" else r.role for rank, r in enumerate(roles)]


def supervise(cmd: list[str], cfg: Sections, run_dir: Path, extra_env: Mapping[str, str] | None = None,
              tty: bool | None = None, roles: list[str] | None = None) -> RunResult:
    """Run mpiexec, render its progress, forward stop signals, enforce the timeout."""
    from hpcrl.runtime.record.progress import ProgressView, parse_line

    view = ProgressView(tty=tty, log_seconds=cfg.io.log_seconds)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**launch.rank_environment(os.environ), **(extra_env or {})}, start_new_session=True)
    # a stop signal is passed on once the ranks run (their first progress line): before that it would
    # kill ranks still starting; one that came before mpiexec was started waits the same way
    state = {"stop_requested_at": None, "killed": False, "timed_out": False, "stuck_starting": False,
             "pending": early_signal(), "asked": None, "second_interrupt": False, "silent": None}
    roles = roles or []
    watch = ParameterWatch(cfg.launch, f"rank 0 ({roles[0] if roles else 'parameter'} on {platform.node()})")
    if state["pending"] is not None:
        state["stop_requested_at"] = time.monotonic()

    def graceful(signum, _frame):
        if state["stop_requested_at"] is not None and signum == signal.SIGINT:
            _kill(proc)  # second Ctrl-C: no more waiting
            state["killed"] = state["second_interrupt"] = True
            return
        state["stop_requested_at"], state["asked"] = time.monotonic(), signum
        # mpiexec (Hydra) forwards SIGTERM/SIGUSR1 to every rank; the parameter rank checkpoints
        state["pending"] = signal.SIGUSR1 if signum == signal.SIGUSR1 else signal.SIGTERM

    old = {s: signal.signal(s, graceful) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    summary: dict = {}
    exits = ExitOrder()  # which rank's process ends first: the one to name when no rank said why
    reader = threading.Thread(target=_pump, args=(proc, view, summary, parse_line, roles, run_dir), daemon=True)
    reader.start()
    start = time.monotonic()
    try:
        while proc.poll() is None:
            try:
                proc.wait(timeout=0.2)  # returns as mpiexec exits, not up to 0.2 s later
            except subprocess.TimeoutExpired:
                pass
            if state["pending"] is not None and "progress" in summary:
                _signal(proc, state.pop("pending"))
                state["pending"] = None
            now = time.monotonic()
            limit = cfg.launch.timeout_seconds
            if limit is not None and now - start > limit and state["stop_requested_at"] is None:
                state["timed_out"] = True
                state["stop_requested_at"] = now
                _signal(proc, signal.SIGTERM)
            if "progress" not in summary and len(summary.get("pids", {})) < len(roles):
                note_rank_pids(summary, run_dir)  # while the ranks start: one killed then is named too
            exits.watch(summary.get("pids", {}))
            if "progress" not in summary and now - start > cfg.launch.startup_seconds and not state["killed"]:
                _kill(proc)  # the role loops' watchdog runs only once every rank has started
                state["killed"] = state["stuck_starting"] = True
            quiet = None if "summary" in summary else watch.check(summary.get("line_at"), now, view.echo)
            if quiet is not None and not state["killed"]:
                _kill(proc)  # rank 0 cannot checkpoint; what the others flushed stays readable
                state["killed"] = True
                if "failed" not in summary:  # a rank that failed first is named instead
                    state["silent"] = quiet
            t = state["stop_requested_at"]
            if t is not None and now - t > GRACE_SECONDS and not state["killed"]:
                _kill(proc)
                state["killed"] = True
        reader.join(timeout=5)
    finally:
        exits.stop()
        for s, h in old.items():
            signal.signal(s, h)
    rc, ended = proc.returncode, summary.get("summary") or {}
    if state["asked"] == signal.SIGINT and ended.get("stop_reason") == "signal SIGTERM":
        ended = {**ended, "stop_reason": "signal SIGINT"}  # the ranks got Ctrl-C as SIGTERM (see graceful)
    view.finish(ended or None)
    if state["second_interrupt"]:
        return RunResult.failed("mpi", run_dir, "ended by a second Ctrl-C without waiting for a checkpoint; "
                                f"{how_to_go_on(run_dir)}", EXIT_STOPPED, summary=ended)
    if state["stuck_starting"]:
        return RunResult.failed("mpi", run_dir, f"the ranks reported no progress within launch.startup_seconds="
                                f"{cfg.launch.startup_seconds:g} of the start (a rank stuck starting); ended the job: "
                                f"run directory {run_dir}", summary=ended)
    if state["silent"] is not None:
        return RunResult.failed("mpi", run_dir, watch.message(state["silent"], run_dir), summary=ended)
    if state["timed_out"]:
        return RunResult.failed("mpi", run_dir, f"stopped after launch.timeout_seconds={cfg.launch.timeout_seconds}",
                                EXIT_TIMEOUT, summary=ended)
    result = RunResult.ended("mpi", run_dir, ended)
    if result.exit_code == 0 and rc != 0:
        _name_the_first_to_end(summary, None if ended else exits.first, roles)  # after a summary: ranks ended
        failed = summary.get("failed", "")
        if ": --resume: " in failed:  # rank 0 could not cut the record back: its line has the way on
            return RunResult.failed("mpi", run_dir, f"the MPI job failed (exit code {rc}): {failed}", summary=ended)
        first = f"{failed}; " if failed else ""
        return RunResult.failed("mpi", run_dir, f"the MPI job failed (exit code {rc}): {first}{how_to_go_on(run_dir)}",
                                summary=ended)
    return result


def _pump(proc: subprocess.Popen, view, summary: dict, parse_line, roles: list[str], run_dir: Path) -> None:
    def name(rank: int, host: str) -> str:
        return f"rank {rank} ({roles[rank] + ' on ' if rank < len(roles) else ''}{host})"

    for line in proc.stdout:
        line = line.rstrip("\n")
        rec = parse_line(line)
        if rec is None:
            failed, killed = FAILED_LINE.match(line), KILLED_LINE.match(line)
            banner, code = BANNER_PID.match(line), BANNER_CODE.match(line)
            if failed and "failed" not in summary:  # the rank that failed first, not the ones aborted after it
                summary["failed"] = failed[1] or failed[2]
            elif killed and "failed" not in summary:
                summary["failed"] = f"{name(int(killed[1]), killed[2])} was killed by {killed[3]}"
            elif banner and "failed" not in summary and (at := _banner_rank(int(banner[1]), summary, roles)) is not None:
                summary["banner"] = name(at, banner[2])
            elif code and "failed" not in summary and "code" not in summary:
                summary["code"] = _code_name(int(code[1]))
            elif said_here(line):  # rank 0's fallback to previous.pt, which hpcrl run has said already
                continue
            view.echo(line)
            continue
        summary["line_at"] = time.monotonic()  # rank 0's sign of life (ParameterWatch)
        if rec.get("kind") == "progress":
            if "progress" not in summary:  # the ranks run: which local process is which rank, to name one that dies
                note_rank_pids(summary, run_dir)
            summary["progress"] = rec  # the ranks are running
            view.update(rec)
        elif rec.get("kind") == "summary":
            summary["summary"] = {k: v for k, v in rec.items() if k != "kind"}


def _name_the_first_to_end(summary: dict, first: int | None, roles: list[str]) -> None:
    """``summary["failed"]`` when no rank said why the job ended: the rank whose process the kernel saw end first
    (:class:`~hpcrl.runtime.runners.rank_exits.ExitOrder`), else the one hydra's banner names."""
    if "failed" in summary:
        return
    code = f", mpiexec reports {summary['code']}" if "code" in summary else ""
    if first is not None and first < len(roles):
        summary["failed"] = f"rank {first} ({roles[first]} on {platform.node()}) ended first{code}"
    elif "banner" in summary:
        summary["failed"] = f"{summary['banner']} ended first{code}"


def note_rank_pids(summary: dict, run_dir: Path) -> None:
    """Add the job's local rank processes now running to ``summary["pids"]`` (PID -> rank); a rank seen once stays
    (a rank killed while starting, before the prestart server took it, is then still named)."""
    seen = {pid: rank for rank, pid in local_rank_pids(run_dir).items()}
    summary["pids"] = {**summary.get("pids", {}), **seen}


def _banner_rank(pid: int, summary: dict, roles: list[str]) -> int | None:
    """The rank whose process hydra's banner names: by its PID, or, for a PID never seen (a rank killed within
    a look of its start), the one rank whose process was never seen while every other was."""
    pids = summary.get("pids", {})
    if pid in pids:
        return pids[pid]
    unseen = set(range(len(roles))) - set(pids.values())
    return unseen.pop() if len(unseen) == 1 and len(pids) else None


def local_rank_pids(run_dir: Path) -> dict[int, int]:
    """MPI rank -> PID of this machine's processes of the job writing ``run_dir`` (their command line names it;
    Hydra sets PMI_RANK; with prestart these are the ranks' stand-ins, the processes mpiexec started)."""
    out = {}
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes()
            if b"hpcrl.runtime.runners.mpi" not in cmd or str(run_dir).encode() not in cmd:
                continue
            env = dict(kv.split(b"=", 1) for kv in (entry / "environ").read_bytes().split(b"\0") if b"=" in kv)
            out[int(env[b"PMI_RANK"])] = int(entry.name)
        except (OSError, ValueError, KeyError):
            continue
    return out


def _code_name(code: int) -> str:
    """Hydra's exit code of a process, with the signal it means where it is one (9: SIGKILL)."""
    try:
        return f"exit code {code} ({signal.Signals(code).name})"
    except ValueError:
        return f"exit code {code}"


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
