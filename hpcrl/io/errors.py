"""The errors the HDF5 record raises at users."""
from __future__ import annotations

import errno as _errno
import os
import re
from pathlib import Path

from hpcrl.errors import ConfigError


class RunFileError(ConfigError):
    """A run file that is missing, truncated, foreign or from another schema: one line naming
    the file and what is missing (a ConfigError, so the CLI prints it and exits 2)."""


class RecordDamagedError(RunFileError):
    """A file whose HDF5 metadata is damaged (a checksum that does not match, a broken header): one line
    naming the file and the table (``kind`` 'table') or dataset that cannot be read, raised within a
    bounded time (:mod:`hpcrl.io.probe`). ``path`` and ``table`` (None: the file as a whole) are set.
    Reading never changes the file."""

    def __init__(self, path: str | Path, table: str | None, why: str, kind: str = "table"):
        where = f"{kind} '{table}'" if table else "file"
        super().__init__(f"{path}: {where} is damaged ({why})")
        self.path, self.table = str(path), table


class RecordWriteError(OSError):
    """Writing the record failed (disk full, quota, I/O error): one line naming the file and the error.

    Raised by the first failed flush of a writer; the writer has closed its file by then
    (keeping what earlier flushes wrote) and raises the same error at every later call.
    ``errno`` and ``filename`` are set as for any OSError; the message stays one line.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_ERRNO = re.compile(r"errno = (\d+)")
_PLAIN = {_errno.ENOSPC: "disk full at {path}", _errno.EDQUOT: "disk quota exceeded at {path}"}


def record_write_error(path: str | Path, exc: BaseException) -> RecordWriteError:
    """The RecordWriteError for h5py's ``exc`` (OSError or RuntimeError, message over several lines)."""
    text = str(exc)
    code = getattr(exc, "errno", None)
    if code is None and (m := _ERRNO.search(text)):
        code = int(m.group(1))
    if code in _PLAIN:
        message = f"{_PLAIN[code].format(path=path)} ({os.strerror(code)}); the record keeps what was flushed before"
    else:
        first = text.splitlines()[0] if text else type(exc).__name__
        reason = f"{os.strerror(code)}: {first}" if code and os.strerror(code) not in first else first
        message = f"cannot write {path} ({reason}); the record keeps what was flushed before"
    err = RecordWriteError(message)
    err.errno = code
    err.filename = str(path)
    return err
