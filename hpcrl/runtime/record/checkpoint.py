"""Crash-safe checkpoints of the parameter rank, and reading them back for ``--resume``.

A checkpoint is one ``torch.save`` file in ``RUN_DIR/checkpoints/``. :func:`save_checkpoint`
goes through these steps, each leaving a usable directory if the job dies right after it:

1. remove temporary files left by a killed save (one writer per run directory: the run lock);
2. write the new state to ``.latest.pt.PID.tmp`` and fsync it;
3. hard-link the current ``latest.pt`` as ``.previous.pt.PID.tmp`` (a copy where the
   filesystem has no hard links), then ``os.replace`` it onto ``previous.pt``: latest and
   previous are now the same file and ``latest.pt`` never went away;
4. ``os.replace`` the new file onto ``latest.pt`` (atomic on POSIX filesystems, Lustre and
   GPFS included) and fsync the directory.

:func:`load_checkpoint` takes ``latest.pt``, or ``previous.pt`` when ``latest.pt`` is missing,
empty or truncated, saying so in one line on stderr (once per process: a resume loads it more than
once). Temporary files are never read: a save that did not reach step 4 did not happen. A save that
cannot write (a full disk, a quota) removes its temporary file and raises one line naming the
checkpoint and the OS error (``... disk full (No space left on device) ...``); latest.pt stays as it was.
"""
from __future__ import annotations

import errno
import io
import os
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hpcrl.errors import ConfigError

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest.pt"
PREVIOUS = "previous.pt"
FORMAT = 1
SAVE_STEPS = ("cleaned", "tmp_written", "previous_linked", "previous_replaced", "latest_replaced")
"""The points of :func:`save_checkpoint` after which a kill leaves a distinct directory state."""

_after_step: Callable[[str], None] | None = None
"""Test hook: called with each SAVE_STEPS name (tests/test_checkpoint.py kills the process there)."""


class CheckpointError(ConfigError):
    """No readable checkpoint where one should be: one line naming the files and why."""


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / LATEST


def has_checkpoint(run_dir: str | Path) -> bool:
    """True if ``latest.pt`` or ``previous.pt`` exists (whether it is intact is decided by loading)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    return (folder / LATEST).is_file() or (folder / PREVIOUS).is_file()


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch generator states (torch CUDA too when present)."""
    import torch  # here, not at the top: the launcher asks has_checkpoint without loading torch (seconds)

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _step(name: str) -> None:
    if _after_step is not None:
        _after_step(name)


