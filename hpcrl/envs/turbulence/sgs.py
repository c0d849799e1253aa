"""Smagorinsky subgrid model with Mason-Thomson wall damping.

nu_t = l^2 |S|, |S| = sqrt(2 S_ij S_ij) (Smagorinsky 1963), with the mixing length blended
towards kappa d near the wall (Mason & Thomson 1992, n = 2):

    1 / l^2 = 1 / (C_s Delta)^2 + 1 / (kappa d)^2,   Delta = (dx dy dz)^(1/3).
"""
from __future__ import annotations

import numpy as np

from hpcrl.envs.turbulence.grid import ChannelGrid


def mixing_length_squared(grid: ChannelGrid, cs: float, kappa: float = 0.41) -> np.ndarray:
    """l^2 at the cell centres, shape (ny, 1, 1); zero when cs = 0 (no model)."""
    if cs <= 0:
        return np.zeros((grid.ny, 1, 1))
    delta = (grid.dx * grid.dy * grid.dz) ** (1.0 / 3.0)
    inv = 1.0 / (cs * delta) ** 2 + 1.0 / (kappa * grid.wall_distance) ** 2
    return (1.0 / inv).reshape(-1, 1, 1)


def strain_magnitude(s11, s22, s33, s12, s13, s23) -> np.ndarray:
    """|S| = sqrt(2 S_ij S_ij) from the six independent components."""
    return np.sqrt(2.0 * (s11 * s11 + s22 * s22 + s33 * s33) + 4.0 * (s12 * s12 + s13 * s13 + s23 * s23))
