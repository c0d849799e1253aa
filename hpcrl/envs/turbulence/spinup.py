"""Turbulent initial fields: a perturbed log-law profile run with the log-law wall model, cached on disk.

The spin-up runs once per preset (and per preset content: the file name carries a hash of it)
and stores ``snapshots`` states from its end in ``<cache_dir>/channel-<preset>-<hash>.npz``,
written to a temporary file and renamed, so concurrent actors never read half a file.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from hpcrl.envs.turbulence.grid import ChannelGrid
from hpcrl.envs.turbulence.presets import ChannelPreset
from hpcrl.envs.turbulence.solver import ChannelLES
from hpcrl.envs.turbulence.wall_models import B_LOG, KAPPA, EquilibriumWallModel

FORMAT_VERSION = 1


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "hpcrl" / "turbulence"


def log_law_profile(grid: ChannelGrid, nu: float, bulk_velocity: float) -> np.ndarray:
    """U(y) at the centres: y+ below 11, the log law above (u_tau = 1), scaled to the bulk velocity."""
    dplus = grid.wall_distance / nu
    u = np.where(dplus < 11.0, dplus, np.log(np.maximum(dplus, 1.0)) / KAPPA + B_LOG)
    return u * bulk_velocity / grid.bulk(u)


def initial_field(grid: ChannelGrid, nu: float, bulk_velocity: float, rng: np.random.Generator,
                  amplitude: float = 0.15, k_max: float = 6.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Log-law mean profile plus random large-scale fluctuations (amplitude x U_b, vanishing at the walls)."""

    def noise(n_y: int, y: np.ndarray) -> np.ndarray:
        a = grid.to_spectral(rng.standard_normal((n_y, grid.nx, grid.nz))) * (grid.k2 < k_max**2)
        return amplitude * bulk_velocity * (1 - y**2)[:, None, None] * grid.to_physical(a)

    u = log_law_profile(grid, nu, bulk_velocity)[:, None, None] + noise(grid.ny, grid.y_c)
    return u, noise(grid.ny + 1, grid.y_f), noise(grid.ny, grid.y_c)


def make_solver(preset: ChannelPreset) -> ChannelLES:
    """A solver for the preset with the equilibrium log-law wall model installed."""
    solver = ChannelLES(preset.grid(), preset.solver_config())
    solver.wall_model = EquilibriumWallModel(h=solver.h, nu=preset.nu)
    return solver


# preset fields that do not change the spun-up fields (kept out of the cache key)
_EPISODE_FIELDS = ("name", "agent_stride", "steps_per_action", "max_actions")


def cache_path(preset: ChannelPreset, cache_dir: str | os.PathLike | None, seed: int) -> Path:
    fields = {k: v for k, v in dataclasses.asdict(preset).items() if k not in _EPISODE_FIELDS}
    content = json.dumps({**fields, "seed": seed, "v": FORMAT_VERSION}, sort_keys=True)
    key = hashlib.sha1(content.encode()).hexdigest()[:12]
    return Path(cache_dir or default_cache_dir()) / f"channel-{preset.name}-{key}.npz"


def spin_up(preset: ChannelPreset, seed: int = 0, log=None) -> list[dict[str, np.ndarray]]:
    """Run the spin-up and return the snapshot states (the last ``snapshots`` every ``snapshot_every`` steps)."""
    solver = make_solver(preset)
    solver.set_velocity(*initial_field(solver.grid, preset.nu, preset.bulk_velocity, np.random.default_rng(seed)))
    first = preset.spinup_steps - (preset.snapshots - 1) * preset.snapshot_every
    if first < 1:
        raise ValueError("spinup_steps must exceed (snapshots - 1) * snapshot_every")
    solver.advance(first)
    states = [solver.state()]
    for _ in range(preset.snapshots - 1):
        solver.advance(preset.snapshot_every)
        states.append(solver.state())
        if log is not None:
            log(f"spin-up {preset.name}: t={solver.t:.2f} mean tau_w={solver.tau_w.mean():.4f}")
    return states


def load_or_spin_up(preset: ChannelPreset, cache_dir: str | os.PathLike | None = None, seed: int = 0,
                    log=None) -> list[dict[str, np.ndarray]]:
    """The cached snapshots of this preset, spinning up (and caching) on first use."""
    path = cache_path(preset, cache_dir, seed)
    if path.exists():
        with np.load(path) as data:
            n = int(data["snapshots"])
            return [{k: data[f"{i}/{k}"] for k in ("u_hat", "v_hat", "w_hat", "t", "forcing")} for i in range(n)]
    states = spin_up(preset, seed, log)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"{i}/{k}": v for i, s in enumerate(states) for k, v in s.items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.part")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, snapshots=len(states), **arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return states