def clean_temp_files(run_dir: str | Path) -> list[Path]:
    """Remove temporary files that a killed :func:`save_checkpoint` left; returns what was removed.

    Only call it while holding the run directory (no other save can be in progress).
    """
    folder = Path(run_dir) / CHECKPOINT_DIR
    removed = []
    for p in sorted(folder.glob(".*.tmp")) if folder.is_dir() else ():
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
    return removed


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` as the latest checkpoint, keeping the one before as previous; returns its path."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    clean_temp_files(run_dir)
    _step("cleaned")
    final, previous = folder / LATEST, folder / PREVIOUS
    tmp = folder / f".{LATEST}.{os.getpid()}.tmp"
    _write_synced(tmp, _serialised(state))
    _step("tmp_written")
    # a save killed after step 3 left previous.pt as a hard link of latest.pt; rename() between two
    # links of one file does nothing (POSIX), so there is nothing to do then
    # a latest.pt this process found unusable (it resumed from previous.pt) must not become the previous one
    if final.exists() and not (previous.exists() and os.path.samefile(final, previous)) \
            and _identity(final) not in _unusable:
        keep = folder / f".{PREVIOUS}.{os.getpid()}.tmp"
        try:
            os.link(final, keep)
        except OSError:  # no hard links on this filesystem: a copy, synced
            try:
                shutil.copyfile(final, keep)
                _fsync_file(keep)
            except OSError as exc:
                keep.unlink(missing_ok=True)
                tmp.unlink(missing_ok=True)
                raise checkpoint_write_error(final, exc) from None
        _step("previous_linked")
        os.replace(keep, previous)
        _step("previous_replaced")
    os.replace(tmp, final)
    _step("latest_replaced")
    _fsync_dir(folder)
    return final


def _serialised(state: dict[str, Any]) -> memoryview:
    """The checkpoint file's bytes: serialised in memory, so that a failing write reports the OS error (torch's
    own file writer says only "unexpected pos" on a full disk)."""
    import torch

    buf = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buf)
    return buf.getbuffer()


def _write_synced(tmp: Path, data: memoryview) -> None:
    """Write and fsync ``tmp``; on failure remove it (a partial file would hold the space a full disk lacks) and
    raise a one-line :class:`~hpcrl.io.errors.RecordWriteError` naming the checkpoint and the OS error."""
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise checkpoint_write_error(tmp.parent / LATEST, exc) from None


def checkpoint_write_error(final: Path, exc: OSError):
    """``cannot write checkpoint PATH: disk full (No space left on device); ...`` as a RecordWriteError."""
    from hpcrl.io.errors import RecordWriteError

    code = exc.errno
    reason = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded"}.get(code, "write failed")
    what = os.strerror(code) if code else str(exc).splitlines()[0]
    kept = (f"the last checkpoint {final} is kept" if final.is_file() or (final.parent / PREVIOUS).is_file()
            else "no checkpoint was written")
    err = RecordWriteError(f"cannot write checkpoint {final}: {reason} ({what}); {kept}")
    err.errno, err.filename = code, str(final)
    return err


def load_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """The newest intact checkpoint's state (latest, else previous), or None when the run has none.

    Falling back to previous.pt prints one line on stderr naming the bad file and the one used;
    when checkpoints exist but none can be read, raises :class:`CheckpointError`.
    """
    folder = Path(run_dir) / CHECKPOINT_DIR
    candidates = (folder / LATEST, folder / PREVIOUS)
    if not any(p.is_file() for p in candidates):
        return None
    bad: list[str] = []
    for path in candidates:
        state, why = _try_load(path)
        if why is not None:
            bad.append(f"{path} ({why})")
            if (ident := _identity(path)) is not None:
                _unusable.add(ident)
            continue
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            found = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"{path}: checkpoint format {found!r}, this hpcrl reads {FORMAT}")
        if bad:
            _say_once(f"hpcrl: checkpoint {'; '.join(bad)} is unusable; resuming from {path}", candidates)
        return state
    raise CheckpointError(f"no intact checkpoint in {folder}: {'; '.join(bad)}")


_unusable: set[tuple] = set()
"""Identities (:func:`_identity`) of checkpoint files this process could not load."""
_said: set[tuple] = set()
"""The fallback lines this process has printed, with the files' identity then (a resume loads twice)."""


def _say_once(line: str, files: tuple[Path, ...]) -> None:
    """Print ``line`` on stderr unless this process printed it for these same files (inode, size, mtime)."""
    key = (line, tuple(_identity(p) for p in files))
    if key not in _said:
        _said.add(key)
        print(line, file=sys.stderr, flush=True)


def _identity(path: Path) -> tuple | None:
    """(device, inode, size, mtime) of ``path``, None when it is missing."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def said_here(line: str) -> bool:
    """True if this process printed ``line`` as a fallback line (the mpi launcher does not echo a rank's copy)."""
    return any(key[0] == line for key in _said)


def _try_load(path: Path) -> tuple[Any, str | None]:
    """(state, None), or (None, why ``path`` cannot serve as a checkpoint: missing, empty, truncated ...)."""
    if not path.is_file():
        return None, "missing"
    if path.stat().st_size == 0:
        return None, "empty file"
    import torch

    try:
        # our own file: it holds numpy RNG state and optimizer dicts, not only tensors
        return torch.load(path, map_location="cpu", weights_only=False), None
    except Exception as exc:  # noqa: BLE001 - any failure to load means: use the next one
        text = str(exc).splitlines()[0].split(". ")[0] if str(exc) else type(exc).__name__  # torch adds advice
        return None, f"truncated or corrupt: {text}"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
