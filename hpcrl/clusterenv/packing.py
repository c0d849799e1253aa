"""A fixed byte layout for a dict of numpy arrays: one ``uint8`` buffer, one MPI message, no pickle.

Every field starts at a multiple of 8 bytes; :meth:`PackedLayout.views` gives arrays that are
views into a buffer, so the sender writes in place and the receiver reads in place.
"""
from __future__ import annotations

import numpy as np


class PackedLayout:
    """Fields ``{name: (shape, dtype)}`` at fixed offsets in one byte buffer of ``nbytes``."""

    def __init__(self, fields: dict[str, tuple[tuple, object]]):
        self.fields: dict[str, tuple[tuple, np.dtype, int]] = {}
        offset = 0
        for name, (shape, dtype) in fields.items():
            dtype = np.dtype(dtype)
            self.fields[name] = (tuple(shape), dtype, offset)
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            offset += -(-size // 8) * 8
        self.nbytes = offset

    def empty(self, extra: int = 0) -> np.ndarray:
        """A zeroed buffer of ``nbytes + extra`` bytes (``extra``: room after the fields)."""
        return np.zeros(self.nbytes + extra, dtype=np.uint8)

    def views(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        """Field arrays that are views into the first ``nbytes`` of ``buf``."""
        if buf.dtype != np.uint8 or buf.size < self.nbytes:
            raise ValueError(f"PackedLayout: buffer must be uint8 of at least {self.nbytes} bytes")
        out = {}
        for name, (shape, dtype, offset) in self.fields.items():
            n = int(np.prod(shape, dtype=np.int64))
            out[name] = buf[offset:offset + n * dtype.itemsize].view(dtype).reshape(shape)
        return out
