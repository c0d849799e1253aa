"""Reopen an HDF5 file whose SWMR writer was killed: clear the superblock's "open for write" flags.

A SWMR writer (libver v110 or later, superblock version 3) marks the superblock's file
consistency flags while it has the file open; a writer that is killed leaves them set and
HDF5 then refuses to open the file for writing ("file is already open for write ... may use
<h5clear file>"). SWMR readers are not affected. To resume into the same file without the
``h5clear -s`` tool, :func:`clear_write_flags` rewrites that one byte and the superblock's
Jenkins lookup3 checksum (HDF5 file format specification, "Superblock version 2 and 3").
Only call it when no writer has the file open.
"""
from __future__ import annotations

from pathlib import Path

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_M = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 hashlittle over bytes, as HDF5 checksums metadata (H5_checksum_lookup3)."""
    n = len(data)
    a = b = c = (0xDEADBEEF + n + initval) & _M
    if n == 0:
        return c
    padded = data + bytes((-n) % 12) if n % 12 else data
    blocks = len(padded) // 12
    for i in range(blocks):
        w = padded[12 * i: 12 * i + 12]
        a = (a + int.from_bytes(w[0:4], "little")) & _M
        b = (b + int.from_bytes(w[4:8], "little")) & _M
        c = (c + int.from_bytes(w[8:12], "little")) & _M
        if i == blocks - 1:
            break
        a = (a - c) & _M; a ^= _rot(c, 4); c = (c + b) & _M  # noqa: E702  (lookup3 mix)
        b = (b - a) & _M; b ^= _rot(a, 6); a = (a + c) & _M  # noqa: E702
        c = (c - b) & _M; c ^= _rot(b, 8); b = (b + a) & _M  # noqa: E702
        a = (a - c) & _M; a ^= _rot(c, 16); c = (c + b) & _M  # noqa: E702
        b = (b - a) & _M; b ^= _rot(a, 19); a = (a + c) & _M  # noqa: E702
        c = (c - b) & _M; c ^= _rot(b, 4); b = (b + a) & _M  # noqa: E702
    # lookup3 final
    c ^= b; c = (c - _rot(b, 14)) & _M  # noqa: E702
    a ^= c; a = (a - _rot(c, 11)) & _M  # noqa: E702
    b ^= a; b = (b - _rot(a, 25)) & _M  # noqa: E702
    c ^= b; c = (c - _rot(b, 16)) & _M  # noqa: E702
    a ^= c; a = (a - _rot(c, 4)) & _M  # noqa: E702
    b ^= a; b = (b - _rot(a, 14)) & _M  # noqa: E702
    c ^= b; c = (c - _rot(b, 24)) & _M  # noqa: E702
    return c


def _find_superblock(raw: bytes) -> int:
    offset = 0
    while offset < len(raw):  # at 0, 512, 1024, 2048 ... (after a user block)
        if raw[offset:offset + 8] == _SIGNATURE:
            return offset
        offset = 512 if offset == 0 else offset * 2
    raise ValueError("no HDF5 superblock signature")


def _superblock(fh) -> tuple[int, bytes]:
    head = fh.read(4096)
    at = _find_superblock(head)
    return at, head


def stored_eof(path: str | Path) -> int | None:
    """The size a v2/v3 superblock says the file has (base address + end-of-file address); None for other
    superblock versions or without an HDF5 signature."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            at, head = _superblock(fh)
    except (OSError, ValueError):
        return None
    if len(head) < at + 12 or head[at + 8] not in (2, 3):
        return None
    o = head[at + 9]
    base = int.from_bytes(head[at + 12: at + 12 + o], "little")
    return base + int.from_bytes(head[at + 12 + 2 * o: at + 12 + 3 * o], "little")


def is_truncated(path: str | Path) -> bool:
    """True if a v2/v3 superblock's end-of-file address lies beyond the file's size.

    HDF5 makes this check itself only for plain (non-SWMR) opens; an SWMR reader of a
    truncated file instead retries its metadata reads for a long time.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        at, head = _superblock(fh)
    if head[at + 8] not in (2, 3):
        return False
    o = head[at + 9]
    base = int.from_bytes(head[at + 12: at + 12 + o], "little")
    eof = int.from_bytes(head[at + 12 + 2 * o: at + 12 + 3 * o], "little")
    return base + eof > path.stat().st_size


def writer_has_open(path: str | Path) -> bool:
    """True while a v3 superblock's "open for write" flags are set: a writer has the file open, or was killed
    with it open (a writer that closes clears them). False for other superblock versions."""
    with open(Path(path), "rb") as fh:
        at, head = _superblock(fh)
    return head[at + 8] == 3 and head[at + 11] != 0


def clear_write_flags(path: str | Path) -> bool:
    """Make a v2/v3 file a killed writer left reopenable: clear the superblock's consistency flags and,
    as ``h5clear --increment`` does, raise its end-of-file address to the file's size (a writer killed
    between flushes may have placed objects past the address the superblock last recorded, and HDF5
    then refuses to grow them: "addr overflow"). True if anything was changed."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        at, head = _superblock(fh)
        version = head[at + 8]
        if version not in (2, 3):
            return False
        o = head[at + 9]  # size of offsets
        end = at + 12 + 4 * o  # signature..root object header address; checksum follows
        block = bytearray(head[at:end + 4])
        if int.from_bytes(block[-4:], "little") != lookup3(bytes(block[:-4])):
            raise ValueError(f"{path}: superblock checksum does not match; not clearing")
        base = int.from_bytes(block[12:12 + o], "little")
        eof_at = slice(12 + 2 * o, 12 + 3 * o)
        eof = int.from_bytes(block[eof_at], "little")
        changed = block[11] != 0 or base + eof < size
        if not changed:
            return False
        block[11] = 0
        block[eof_at] = max(eof, size - base).to_bytes(o, "little")
        block[-4:] = lookup3(bytes(block[:-4])).to_bytes(4, "little")
        fh.seek(at)
        fh.write(block)
    return True
