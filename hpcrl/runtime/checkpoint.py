"""Atomic checkpoints of the parameter rank, and reading them back for ``--resume``.

A checkpoint is one ``torch.save`` file, written to a temporary name in the same
directory, fsynced, then moved over ``checkpoints/latest.pt`` with ``os.replace`` (atomic on
POSIX filesystems, Lustre included), so a job killed mid-write leaves the previous
checkpoint intact. The previous one is kept as ``previous.pt``.
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_DIR = "checkpoints"
LATEST = "latest.pt"
PREVIOUS = "previous.pt"
FORMAT = 1


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / LATEST


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch generator states (torch CUDA too when present)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically as the latest checkpoint; returns its path."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / LATEST
    tmp = folder / f".{LATEST}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        torch.save({"format": FORMAT, **state}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    if final.exists():
        os.replace(final, folder / PREVIOUS)
    os.replace(tmp, final)
    _fsync_dir(folder)
    return final


def load_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """The latest checkpoint's state, or None when the run has none."""
    path = checkpoint_path(run_dir)
    if not path.is_file():
        return None
    # our own file: it holds numpy RNG state and optimizer dicts, not only tensors
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')!r}, this hpcrl reads {FORMAT}")
    return state


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
