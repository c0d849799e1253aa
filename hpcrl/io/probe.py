"""Bounded reads of files a writer holds: HDF5 waits for ever on their damage, so a child process looks first.

A reader that opens a file for SWMR (needed while its writer runs, and after the writer was killed:
the superblock's write flags stay set) takes metadata whose checksum does not match for a block the
writer is still writing and reads it again, sleeping 1, 2, 4 ... ns between up to 100 attempts
(HDF5's ``H5C__load_entry``): on a damaged block the sleeps double past any patience, inside the C
library, where neither a Python thread nor a signal handler can end them (issue 31: killed after
615 s). A plain open reads a block once and fails at once. So :mod:`hpcrl.io.readers` opens plainly
every file whose write flags are clear, and calls :func:`check` before an SWMR open: a child process
opens each file the same way and reads the metadata of the groups the read will touch (attributes,
links, object headers, chunk indexes; not the data, which HDF5 reads once and which no retry covers),
and is killed :func:`limit_seconds` after it has started (loading Python and h5py takes about 0.3 s, at
most ``STARTUP_S``). A child that finishes vouches for the files as they were
(remembered until a file changes); one that fails or runs out of time becomes a
:class:`~hpcrl.io.errors.RecordDamagedError` naming the file and the table it was reading.

API::

    check(targets)          # targets: [(path, groups or None, kind)]; RecordDamagedError or None
    walk(f, groups=None, at=None)  # read the metadata of an open file's groups (None: all but trajectories/)
    limit_seconds() -> float       # HPCRL_READ_TIMEOUT (seconds), default 30

The child is ``python -m hpcrl.io.probe JSON`` and prints ``at I NAME`` before each group of
target I, then ``ok``, or ``error I NAME<TAB>message``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from hpcrl.errors import ConfigError
from hpcrl.io.errors import RecordDamagedError, RunFileError

TRAJ_GROUP = "trajectories"  # run.h5's virtual view: opening it opens every actor file; those are checked as files
DEFAULT_LIMIT_S = 30.0
STARTUP_S = 60.0  # for the child's interpreter and h5py to load, before the limit starts
_passed: set[tuple] = set()  # (file, state, groups) a child read whole
_failed: dict[tuple, tuple[int, str, str]] = {}  # (file, state, None) -> where and why the whole file failed


def limit_seconds() -> float:
    """Seconds a check may take: ``HPCRL_READ_TIMEOUT``, else 30 (an undamaged file takes well under one)."""
    text = os.environ.get("HPCRL_READ_TIMEOUT", "")
    if not text:
        return DEFAULT_LIMIT_S
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"HPCRL_READ_TIMEOUT={text!r}: expected seconds > 0")
    return value


def walk(f, groups: Sequence[str] | None = None, at: Callable[[str], None] | None = None) -> None:
    """Read every piece of metadata under ``groups`` of the open file ``f`` (None: every group but
    trajectories/), calling ``at(name)`` before each; raises what h5py raises on damage."""
    dict(f.attrs)
    names = [n for n in f if n != TRAJ_GROUP] if groups is None else [g for g in groups if g in f]
    for name in names:
        if at is not None:
            at(name)
        _touch(f[name])


def _touch(obj) -> None:
    dict(obj.attrs)
    if hasattr(obj, "keys"):  # a group
        for name in obj:
            _touch(obj[name])
    elif obj.chunks is not None:
        obj.id.get_num_chunks()  # visits every block of the chunk index
    else:
        obj.shape  # noqa: B018  (the dataspace message)


def _key(path: Path, groups: tuple | None) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, groups


def check(targets: Sequence[tuple[str | Path, Sequence[str] | None, str]]) -> None:
    """Read the metadata of each target (path, groups or None for all, kind) as an SWMR reader in a child
    process within :func:`limit_seconds`; raise RecordDamagedError (kind: 'table' or 'dataset') naming what
    failed. A single file is read whole first, so that later reads of it (until it changes) need no child;
    only when the damage lies outside ``groups`` are those read alone."""
    todo = [(Path(p), None if g is None else tuple(g), kind) for p, g, kind in targets]
    todo = [t for t in todo if not {_key(t[0], None), _key(t[0], t[1])} & _passed]
    if not todo:
        return
    limit = limit_seconds()
    path, groups, kind = todo[0]
    if len(todo) == 1 and groups is not None and TRAJ_GROUP not in groups:
        whole = _key(path, None)
        failed = _failed.get(whole) or _run([(path, None)], limit)
        if failed is None:
            _remember([(path, None)])
            return
        if whole is not None:
            _failed[whole] = failed  # the next read of another table goes straight to its own check
        if failed[1] and failed[1] not in groups:  # damage elsewhere in the file: read what is asked for
            failed = _run([(path, groups)], limit)
    else:
        failed = _run([(p, g) for p, g, _ in todo], limit)
    if failed is None:
        _remember([(p, g) for p, g, _ in todo])
        return
    index, name, why = failed
    raise RecordDamagedError(todo[index][0], name or None, why, todo[index][2])


def _remember(done: list[tuple[Path, tuple | None]]) -> None:
    if len(_passed) > 1000:
        _passed.clear()
        _failed.clear()
    _passed.update(k for p, g in done if (k := _key(p, g)) is not None)


def _run(targets: list[tuple[Path, tuple | None]], limit: float) -> tuple[int, str, str] | None:
    """One child over ``targets``: None when it finished, else (target index, group, why)."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding this hpcrl package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "hpcrl.io.probe", json.dumps([[str(p), g] for p, g in targets])]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err, code = wait_ready_then(proc, limit)
    lines = out.decode(errors="replace").splitlines()
    if "ready" not in lines:
        if code is None:
            raise RunFileError(f"{targets[0][0]}: not read: the process that checks it first did not start within "
                               f"{STARTUP_S:g} s")
        # the child never got to the files (no h5py there ...): read unchecked
        why = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        warnings.warn(f"hpcrl.io: could not check {targets[0][0]} in a child process ({why}); reading it unchecked",
                      RuntimeWarning, stacklevel=4)
        return None
    if lines[-1] == "ok":
        return None
    head, _, message = lines[-1].partition("\t")
    _, index, name = (head.split(" ", 2) + ["", ""])[:3]
    if code is None:
        why = (f"HDF5 still reading its metadata after {limit:g} s: as a reader of a file a writer holds, it retries "
               "a block whose checksum does not match for ever; HPCRL_READ_TIMEOUT sets the limit")
    else:
        why = message if head.startswith("error") else f"reading it ended the process, exit code {code}"
    return int(index or 0), name, why


