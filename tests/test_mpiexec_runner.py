"""The mpi runner's launcher side names the rank that died, from the lines mpiexec and the ranks print."""
from __future__ import annotations

import platform
import signal
from pathlib import Path

from hpcrl.runtime.runners.mpiexec import _name_the_first_to_end, _pump
from hpcrl.runtime.runners.prestart import killed_line

ROLES = ["parameter", "learner group 0", "actor 0", "actor 1"]
BANNER = ["=" * 83, "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", "=   PID 4242 RUNNING AT node2",
          "=   EXIT CODE: 9", "=   CLEANING UP REMAINING PROCESSES"]


class _Proc:
    def __init__(self, lines):
        self.stdout = [line + "\n" for line in lines]


class _View:
    def echo(self, line):
        pass

    def update(self, rec):
        pass


def pumped(lines, pids=None, first=None) -> dict:
    """The launcher's reading of a failed job's lines; ``first``: the rank whose process ended first (ExitOrder)."""
    summary = {} if pids is None else {"pids": pids}
    _pump(_Proc(lines), _View(), summary, lambda line: None, ROLES, Path("/nonexistent"))
    _name_the_first_to_end(summary, first, ROLES)
    return summary


def test_a_rank_killed_under_prestart_is_named_by_its_stand_ins_line():
    line = killed_line({"PMI_RANK": "3", "PMI_SIZE": "4"}, 1234, signal.SIGKILL)
    assert line.startswith("hpcrl: rank 3 (pid 1234 on ") and line.endswith("was killed by signal 9 (SIGKILL)")
    host = line.split(" on ")[1].split(")")[0]
    summary = pumped([line, *BANNER], pids={4242: 0})  # the stand-in's line wins over hydra's banner
    assert summary["failed"] == f"rank 3 (actor 1 on {host}) was killed by signal 9 (SIGKILL)"


def test_hydras_banner_pid_is_mapped_to_its_rank():
    assert pumped(BANNER, pids={4241: 1, 4242: 2})["failed"] == \
        "rank 2 (actor 0 on node2) ended first, mpiexec reports exit code 9 (SIGKILL)"
    assert "failed" not in pumped(BANNER, pids={1: 0})  # a PID of no rank of this job: nothing to name


def test_the_rank_whose_process_ended_first_is_named_over_hydras_banner():
    # hydra kills the other ranks, then its banner shows the lowest rank that ended badly (seen: rank 0 for a
    # killed rank 3); the kernel's order of the processes' ends names rank 3
    host = platform.node()
    assert pumped(BANNER, pids={4242: 0}, first=3)["failed"] == \
        f"rank 3 (actor 1 on {host}) ended first, mpiexec reports exit code 9 (SIGKILL)"
    abort = "[rank 1] hpcrl: rank 1 (learner on node1) failed: ValueError: x; aborting the job"
    assert pumped([abort, *BANNER], first=3)["failed"].startswith("rank 1 (learner on node1) failed")


def test_exit_order_names_the_process_that_ended_alone_first():
    import subprocess
    import sys
    import time

    from hpcrl.runtime.runners.rank_exits import ExitOrder

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(3)]
    exits = ExitOrder()
    try:
        exits.watch({p.pid: rank for rank, p in enumerate(procs)})
        procs[2].kill()
        procs[2].wait()
        time.sleep(0.5)
        for p in procs[:2]:
            p.kill()
            p.wait()
        time.sleep(0.3)
        assert exits.first == 2
        started = time.monotonic()
        exits.stop()
        assert time.monotonic() - started < 0.1  # its thread wakes at once (the launcher waits on it at every end)
        assert not exits._thread.is_alive()
    finally:
        exits.stop()
        for p in procs:
            p.kill()
            p.wait()


def test_a_rank_that_raised_is_named_by_its_abort_line_first():
    abort = "[rank 1] hpcrl: rank 1 (learner on node1) failed: ValueError: x; aborting the job"
    assert pumped([abort, *BANNER], pids={4242: 2})["failed"] == "rank 1 (learner on node1) failed: ValueError: x"


def test_the_launchers_watch_of_rank_0_warns_once_then_ends_the_job_at_the_limit(tmp_path):
    from hpcrl.config import LaunchConfig
    from hpcrl.runtime.runners.mpiexec import ParameterWatch

    watch = ParameterWatch(LaunchConfig(watchdog_warn_seconds=2, watchdog_seconds=5), "rank 0 (parameter on node0)")
    lines: list[str] = []
    assert watch.check(None, 100.0, lines.append) is None and not lines  # no progress line yet: startup_seconds
    assert watch.check(10.0, 11.9, lines.append) is None and not lines
    assert watch.check(10.0, 12.0, lines.append) is None and watch.check(10.0, 14.0, lines.append) is None
    assert lines == ["hpcrl: warning: rank 0 (parameter on node0) has made no progress for 2 s "
                     "(the job ends after launch.watchdog_seconds=5)"]
    assert watch.check(14.5, 15.0, lines.append) is None  # a line came: a later silence is warned again
    assert watch.check(14.5, 17.0, lines.append) is None and len(lines) == 2
    assert watch.check(14.5, 19.5, lines.append) == 5.0
    assert watch.message(5.0, tmp_path) == ("rank 0 (parameter on node0) made no progress for 5 s "
                                            f"(launch.watchdog_seconds=5); ended the job: it has no checkpoint "
                                            f"yet: run directory {tmp_path}")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.pt").write_bytes(b"x")
    assert watch.message(5.0, tmp_path).endswith(f"`hpcrl run --resume {tmp_path}` goes on from its last checkpoint "
                                                 f"({tmp_path / 'checkpoints' / 'latest.pt'})")


def test_rank_0s_fallback_line_is_not_echoed_when_hpcrl_run_said_it_already(tmp_path, capfd):
    from hpcrl.runtime.record.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, {"version": 1})
    save_checkpoint(tmp_path, {"version": 2})
    checkpoint_path(tmp_path).write_bytes(b"not a checkpoint")
    assert load_checkpoint(tmp_path)["version"] == 1  # hpcrl run checks the checkpoint before the ranks start
    said = capfd.readouterr().err.strip()
    assert said.endswith("is unusable; resuming from " + str(checkpoint_path(tmp_path).parent / "previous.pt"))
    echoed = []
    view = _View()
    view.echo = echoed.append
    _pump(_Proc([said, "hpcrl: another line"]), view, {}, lambda line: None, ROLES, tmp_path)
    assert echoed == ["hpcrl: another line"]
