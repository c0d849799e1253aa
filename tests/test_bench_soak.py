"""hpcrl bench soak proves its faults took (issue 41 item 7): a short serial soak draws every kind that applies,
each shows in the run's end, and the record is whole after the resumes; a fault the run's end does not show is not
counted."""
from __future__ import annotations

import re

from hpcrl.bench import soak


def test_a_short_serial_soak_makes_every_fault_kind_take_once_and_keeps_the_record_whole(tmp_path, capsys):
    rc = soak.main(["--runner", "serial", "--minutes", "0.01", "--min-each", "1", "--actors", "2",
                    "--fault-after", "0.2", "0.6", "--keep", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    row = next(line for line in out.splitlines() if line.startswith("serial "))
    for kind in soak.SERIAL_FAULTS:
        took, tried = map(int, re.search(rf"{kind} (\d+)/(\d+)", row).groups())
        assert took >= 1 and tried >= took, row
    assert "every fault kind took, every key once" in out
    assert int(row.split()[2]) > 0  # env steps in the final record


def test_a_fault_counts_only_when_the_runs_end_shows_it():
    stopped = "hpcrl run: stopped by SIGTERM with a checkpoint; go on with `hpcrl run --resume x`\n"
    assert soak.took("sigterm", None, "SIGTERM", 3, stopped)
    assert not soak.took("sigterm", None, "SIGTERM", 0, "hpcrl run summary\n")  # it ended by its stop rule first
    assert soak.took("kill_job", None, "SIGKILL of the job", -9, "")
    assert not soak.took("kill_rank", None, "SIGKILL of the job (ranks not started)", -9, "")
    killed = ("hpcrl run: the MPI job failed (exit code 9): rank 4 (actor 2 on vm) ended first, mpiexec reports "
              "exit code 9 (SIGKILL)\n")
    assert soak.took("kill_rank", 4, "SIGKILL of rank 4", 1, killed)
    assert not soak.took("kill_rank", 2, "SIGKILL of rank 2", 1, killed)  # another rank named
    silent = "hpcrl run: rank 4 (actor 2 on vm) made no progress for 6 s (launch.watchdog_seconds=5); ...\n"
    assert soak.took("stop_actor", 4, "SIGSTOP of rank 4 (watchdog)", 1, silent)
