"""One job per run directory: ``RUN_DIR/run.lock`` names the host and process holding the directory.

Two jobs writing the same run.h5 would corrupt it, so ``hpcrl run`` and ``--resume`` take this
lock first; a second attempt raises :class:`~hpcrl.errors.ConfigError` naming the holder.
A lock whose holder is gone is taken over with one line on stderr:

- same host: the holder's pid is not running (or is a different process that reused the pid,
  told apart by its start time in ``/proc``);
- other host: the pid cannot be checked from here, so the lock counts as stale once its file
  has not been touched for ``stale_after_seconds``; a holder refreshes it every
  ``heartbeat_seconds`` from a background thread, so a live job's lock never gets that old;
- an unreadable lock file (it is written whole, by a hard link, so this means damage).

A directory that cannot be written (read-only file system, no permission) cannot be locked:
:meth:`RunLock.acquire` raises ConfigError in one line saying so. A lock that cannot be removed at
the end (the directory turned read-only during the run) is left with one line on stderr; it names
this process, so the next run or ``--resume`` of the directory takes it over as stale.

The file is created by writing a private temporary file and hard-linking it to ``run.lock``
(the link fails if the lock exists: atomic on local disks, NFS, Lustre and GPFS).

API::

    with RunLock(run_dir, stale_after_seconds=3600.0, heartbeat_seconds=60.0):
        ...                            # the run
    lock = RunLock(run_dir).acquire(); ...; lock.release()
    read_lock(run_dir) -> LockInfo | None   # who holds it, or None
    in_use(run_dir) -> str | None           # why a run of it now would be refused (a live holder), or None
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcrl.errors import ConfigError

LOCK_FILE = "run.lock"
_ATTEMPTS = 5


@dataclass(frozen=True)
class LockInfo:
    host: str
    pid: int
    pid_start: str | None
    """The holder's start time from /proc/PID/stat (tells a reused pid apart); None off Linux."""
    started_unix: float
    token: str

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self)) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "LockInfo":
        d = json.loads(data.decode())
        return cls(str(d["host"]), int(d["pid"]), d.get("pid_start"), float(d["started_unix"]), str(d["token"]))

    def describe(self) -> str:
        since = _dt.datetime.fromtimestamp(self.started_unix).isoformat(sep=" ", timespec="seconds")
        return f"pid {self.pid} on host {self.host} since {since}"


def process_start(pid: int) -> str | None:
    """Start time of process ``pid`` in clock ticks after boot (/proc/PID/stat field 22); None if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None


def _pid_running(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def read_lock(run_dir: str | Path) -> LockInfo | None:
    """The current holder of RUN_DIR's lock, or None when unlocked (or the lock file is unreadable)."""
    try:
        return LockInfo.from_bytes((Path(run_dir) / LOCK_FILE).read_bytes())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def in_use(run_dir: str | Path) -> str | None:
    """Why a run or --resume of RUN_DIR would be refused now (its lock's holder lives), or None."""
    lock = RunLock(run_dir)
    try:
        seen, age = lock.path.read_bytes(), time.time() - lock.path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        lock._stale(seen, age)
    except ConfigError as exc:
        return str(exc)
    return None


class RunLock:
    """Exclusive lock of a run directory, held by this process (a context manager)."""

    def __init__(self, run_dir: str | Path, *, stale_after_seconds: float = 3600.0, heartbeat_seconds: float = 60.0):
        if heartbeat_seconds * 2 >= stale_after_seconds:
            raise ConfigError(f"run lock: stale_after_seconds ({stale_after_seconds}) must exceed twice "
                              f"heartbeat_seconds ({heartbeat_seconds})")
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.stale_after_seconds = stale_after_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.info: LockInfo | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- taking and giving back ----------------------------------------------------------
    def acquire(self) -> "RunLock":
        """Take the lock (taking over a stale one, with one line on stderr) or raise ConfigError."""
        if self.info is not None:
            raise RuntimeError(f"{self.path}: already held by this RunLock")
        pid = os.getpid()
        mine = LockInfo(socket.gethostname(), pid, process_start(pid), time.time(), uuid.uuid4().hex)
        for _ in range(_ATTEMPTS):
            if self._create(mine):
                self.info = mine
                self._start_heartbeat()
                return self
            try:
                seen = self.path.read_bytes()
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:  # released meanwhile: try again
                continue
            why = self._stale(seen, age)  # raises while the holder lives
            if self._set_aside(seen, mine):
                print(f"hpcrl: taking over the lock of run directory {self.run_dir}: {why}", file=sys.stderr, flush=True)
        raise ConfigError(f"{self.path}: could not take the run lock after {_ATTEMPTS} attempts "
                          "(another process keeps taking it)")

    def release(self) -> None:
        """Give the lock back (only if the file is still ours); safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.info is not None and read_lock(self.run_dir) == self.info:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as exc:
                print(f"hpcrl: cannot remove the run lock {self.path} ({exc.strerror or exc}); it names this "
                      "process, so the next run or --resume of the directory takes it over", file=sys.stderr,
                      flush=True)
        self.info = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # ---- internals ------------------------------------------------------------------------
    def _create(self, mine: LockInfo) -> bool:
        """Write our lock whole under a private name and link it into place; False if one exists."""
        tmp = self.run_dir / f".{LOCK_FILE}.{mine.token}.tmp"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(mine.to_bytes())
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)  # written in part (a full disk)
            except OSError:
                pass
            raise ConfigError(f"run directory {self.run_dir} cannot be written ({exc.strerror or exc}): a run or "
                              "--resume writes its record there, so it cannot take the run lock "
                              f"({self.path})") from None
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here: exclusive create (not atomic on old NFS)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as fh:
                fh.write(mine.to_bytes())
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def _stale(self, seen: bytes, age: float) -> str:
        """Why the lock in ``seen`` may be taken over; raises ConfigError while its holder lives."""
        try:
            holder = LockInfo.from_bytes(seen)
        except (ValueError, KeyError, TypeError):
            return f"unreadable lock file {self.path}"
        if holder.host == socket.gethostname():
            if not _pid_running(holder.pid):
                return f"{holder.describe()} is not running"
            now_start = process_start(holder.pid)
            if holder.pid_start is not None and now_start is not None and now_start != holder.pid_start:
                return f"{holder.describe()} is not running (its pid now belongs to another process)"
            raise ConfigError(f"run directory {self.run_dir} is in use by {holder.describe()} ({self.path}); "
                              "a second run or --resume of the same directory is refused")
        if age > self.stale_after_seconds:
            return f"{holder.describe()} has not refreshed it for {age:.0f} s (stale after {self.stale_after_seconds:.0f} s)"
        raise ConfigError(f"run directory {self.run_dir} is in use by {holder.describe()} ({self.path}, refreshed "
                          f"{age:.0f} s ago); a second run or --resume of the same directory is refused "
                          f"(a lock from another host counts as stale after {self.stale_after_seconds:.0f} s)")

    def _set_aside(self, seen: bytes, mine: LockInfo) -> bool:
        """Move the stale lock out of the way; False if it changed meanwhile (another process took it)."""
        aside = self.run_dir / f".{LOCK_FILE}.{mine.token}.stale"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            if aside.read_bytes() == seen:
                return True
            try:  # we moved someone's fresh lock: put it back
                os.link(aside, self.path)
            except FileExistsError:
                pass
            return False
        finally:
            aside.unlink(missing_ok=True)

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"run-lock-heartbeat {self.run_dir}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            if read_lock(self.run_dir) != self.info:
                return  # taken over or removed: not ours to refresh
            try:
                os.utime(self.path)
            except OSError:
                pass
