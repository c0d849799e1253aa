"""Fixed byte layouts for dicts of numpy arrays (pure numpy: both runners and ClusterEnv use them).

:class:`PackedLayout` puts fields ``{name: (shape, dtype)}`` at fixed offsets of one ``uint8`` buffer
(one MPI message, no pickle); every field starts at a multiple of 8 bytes, and :meth:`PackedLayout.views`
gives arrays that are views into a buffer, so the sender writes in place and the receiver reads in place.
:class:`FragmentLayout` is the layout of one trajectory fragment: it packs a fragment and unpacks it with
the same dtypes and shapes, so a learner sees identical arrays whether the fragment crossed MPI or
stayed in the process. ClusterEnv's step messages are PackedLayouts too (:mod:`hpcrl.clusterenv.protocol`).
"""
from __future__ import annotations

import numpy as np

META = ("policy_version", "actor", "fragment")
"""Scalar int64 fields of every fragment (the sender fills ``actor`` and ``fragment`` when absent)."""


class PackedLayout:
    """Fields ``{name: (shape, dtype)}`` at fixed offsets in one byte buffer of ``nbytes``."""

    def __init__(self, fields: dict[str, tuple[tuple, object]]):
        self.fields: dict[str, tuple[tuple, np.dtype, int]] = {}
        offset = 0
        for name, (shape, dtype) in fields.items():
            dtype = np.dtype(dtype)
            self.fields[name] = (tuple(shape), dtype, offset)
            offset += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // 8) * 8
        self.nbytes = offset

    def empty(self, extra: int = 0) -> np.ndarray:
        """A zeroed buffer of ``nbytes + extra`` bytes (``extra``: room after the fields)."""
        return np.zeros(self.nbytes + extra, dtype=np.uint8)

    def views(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        """Field arrays that are views into the first ``nbytes`` of ``buf``."""
        if buf.dtype != np.uint8 or buf.size < self.nbytes:
            raise ValueError(f"{type(self).__name__}: buffer must be uint8 of at least {self.nbytes} bytes")
        out = {}
        for name, (shape, dtype, offset) in self.fields.items():
            n = int(np.prod(shape, dtype=np.int64))
            out[name] = buf[offset:offset + n * dtype.itemsize].view(dtype).reshape(shape)
        return out


class FragmentLayout(PackedLayout):
    """Fixed byte layout of one fragment of T steps from N environments.

    Fields (shape, dtype): obs (T, N, *obs_shape) obs_dtype; actions (T, N, *action_shape)
    action_dtype; rewards, behaviour_logp, values, final_values (T, N) float32 (final_values:
    value of the true final observation where ``truncated``, for the bootstrap); terminated,
    truncated (T, N) bool; last_value (N,) float32 (value of the observation after the last step);
    policy_version, actor, fragment: int64 scalars; plus any ``extra`` {name: (shape, dtype)}.
    Every field starts at a multiple of 8 bytes.
    """

    def __init__(self, T: int, N: int, obs_shape=(), obs_dtype=np.float32, action_shape=(),
                 action_dtype=np.int64, extra: dict | None = None):
        if T < 1 or N < 1:
            raise ValueError(f"FragmentLayout: T and N must be >= 1 (got T={T}, N={N})")
        self.T, self.N = T, N
        steps = (T, N)
        spec = {
            "obs": (steps + tuple(obs_shape), obs_dtype),
            "actions": (steps + tuple(action_shape), action_dtype),
            "rewards": (steps, np.float32),
            "terminated": (steps, np.bool_),
            "truncated": (steps, np.bool_),
            "behaviour_logp": (steps, np.float32),
            "values": (steps, np.float32),
            "final_values": (steps, np.float32),
            "last_value": ((N,), np.float32),
            **{name: ((), np.int64) for name in META},
        }
        for name, (shape, dtype) in (extra or {}).items():
            if name in spec:
                raise ValueError(f"FragmentLayout: extra field {name!r} clashes with a standard field")
            spec[name] = (tuple(shape), dtype)
        super().__init__(spec)

    def empty_buffer(self) -> np.ndarray:
        return self.empty()

    def views(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        """Field arrays that are views into ``buf`` (uint8, exactly nbytes): write a fragment in place."""
        if buf.dtype != np.uint8 or buf.size != self.nbytes:
            raise ValueError(f"FragmentLayout: buffer must be uint8 of {self.nbytes} bytes")
        return super().views(buf)

    def pack(self, fragment: dict, out: np.ndarray | None = None) -> np.ndarray:
        """Copy a fragment dict into one byte buffer (``out`` if given); shapes must match exactly."""
        out = self.empty_buffer() if out is None else out
        for name, view in self.views(out).items():
            if name not in fragment:
                raise KeyError(f"fragment lacks field {name!r}")
            value = np.asarray(fragment[name])
            if value.shape != view.shape:
                raise ValueError(f"fragment field {name!r}: shape {value.shape}, layout expects {view.shape}")
            np.copyto(view, value, casting="unsafe")
        return out

    def unpack(self, buf: np.ndarray, copy: bool = True) -> dict[str, np.ndarray]:
        """Field arrays from a packed buffer (copied once, or views when ``copy`` is False); scalars as int."""
        views = self.views(buf.copy() if copy else buf)
        for name in META:
            views[name] = int(views[name])
        return views


def fragment_layout(num_envs: int, fragment_length: int, obs_shape: tuple, action_shape: tuple,
                    discrete: bool, obs_dtype=np.float32) -> FragmentLayout:
    """The layout actors and learners agree on: the standard fields plus ``last_obs`` (the
    learner recomputes the bootstrap value with the newest weights from it); observations in
    ``obs_dtype`` (uint8 for Atari frames, else float32)."""
    N = num_envs
    return FragmentLayout(fragment_length, N, obs_shape=obs_shape, obs_dtype=obs_dtype,
                          action_shape=action_shape, action_dtype=np.int64 if discrete else np.float32,
                          extra={"last_obs": ((N, *obs_shape), obs_dtype)})
