"""hpcrl.io.run_lock: one holder per run directory, stale locks taken over, live ones refused in one line."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpcrl.errors import ConfigError
from hpcrl.io.run_lock import LOCK_FILE, LockInfo, RunLock, process_start, read_lock

REPO = Path(__file__).resolve().parents[1]


def _write_lock(run_dir: Path, host: str, pid: int, pid_start=None, age: float = 0.0) -> Path:
    path = run_dir / LOCK_FILE
    path.write_bytes(LockInfo(host, pid, pid_start, time.time() - age, "t" * 32).to_bytes())
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_second_lock_of_a_directory_is_refused_until_released(tmp_path):
    with RunLock(tmp_path) as lock:
        info = json.loads((tmp_path / LOCK_FILE).read_text())
        assert info["host"] == socket.gethostname() and info["pid"] == os.getpid()
        assert read_lock(tmp_path) == lock.info
        with pytest.raises(ConfigError) as err:
            RunLock(tmp_path).acquire()
        msg = str(err.value)
        assert "\n" not in msg and "is in use by" in msg and f"pid {os.getpid()}" in msg and str(tmp_path) in msg
    assert not (tmp_path / LOCK_FILE).exists() and sorted(os.listdir(tmp_path)) == []
    with RunLock(tmp_path):  # free again
        pass


def test_a_killed_holder_on_this_host_is_taken_over_with_one_line(tmp_path, capfd):
    code = textwrap.dedent("""
        import sys, time
        from hpcrl.io.run_lock import RunLock
        RunLock(sys.argv[1]).acquire()
        print("locked", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().startswith("locked")
        with pytest.raises(ConfigError, match=f"pid {proc.pid} on host"):
            RunLock(tmp_path).acquire()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    capfd.readouterr()
    with RunLock(tmp_path):
        assert read_lock(tmp_path).pid == os.getpid()
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "taking over" in err and f"pid {proc.pid}" in err and "not running" in err, err


def test_dead_pid_and_reused_pid_are_stale_a_live_one_is_not(tmp_path, capfd):
    host = socket.gethostname()
    _write_lock(tmp_path, host, _dead_pid())
    with RunLock(tmp_path):
        pass
    assert "not running" in capfd.readouterr().err
    parent = os.getppid()  # alive: refused
    _write_lock(tmp_path, host, parent, process_start(parent))
    with pytest.raises(ConfigError, match="in use"):
        RunLock(tmp_path).acquire()
    assert read_lock(tmp_path).pid == parent  # a refused attempt leaves the holder's lock alone
    _write_lock(tmp_path, host, parent, "12345")  # same pid, another start time: the pid was reused
    with RunLock(tmp_path):
        pass
    assert "another process" in capfd.readouterr().err


def test_other_host_is_refused_unless_older_than_the_stale_age(tmp_path, capfd):
    _write_lock(tmp_path, "other-node-17", 4242, age=100.0)
    with pytest.raises(ConfigError) as err:
        RunLock(tmp_path, stale_after_seconds=600, heartbeat_seconds=1).acquire()
    assert "other-node-17" in str(err.value) and "\n" not in str(err.value)
    with RunLock(tmp_path, stale_after_seconds=60, heartbeat_seconds=1):
        assert read_lock(tmp_path).host == socket.gethostname()
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "other-node-17" in err and "not refreshed" in err


def test_heartbeat_keeps_the_lock_fresh_and_release_leaves_a_foreign_lock(tmp_path, capfd):
    lock = RunLock(tmp_path, stale_after_seconds=10, heartbeat_seconds=0.05).acquire()
    path = tmp_path / LOCK_FILE
    os.utime(path, (time.time() - 1000, time.time() - 1000))
    deadline = time.monotonic() + 5
    while time.time() - path.stat().st_mtime > 100 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert time.time() - path.stat().st_mtime < 100, "the heartbeat did not refresh the lock"
    _write_lock(tmp_path, "other-node", 1)  # someone took it over meanwhile
    lock.release()
    assert read_lock(tmp_path).host == "other-node"
    path.write_bytes(b"\x00garbage")  # damaged: taken over
    with RunLock(tmp_path):
        pass
    assert "unreadable lock file" in capfd.readouterr().err
    with pytest.raises(ConfigError, match="heartbeat_seconds"):
        RunLock(tmp_path, stale_after_seconds=1, heartbeat_seconds=1)
