"""Step infos as packed numpy, not pickle: a worker sends each distinct info shape (a schema) once.

Gymnasium's vector infos are nested dicts whose leaves are arrays with one entry per env
(numbers, plus a boolean ``_key`` mask per key) or object arrays (``final_obs``: the final
observation where an env ended, ``None`` elsewhere). A worker flattens its infos into leaves
``(path, kind, dtype, shape)``; the tuple of leaves is the *schema*. A schema the head has not
seen from this worker travels once (pickled, a few hundred bytes); afterwards a step sends only
the schema's number and the leaves' bytes. Leaves of kind ``objects`` carry a presence mask and
a dense block. Infos that do not fit (strings, dicts inside object arrays) fall back to pickle
for that step only. The head merges the workers' leaves into arrays over all ``num_envs``,
filling envs that lack a key the way Gymnasium's ``VectorEnv._add_info`` does (zeros, ``None``).
"""
from __future__ import annotations

import pickle

import numpy as np

from hpcrl.runtime.transport.layout import PackedLayout

Leaf = tuple  # (path: tuple[str, ...], kind: str, dtype: str, shape: tuple)
EMPTY = "empty-dict"
"""The leaf value standing for an empty dict (Gymnasium keeps ``final_info = {}`` for envs without infos)."""


def _to_numpy(value):
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch
        return value.detach().cpu().numpy()
    return value


def flatten(info: dict, k: int, path: tuple = ()) -> dict[tuple, np.ndarray]:
    """Leaves of a nested vector info dict: ``{path: array with k rows}`` (ValueError if not vector-shaped)."""
    out: dict[tuple, np.ndarray] = {}
    for key, value in info.items():
        here = path + (str(key),)
        if isinstance(value, dict):
            out.update(flatten(value, k, here) if value else {here: EMPTY})
            continue
        arr = np.asarray(_to_numpy(value))
        if arr.ndim == 0 or arr.shape[0] != k:
            raise ValueError(f"info {'/'.join(here)!r}: not one entry per env")
        out[here] = arr
    return out


def unflatten(leaves: dict[tuple, np.ndarray]) -> dict:
    info: dict = {}
    for path, arr in leaves.items():
        node = info
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = {} if isinstance(arr, str) else arr
    return info


def _object_leaf(arr: np.ndarray):
    """(dtype, shape) when every entry is None or a numeric array of one shape and dtype; else None."""
    items = [x for x in arr if x is not None]
    if not items:
        return "", ()
    first = np.asarray(items[0])
    if first.dtype.kind not in "biufc":
        return None
    for x in items:
        if not isinstance(x, (np.ndarray, np.generic)) or x.shape != first.shape or x.dtype != first.dtype:
            return None
    return first.dtype.str, first.shape


class InfoEncoder:
    """Worker side: infos -> (schema id, new schema or None, packed bytes), or a pickle for odd infos."""

    PICKLED = -1

    def __init__(self, k: int):
        self.k = k
        self._ids: dict[tuple, int] = {}
        self._layouts: list[PackedLayout] = []

    def encode(self, info: dict) -> tuple[int, tuple | None, np.ndarray]:
        try:
            leaves = flatten(info, self.k)
            schema = self._schema(leaves)
        except ValueError:
            return self.PICKLED, None, np.frombuffer(pickle.dumps(info, protocol=5), dtype=np.uint8)
        new = None
        if schema not in self._ids:
            self._ids[schema] = len(self._layouts)
            self._layouts.append(layout(schema, self.k))
            new = schema
        sid = self._ids[schema]
        lay = self._layouts[sid]
        buf = lay.empty()
        views = lay.views(buf)
        for i, (path, kind, _, _) in enumerate(schema):
            arr, name = leaves[path], str(i)
            if kind == "array":
                views[name][...] = arr
            elif kind == "objects":
                present = np.array([x is not None for x in arr])
                views[name + "?"][...] = present
                for i in np.flatnonzero(present):
                    views[name][i] = arr[i]
        return sid, new, buf

    def _schema(self, leaves: dict) -> tuple:
        schema = []
        for path, arr in leaves.items():
            if isinstance(arr, str):
                schema.append((path, "dict", "", ()))
                continue
            if arr.dtype.kind in "biufc":
                schema.append((path, "array", arr.dtype.str, arr.shape[1:]))
                continue
            found = _object_leaf(arr) if arr.dtype == object else None
            if found is None:
                raise ValueError(f"info {'/'.join(path)!r}: not packable")
            dtype, shape = found
            schema.append((path, "objects" if dtype else "none", dtype, shape))
        return tuple(schema)


def layout(schema: tuple, k: int) -> PackedLayout:
    """The byte layout of one schema's leaves for ``k`` envs: leaf i is field ``str(i)`` (plus
    ``str(i) + "?"``, the presence mask, for ``objects``; ``none`` leaves hold no bytes)."""
    fields = {}
    for i, (_, kind, dtype, shape) in enumerate(schema):
        if kind in ("array", "objects"):
            fields[str(i)] = ((k, *shape), dtype)
        if kind == "objects":
            fields[str(i) + "?"] = ((k,), np.bool_)
    return PackedLayout(fields)


class InfoDecoder:
    """Head side, one per worker: the schemas that worker sent, and its packed infos -> leaves."""

    def __init__(self, k: int):
        self.k = k
        self.schemas: list[tuple] = []
        self._layouts: list[PackedLayout] = []

    def add_schema(self, schema: tuple) -> None:
        self.schemas.append(schema)
        self._layouts.append(layout(schema, self.k))

    def known(self, sid: int) -> bool:
        return sid == InfoEncoder.PICKLED or sid < len(self.schemas)

    def decode(self, sid: int, buf: np.ndarray) -> dict[tuple, np.ndarray]:
        if sid == InfoEncoder.PICKLED:
            return flatten(pickle.loads(buf.tobytes()), self.k)
        schema, lay = self.schemas[sid], self._layouts[sid]
        views = lay.views(buf)
        out = {}
        for i, (path, kind, _, _) in enumerate(schema):
            if kind == "array":
                out[path] = views[str(i)].copy()
            elif kind == "dict":
                out[path] = EMPTY
            else:
                arr = np.full(self.k, None, dtype=object)
                if kind == "objects":
                    dense = views[str(i)]
                    for j in np.flatnonzero(views[str(i) + "?"]):
                        arr[j] = dense[j].copy()
                out[path] = arr
        return out

    def nbytes(self, sid: int) -> int:
        return 0 if sid == InfoEncoder.PICKLED else self._layouts[sid].nbytes


def merge(parts: list[tuple[int, int, dict]], num_envs: int) -> dict:
    """Leaves of each worker ``(lo, hi, leaves)`` -> one Gymnasium vector info dict over ``num_envs``."""
    merged: dict[tuple, np.ndarray] = {}
    for lo, hi, leaves in parts:
        for path, arr in leaves.items():
            if isinstance(arr, str):
                merged.setdefault(path, arr)
                continue
            if path not in merged or isinstance(merged[path], str):
                if arr.dtype == object:
                    merged[path] = np.full(num_envs, None, dtype=object)
                else:
                    merged[path] = np.zeros((num_envs, *arr.shape[1:]), dtype=arr.dtype)
            merged[path][lo:hi] = arr
    return unflatten(merged)
