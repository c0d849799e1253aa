"""Writes the AAPS record (:mod:`hpcrl.clusterenv.schema`) on the head: per-worker KL and syncs, episodes."""
from __future__ import annotations

import time
from pathlib import Path

import h5py
import numpy as np

from hpcrl.clusterenv.schema import AAPS, EPISODES, KIND, SCHEMA_VERSION
from hpcrl.io.h5format import WRITE_LIBVER
from hpcrl.io.tables import FlushTimer, Table


class AAPSRecorder:
    def __init__(self, path: str | Path, opts, counts: list[int], flush_seconds: float = 2.0):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.file = h5py.File(path, "w", libver=WRITE_LIBVER, locking=False)
        a = self.file.attrs
        a["kind"], a["schema_version"], a["env_id"] = KIND, SCHEMA_VERSION, opts.env_id
        a["num_envs"], a["workers"] = opts.num_envs, opts.workers
        a["kl_threshold"], a["kl_window"], a["start_unix"] = opts.kl_threshold, opts.kl_window, time.time()
        a["label"] = f"kl_threshold={opts.kl_threshold:g}"
        self.aaps = Table.create(self.file, AAPS, "gzip")
        self.episodes = Table.create(self.file, EPISODES, "gzip")
        self.worker_of = np.repeat(np.arange(len(counts)), counts)
        self.start = time.monotonic()
        self.env_steps = 0
        self._ret = self._len = None
        self._timer = FlushTimer(flush_seconds)
        self.reset_episodes(int(sum(counts)))

    def _now(self) -> float:
        return time.monotonic() - self.start

    def reset_episodes(self, n: int) -> None:
        self._ret, self._len = np.zeros(n), np.zeros(n, dtype=np.int64)

    def step(self, rewards: np.ndarray, done: np.ndarray, versions: np.ndarray) -> None:
        self.env_steps += len(rewards)
        self._ret += rewards
        self._len += 1
        ended = np.flatnonzero(done)
        if ended.size:
            self.episodes.append({"time": self._now(), "env_steps": self.env_steps, "worker": self.worker_of[ended],
                                  "env_index": ended, "return": self._ret[ended], "length": self._len[ended],
                                  "policy_version": versions[ended]})
            self._ret[ended], self._len[ended] = 0.0, 0
        self.maybe_flush()

    def publish(self, version: int, kl: np.ndarray, syncs: np.ndarray, cached: np.ndarray) -> None:
        w = np.arange(len(kl))
        self.aaps.append({"time": self._now(), "env_steps": self.env_steps, "version": version, "worker": w,
                          "kl": kl, "syncs": syncs, "cached_version": cached})
        self.maybe_flush()

    def maybe_flush(self) -> None:
        if self._timer.due():
            self.flush()

    def flush(self) -> None:
        self.aaps.flush()
        self.episodes.flush()
        self.file.flush()

    def close(self) -> None:
        if self.file.id.valid:
            self.flush()
            self.file.close()
