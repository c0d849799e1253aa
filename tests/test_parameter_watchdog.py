"""Nothing may hang on rank 0 (issue 31 item 1): a stopped or killed parameter rank ends the job, named in one line.

Rank 0 watches every other rank; the launcher watches rank 0 through its progress lines
(``runners.mpiexec.ParameterWatch``). Each test starts `hpcrl run` on a tiny job that would run for ever and
sends the parameter rank itself (under prestart: the server's child, found by the run.h5 it holds) SIGKILL or
SIGSTOP at varied moments: as soon as it runs, at its first progress line, later, and inside its shutdown after
a SIGTERM. Every job must end within a bound, its last line naming rank 0 and how to go on.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import pytest
import yaml
from test_damaged_record import header_address

pytestmark = [pytest.mark.alone, pytest.mark.mpi, pytest.mark.slow]

WATCHDOG_S = 4.0
KILLED_WITHIN_S = 15.0  # SIGKILL: mpiexec ends the job (about 1 s on a quiet machine)
STOPPED_WITHIN_S = WATCHDOG_S + 12.0  # SIGSTOP: the launcher's watchdog ends it
PROGRESS = re.compile(r"^\[\s*[\d.]+ s\] steps ")  # a plain progress line (runtime.record.progress.format_line)


def write_config(tmp_path: Path, name: str, prestart: bool = True) -> tuple[Path, Path]:
    run_dir = tmp_path / name
    cfg = {"name": "tiny", "env": {"id": "CartPole-v1", "num_envs": 2},
           "actors": {"count": 2, "fragment_length": 16}, "learners": {"groups": 1, "ranks_per_group": 1},
           "algo": {"name": "ppo", "train_batch_size": 64, "minibatch_size": 32, "num_sgd_iter": 1},
           "stop": {"total_env_steps": 10_000_000},
           "io": {"run_dir": str(run_dir), "flush_seconds": 0.3, "checkpoint_every": 10, "log_seconds": 0.2,
                  "tensorboard": False},
           "launch": {"watchdog_warn_seconds": 2.0, "watchdog_seconds": WATCHDOG_S, "timeout_seconds": 120,
                      "prestart": prestart}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, run_dir


def parameter_pid(run_dir: Path) -> int | None:
    """PID of the process holding RUN_DIR/run.h5: the parameter rank itself (under prestart not its stand-in,
    which mpiexec started and which cannot pass SIGSTOP on)."""
    target = str(run_dir / "run.h5")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) == target for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:  # another user's process, or one that just ended
            continue
    return None


class Job:
    """``hpcrl run CONFIG`` with its output read as it comes (each line with its time)."""

    def __init__(self, config: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", str(config)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, ready, what: str, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = ready()
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{what} not seen within {timeout:g} s:\n{self.output()[-3000:]}")

    def progressing(self) -> bool:
        return any(PROGRESS.match(line) for _, line in self.lines)

    def end_within(self, seconds: float) -> float:
        """Seconds until `hpcrl run` exited; kills the whole job and fails past ``seconds``."""
        start = time.monotonic()
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"the job did not end within {seconds:g} s:\n{self.output()[-3000:]}") from None
        self.reader.join(5)
        return time.monotonic() - start

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)


def kill_left(pid: int | None) -> None:
    """The signalled rank, should it outlive its job (it must not)."""
    try:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# (signal, when, seconds after that moment, prestart). Every case runs under prestart: a job without it imports
# torch in each of its four ranks. A stopped rank 0 is caught by the launcher's watch of its progress lines, the same
# whoever started the rank; a killed one that mpiexec started itself is test_runtime_e2e's kill -9 of rank 0 (it
# kills the process mpiexec started, the stand-in, as it would kill a rank without prestart)
CASES = [
    ("SIGKILL", "started", 0.0, True),  # as soon as rank 0 holds run.h5: before or at its first progress line
    ("SIGSTOP", "progress", 0.0, True),
    ("SIGKILL", "progress", 2.4, True),  # later
    ("SIGSTOP", "stopping", 0.0, True),  # inside rank 0's shutdown after a SIGTERM (or after its summary)
    ("SIGKILL", "stopping", 0.05, True),
]


def run_case(tmp_path: Path, i: int) -> tuple[str, Job, float, Path]:
    """Case ``i``: start its job, signal rank 0 at its moment; the job once it ended (or was killed past its bound)."""
    sig, when, delay, prestart = CASES[i]
    config, run_dir = write_config(tmp_path, f"run{i}", prestart)
    job, pid = Job(config), None
    try:
        pid = job.wait_for(lambda: parameter_pid(run_dir), "rank 0")
        if when != "started":
            job.wait_for(job.progressing, "a progress line")
        if when == "stopping":
            job.proc.send_signal(signal.SIGTERM)
        time.sleep(delay)
        os.kill(pid, getattr(signal, sig))
        elapsed = job.end_within(KILLED_WITHIN_S if sig == "SIGKILL" else STOPPED_WITHIN_S)
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
        kill_left(pid)
    return f"case {i} ({sig} {when} +{delay:g} s, prestart {prestart}): rc {job.proc.returncode}, {elapsed:.1f} s", \
        job, elapsed, run_dir


def test_a_stopped_or_killed_parameter_rank_ends_every_job_naming_rank_0(tmp_path):
    """Two cases at a time (each job is four ranks on the two cores; most of a case is its start-up and the
    stopped cases' watchdog wait, and each bound is counted from the signal)."""
    times: dict[str, list[float]] = {"SIGKILL": [], "SIGSTOP": []}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda i: run_case(tmp_path, i), range(len(CASES))))
    for (sig, when, _, _), (case, job, elapsed, run_dir) in zip(CASES, results):
        print(case)
        out = job.output()
        last = out.strip().splitlines()[-1]
        assert "Traceback" not in out, f"{case}\n{out[-3000:]}"
        if when == "stopping" and job.proc.returncode == 3:  # rank 0 had checkpointed and closed before the signal
            assert "stopped by SIGTERM with a checkpoint" in last, f"{case}\n{out[-3000:]}"
            continue
        assert job.proc.returncode == 1, f"{case}\n{out[-3000:]}"
        assert last.startswith("hpcrl run: ") and "rank 0 (parameter on " in last, f"{case}\n{last}"
        assert f"hpcrl run --resume {run_dir}" in last or "it has no checkpoint yet" in last, f"{case}\n{last}"
        if sig == "SIGSTOP":
            assert "made no progress for" in last and f"launch.watchdog_seconds={WATCHDOG_S:g}" in last, last
            assert "hpcrl: warning: rank 0 (parameter on " in out, out[-3000:]
            assert elapsed < STOPPED_WITHIN_S
        else:
            assert "(SIGKILL)" in last, last
        assert parameter_pid(run_dir) is None, f"{case}: rank 0 outlived its job"
        times[sig].append(elapsed)
    print({sig: [round(t, 1) for t in ts] for sig, ts in times.items()})
    assert len(times["SIGKILL"]) >= 2 and len(times["SIGSTOP"]) >= 1


