"""A sweep's state: one small JSON file, ``SWEEP_DIR/sweep.json``, read and rewritten under a lock.

It holds the spec's path and, per run, what it runs and its status::

    {"name": "fig11", "spec": "/path/fig11.yaml",
     "runs": {"sync-s0": {"status": "done", "attempts": 1, "exit": 0, "seconds": 812.4, "message": "",
                          "config": "/path/hopper_ppo.yaml", "config_sha256": "...", "overrides": [...]}, ...}}

Statuses: ``pending`` (never started), ``running`` (started by a sweep process or array task that may still
run), ``stopped`` (ended by a signal or a walltime after its checkpoint: it resumes), ``failed`` (exit code
other than 0 and 3; its message is the last line it printed), ``done`` (ended by its stop rule). A run left
``running`` by a sweep that was killed is resumed by the next one, as ``stopped`` is.

Every change is a read-modify-write under ``fcntl.flock`` on ``sweep.lock`` and lands by an atomic rename, so
array tasks on one file system (and a killed writer) never leave a torn or lost update. (flock between nodes
needs a file system that supports it: Lustre mounted with ``flock``, as on Perlmutter's scratch, or NFSv4.)
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Iterator

from hpcrl.errors import ConfigError
from hpcrl.sweep.spec import SweepSpec

STATE_FILE = "sweep.json"
LOCK_FILE = "sweep.lock"
STATUSES = ("pending", "running", "stopped", "failed", "done")


class SweepState:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.path = self.dir / STATE_FILE

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.dir / LOCK_FILE, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read(self) -> dict:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{self.dir} is not a sweep directory (no {STATE_FILE})") from None

    def _write(self, data: dict) -> None:
        tmp = self.path.with_name(f".{STATE_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)

    def open(self, spec: SweepSpec) -> dict:
        """The directory's state for ``spec``: made on first use; runs the spec added since are pending. A run
        the directory knows whose config (file or contents) or overrides the spec now changes is refused: its
        record would mix two settings."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            data = self.read() if self.path.exists() else {"name": spec.name, "runs": {}}
            for r in spec.runs:
                what = {"config": r.config, "config_sha256": r.config_sha256(), "overrides": list(r.overrides)}
                entry = data["runs"].get(r.name)
                if entry is None:
                    entry = data["runs"][r.name] = {"status": "pending", "attempts": 0, **what}
                elif any(entry.get(k) != v for k, v in what.items()):
                    key = next(k for k, v in what.items() if entry.get(k) != v)
                    raise ConfigError(f"{self.dir}: run {r.name} ran with another {key.replace('_sha256', ' file')} "
                                      f"({data.get('spec')}); use another --out, or undo the change")
                entry.update(config_name=r.config_name, arm=r.arm, seed=r.seed)  # for hpcrl analyze
            data["spec"] = spec.path
            self._write(data)
        return data

    def update(self, run: str, **fields) -> dict:
        """Set ``fields`` of ``run`` (``attempts=+1`` adds one); the state after."""
        with self._locked():
            data = self.read()
            entry = data["runs"][run]
            for key, value in fields.items():
                entry[key] = entry.get(key, 0) + 1 if value == "+1" else value
            self._write(data)
        return data

    def claim(self, runs: list[str], statuses=("pending", "stopped", "running")) -> str | None:
        """The first of ``runs`` whose status is in ``statuses``, marked running (one attempt more) under the lock,
        so two array tasks never take the same run; None when there is none."""
        with self._locked():
            data = self.read()
            for name in runs:
                entry = data["runs"][name]
                if entry["status"] in statuses:
                    entry.update(status="running", attempts=entry.get("attempts", 0) + 1, pid=os.getpid())
                    self._write(data)
                    return name
        return None


def counts(data: dict) -> dict[str, int]:
    out = dict.fromkeys(STATUSES, 0)
    for entry in data["runs"].values():
        out[entry["status"]] += 1
    return out