def wait_ready_then(proc: subprocess.Popen, limit: float) -> tuple[bytes, bytes, int | None]:
    """Wait for ``proc`` to print ``ready`` (its interpreter and h5py loaded; at most STARTUP_S), then at most
    ``limit`` seconds more; kill it then. (stdout, stderr, exit code or None when killed)."""
    start = time.monotonic()
    ready_at = None
    while True:
        wait = 0.05 if ready_at is None else max(ready_at + limit - time.monotonic(), 0.0)
        try:
            out, err = proc.communicate(timeout=wait)
            return out, err, proc.returncode
        except subprocess.TimeoutExpired as exc:
            now = time.monotonic()
            if ready_at is None and b"ready" in (exc.stdout or b""):
                ready_at = now
            if (ready_at is not None and now >= ready_at + limit) or (ready_at is None and now >= start + STARTUP_S):
                proc.kill()
                out, err = proc.communicate()
                return out, err, None


def _main(argv: list[str]) -> int:
    import h5py

    targets = json.loads(argv[0])
    print("ready", flush=True)
    for i, (path, groups) in enumerate(targets):
        name = ""

        def at(group: str) -> None:
            nonlocal name
            name = group
            print(f"at {i} {group}", flush=True)

        print(f"at {i} ", flush=True)  # opening the file
        try:
            with h5py.File(path, "r", swmr=True, locking=False) as f:
                walk(f, groups, at)
        except Exception as exc:  # noqa: BLE001  (any failure is the answer)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"error {i} {name}\t{first}", flush=True)
            return 1
    print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