def test_a_killed_parameter_rank_that_left_a_torn_block_in_run_h5_still_ends_the_job_at_once(tmp_path):
    """The rare never-ending kill -9 of rank 0: killed in the middle of writing metadata, it leaves a block whose
    checksum does not match in a file its superblock says a writer holds; the launcher then read run.h5 (the
    start-up attribute) as an SWMR reader, which HDF5 retries for ever (now: for HPCRL_READ_TIMEOUT, 30 s).
    The torn block is made on purpose here, while rank 0 is stopped, before the kill."""
    config, run_dir = write_config(tmp_path, "run")
    env_limit = os.environ.pop("HPCRL_READ_TIMEOUT", None)
    job, pid = Job(config), None
    try:
        pid = job.wait_for(lambda: parameter_pid(run_dir), "rank 0")
        job.wait_for(job.progressing, "a progress line")
        time.sleep(0.5)
        os.kill(pid, signal.SIGSTOP)
        h5 = run_dir / "run.h5"
        at, length = header_address(h5, "actors", swmr=True)
        with open(h5, "r+b") as fh:  # one byte of the actors table's header: its checksum no longer matches
            fh.seek(at + length // 2)
            byte = fh.read(1)[0]
            fh.seek(at + length // 2)
            fh.write(bytes([byte ^ 0x5A]))
        os.kill(pid, signal.SIGKILL)
        elapsed = job.end_within(KILLED_WITHIN_S)
    finally:
        if env_limit is not None:
            os.environ["HPCRL_READ_TIMEOUT"] = env_limit
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
        kill_left(pid)
    out = job.output()
    print(f"killed with a torn block: ended in {elapsed:.1f} s")
    last = out.strip().splitlines()[-1]
    assert job.proc.returncode == 1 and "rank 0 (parameter on " in last and "(SIGKILL)" in last, out[-3000:]
