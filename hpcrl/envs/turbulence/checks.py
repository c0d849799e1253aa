"""The checks that show the solver is a solver; tests assert on them, the bench prints them.

- ``laminar_poiseuille``: start-up plane Poiseuille flow from rest (plus a small random
  disturbance that must decay), no-slip walls, constant pressure gradient, compared with the
  analytic series solution u(y, t) = G/(2 nu)(1 - y^2) - sum_n 16 G (-1)^n cos((2n+1) pi y/2)
  exp(-(2n+1)^2 pi^2 nu t / 4) / (nu pi^3 (2n+1)^3).
- ``projection_divergence``: a random field projected once; max |div u| relative to max |u|.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcrl.envs.turbulence.grid import ChannelGrid
from hpcrl.envs.turbulence.solver import ChannelLES, SolverConfig


def poiseuille_startup(y: np.ndarray, t: float, dpdx: float, nu: float, terms: int = 400) -> np.ndarray:
    """Analytic start-up Poiseuille profile between walls at y = -1, 1 (t = inf: the parabola)."""
    u = dpdx / (2 * nu) * (1 - y**2)
    if np.isinf(t):
        return u
    for n in range(terms):
        m = 2 * n + 1
        u -= 16 * dpdx * (-1) ** n * np.cos(m * np.pi * y / 2) * np.exp(-(m * np.pi) ** 2 * nu * t / 4) / (nu * np.pi**3 * m**3)
    return u


@dataclass(frozen=True)
class LaminarResult:
    ny: int
    t: float
    error: float  # max |U - U_exact| / U_exact(centre)
    disturbance: float  # max |v| left of the initial disturbance
    divergence: float


def laminar_poiseuille(ny: int = 32, t_end: float = 2.0, dt: float = 0.05, nu: float = 0.1, dpdx: float = 1.0,
                       stretch: float = 1.5, disturbance: float = 1e-2, seed: int = 0) -> LaminarResult:
    """Run the full 3-D solver (8 x ny x 8) from rest to ``t_end`` and compare with the analytic profile."""
    g = ChannelGrid(8, ny, 8, stretch=stretch)
    s = ChannelLES(g, SolverConfig(nu=nu, dt=dt, wall="noslip", forcing="pressure_gradient", dpdx=dpdx, cs=0.0))
    rng = np.random.default_rng(seed)
    shape_c, shape_f = (ny, g.nx, g.nz), (ny + 1, g.nx, g.nz)
    s.set_velocity(*(disturbance * rng.standard_normal(sh) for sh in (shape_c, shape_f, shape_c)))
    s.advance(int(round(t_end / dt)))
    exact = poiseuille_startup(g.y_c, s.t, dpdx, nu)
    err = float(np.abs(s.mean_profile() - exact).max() / (dpdx / (2 * nu)))
    return LaminarResult(ny, s.t, err, float(np.abs(s.velocity()[1]).max()), s.max_divergence())


def projection_divergence(nx: int = 16, ny: int = 24, nz: int = 16, stretch: float = 2.0, seed: int = 0) -> tuple[float, float]:
    """(max |div u| / max |u| after one projection of a random field, the same before it)."""
    g = ChannelGrid(nx, ny, nz, stretch=stretch)
    s = ChannelLES(g, SolverConfig(nu=1e-3, dt=1e-3, wall="noslip", forcing="pressure_gradient"))
    rng = np.random.default_rng(seed)
    u, v, w = rng.standard_normal((ny, nx, nz)), rng.standard_normal((ny + 1, nx, nz)), rng.standard_normal((ny, nx, nz))
    v[0] = v[-1] = 0.0
    s.u_hat, s.v_hat, s.w_hat = g.to_spectral(u), g.to_spectral(v), g.to_spectral(w)
    before = s.max_divergence()
    s.projection.project(s.u_hat, s.v_hat, s.w_hat)
    scale = max(np.abs(a).max() for a in s.velocity())
    return s.max_divergence() / scale, before / scale
