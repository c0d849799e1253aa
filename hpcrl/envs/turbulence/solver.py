"""Wall-modelled LES of plane channel flow (incompressible, delta = 1, rho = 1).

    du/dt + div(u u + tau_sgs) = -grad p + nu lap u + f e_x,   div u = 0.

Discretisation (see ``grid.py`` and docs/turbulence.md): Fourier-Galerkin in x and z with the
2/3 rule, conservative second-order finite volumes on a stretched staggered grid in y. Time:
the low-storage RK3 / Crank-Nicolson scheme of Spalart, Moser & Rogers (1991, J. Comput. Phys.
96, Eq. 19 and Table) with nu d2/dy2 implicit and everything else explicit, and a pressure
projection after each substage (``projection.py``). Forcing: a constant pressure gradient
(``f = dpdx``) or a constant flow rate (the mean mode is reset to the target bulk velocity after
each substage; the implied ``f`` is recorded). Walls: no-slip, or the wall-stress condition of
wall-modelled LES (the momentum flux through the wall is the wall model's tau_w, aligned with the
velocity at the matching cell; v = 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from hpcrl.envs.turbulence.grid import ChannelGrid, Tridiagonal, tridiagonal_matvec
from hpcrl.envs.turbulence.projection import PressureProjection
from hpcrl.envs.turbulence.sgs import mixing_length_squared, strain_magnitude
from hpcrl.errors import ConfigError

# Spalart, Moser & Rogers (1991): gamma, zeta explicit; alpha, beta Crank-Nicolson weights
GAMMA = (8 / 15, 5 / 12, 3 / 4)
ZETA = (0.0, -17 / 60, -5 / 12)
ALPHA = (29 / 96, -3 / 40, 1 / 6)
BETA = (37 / 160, 5 / 24, 1 / 6)

WallStress = Callable[[np.ndarray], np.ndarray]


class SolverDiverged(RuntimeError):
    """The velocity field stopped being finite."""


@dataclass(frozen=True)
class SolverConfig:
    nu: float
    """Kinematic viscosity (1 / Re_tau when u_tau = delta = 1)."""
    dt: float
    """Time step (fixed)."""
    wall: Literal["wallstress", "noslip"] = "wallstress"
    """Wall boundary condition."""
    forcing: Literal["flow_rate", "pressure_gradient"] = "flow_rate"
    """Constant flow rate or constant pressure gradient."""
    dpdx: float = 1.0
    """Body force -dP/dx (pressure_gradient); first estimate of it (flow_rate)."""
    bulk_velocity: float = 1.0
    """Target bulk velocity (flow_rate)."""
    cs: float = 0.1
    """Smagorinsky constant (0 = no subgrid model)."""
    matching_cell: int = 2
    """Cell index, counted from each wall, whose velocity feeds the wall model."""

    def check(self, grid: ChannelGrid) -> None:
        if self.nu <= 0 or self.dt <= 0:
            raise ConfigError(f"solver.nu/dt: must be positive, got nu={self.nu}, dt={self.dt}")
        if self.wall not in ("wallstress", "noslip"):
            raise ConfigError(f"solver.wall: must be 'wallstress' or 'noslip', got {self.wall!r}")
        if self.forcing not in ("flow_rate", "pressure_gradient"):
            raise ConfigError(f"solver.forcing: must be 'flow_rate' or 'pressure_gradient', got {self.forcing!r}")
        if not 0 <= self.matching_cell < grid.ny // 2:
            raise ConfigError(f"solver.matching_cell: must be in [0, {grid.ny // 2 - 1}], got {self.matching_cell}")


class ChannelLES:
    """The flow state (spectral u, v, w) and its time step."""

    def __init__(self, grid: ChannelGrid, config: SolverConfig, wall_model: WallStress | None = None):
        config.check(grid)
        self.grid, self.cfg = grid, config
        self.wall_model = wall_model
        self.projection = PressureProjection(grid)
        self._l2 = mixing_length_squared(grid, config.cs)
        self._lc = grid.d2dy2_centre("dirichlet" if config.wall == "noslip" else "neumann")
        self._lf = grid.d2dy2_face()
        nu, dt = config.nu, config.dt
        self._implicit = [
            tuple(Tridiagonal(-b * dt * nu * sub, 1.0 - b * dt * nu * d, -b * dt * nu * sup) for sub, d, sup in (self._lc, self._lf))
            for b in BETA
        ]
        spec = grid.spectral_shape
        self.u_hat = np.zeros((grid.ny,) + spec, complex)
        self.v_hat = np.zeros((grid.ny + 1,) + spec, complex)
        self.w_hat = np.zeros((grid.ny,) + spec, complex)
        self.forcing = config.dpdx
        self.t, self.steps = 0.0, 0
        m = config.matching_cell
        self.rows = (m, grid.ny - 1 - m)  # matching cell of the bottom and the top wall
        self.h = float(grid.wall_distance[m])
        self.tau_w = np.zeros((2, grid.nx, grid.nz))  # wall-stress magnitude, last evaluated
        self._tau_xz = np.zeros((2, 2, grid.nx, grid.nz))  # (x|z, wall, x, z)

    # ---- state ----
    def set_velocity(self, u: np.ndarray, v: np.ndarray, w: np.ndarray) -> None:
        """Load physical fields (v on all ny+1 faces; its wall values are ignored) and project."""
        g = self.grid
        self.u_hat, self.w_hat = g.to_spectral(u), g.to_spectral(w)
        self.v_hat = g.to_spectral(v)
        self.v_hat[0] = self.v_hat[-1] = 0.0
        self.projection.project(self.u_hat, self.v_hat, self.w_hat)
        if self.cfg.forcing == "flow_rate":
            self.u_hat[:, 0, 0] += self.cfg.bulk_velocity - self.bulk_velocity()

    def velocity(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g = self.grid
        return g.to_physical(self.u_hat), g.to_physical(self.v_hat), g.to_physical(self.w_hat)

    def state(self) -> dict[str, np.ndarray]:
        return {"u_hat": self.u_hat.copy(), "v_hat": self.v_hat.copy(), "w_hat": self.w_hat.copy(),
                "t": np.float64(self.t), "forcing": np.float64(self.forcing)}

    def load_state(self, s: dict[str, np.ndarray]) -> None:
        self.u_hat, self.v_hat, self.w_hat = (np.array(s[k], complex) for k in ("u_hat", "v_hat", "w_hat"))
        self.t, self.forcing = float(s["t"]), float(s["forcing"])

    # ---- the right-hand side ----
    def _wall_stress(self, u: np.ndarray, w: np.ndarray) -> None:
        speed, ur, wr = self.matching_speed(u, w)
        self.tau_w = np.asarray(self.wall_model(speed), dtype=np.float64)
        ratio = self.tau_w / np.maximum(speed, 1e-12)
        self._tau_xz[0], self._tau_xz[1] = ratio * ur, ratio * wr

    def matching_speed(self, u: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(|U|, u, w) at the matching cell of both walls, each (2, nx, nz)."""
        ur, wr = u[list(self.rows)], w[list(self.rows)]
        return np.sqrt(ur * ur + wr * wr), ur, wr

    def _rhs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        g, nu = self.grid, self.cfg.nu
        uh, vh, wh = self.u_hat, self.v_hat, self.w_hat
        u, w, ux, uz, wx, wz = g.to_physical(np.stack([uh, wh, g.ikx * uh, g.ikz * uh, g.ikx * wh, g.ikz * wh]))
        v, vx, vz = g.to_physical(np.stack([vh, g.ikx * vh, g.ikz * vh]))
        dudy_f, dwdy_f = g.ddy_centres_to_face(u), g.ddy_centres_to_face(w)
        fxx, fxz, fzz = u * u, u * w, w * w
        vc = g.face_to_centre(v)
        fyy = vc * vc
        fxy = np.zeros_like(v)
        fzy = np.zeros_like(v)
        fxy[1:-1] = g.centre_to_face(u) * v[1:-1]
        fzy[1:-1] = g.centre_to_face(w) * v[1:-1]
        if self.cfg.cs > 0:
            s22 = g.ddy_faces_to_centre(v)
            s12 = 0.5 * (_faces_to_centres(dudy_f) + g.face_to_centre(vx))
            s23 = 0.5 * (_faces_to_centres(dwdy_f) + g.face_to_centre(vz))
            s13 = 0.5 * (uz + wx)
            nut = self._l2 * strain_magnitude(ux, s22, wz, s12, s13, s23)
            fxx -= 2 * nut * ux
            fzz -= 2 * nut * wz
            fxz -= 2 * nut * s13
            fyy -= 2 * nut * s22
            nut_f = g.centre_to_face(nut)
            fxy[1:-1] -= nut_f * (dudy_f + vx[1:-1])
            fzy[1:-1] -= nut_f * (dwdy_f + vz[1:-1])
        if self.cfg.wall == "wallstress":
            self._wall_stress(u, w)
            # flux of x (z) momentum through the wall: -tau at the bottom, +tau at the top
            fxy[0], fxy[-1] = -self._tau_xz[0, 0], self._tau_xz[0, 1]
            fzy[0], fzy[-1] = -self._tau_xz[1, 0], self._tau_xz[1, 1]
        c = g.to_spectral(np.stack([fxx, fxz, fzz, fyy]))
        f = g.to_spectral(np.stack([fxy, fzy]))
        nu_k2 = nu * g.k2
        nu_ = -(g.ikx * c[0] + g.ikz * c[1] + g.ddy_faces_to_centre(f[0])) - nu_k2 * uh
        nw_ = -(g.ikx * c[1] + g.ikz * c[2] + g.ddy_faces_to_centre(f[1])) - nu_k2 * wh
        nv_ = -(g.ikx * f[0, 1:-1] + g.ikz * f[1, 1:-1] + g.ddy_centres_to_face(c[3])) - nu_k2 * vh[1:-1]
        nu_[:, 0, 0] += self.forcing
        return nu_, nv_, nw_

    # ---- time stepping ----
    def step(self) -> None:
        """One RK3 step: three substages, each implicit in nu d2/dy2 and followed by the projection."""
        if self.cfg.wall == "wallstress" and self.wall_model is None:
            raise ConfigError("solver.wall_model: the wall-stress condition needs a wall model")
        dt, nu = self.cfg.dt, self.cfg.nu
        prev = None
        added = 0.0
        for k in range(3):
            n_u, n_v, n_w = self._rhs()
            a, gm, z = ALPHA[k] * dt * nu, GAMMA[k] * dt, ZETA[k] * dt
            ru = self.u_hat + gm * n_u + a * tridiagonal_matvec(*self._lc, self.u_hat)
            rw = self.w_hat + gm * n_w + a * tridiagonal_matvec(*self._lc, self.w_hat)
            rv = self.v_hat[1:-1] + gm * n_v + a * tridiagonal_matvec(*self._lf, self.v_hat[1:-1])
            if prev is not None:
                ru += z * prev[0]
                rv += z * prev[1]
                rw += z * prev[2]
            imp_c, imp_f = self._implicit[k]
            self.u_hat, self.w_hat = imp_c.solve(ru), imp_c.solve(rw)
            self.v_hat[1:-1] = imp_f.solve(rv)
            self.projection.project(self.u_hat, self.v_hat, self.w_hat)
            if self.cfg.forcing == "flow_rate":
                delta = self.cfg.bulk_velocity - self.bulk_velocity()
                self.u_hat[:, 0, 0] += delta
                added += delta
            prev = (n_u, n_v, n_w)
        self.forcing += added / dt  # the mean body force this step actually applied
        self.t += dt
        self.steps += 1
        if not np.all(np.isfinite(self.u_hat[:, 0, 0])):
            raise SolverDiverged(f"non-finite velocity at t={self.t:.4g} (step {self.steps})")

    def advance(self, n: int) -> None:
        for _ in range(n):
            self.step()

    # ---- diagnostics ----
    def mean_profile(self) -> np.ndarray:
        """<u>(y) at the cell centres."""
        return self.grid.plane_mean(self.u_hat).copy()

    def bulk_velocity(self) -> float:
        return self.grid.bulk(self.u_hat[:, 0, 0].real)

    def wall_shear_x(self) -> np.ndarray:
        """Streamwise wall shear stress (2, nx, nz) on (bottom, top), positive for flow in +x."""
        if self.cfg.wall == "wallstress":
            return self._tau_xz[0].copy()
        g = self.grid
        u = g.to_physical(self.u_hat[[0, -1]])
        return self.cfg.nu * u / np.array([g.y_c[0] + 1.0, 1.0 - g.y_c[-1]])[:, None, None]

    def max_divergence(self) -> float:
        """max |div u| over the cell centres (physical space)."""
        return float(np.abs(self.grid.to_physical(self.projection.divergence(self.u_hat, self.v_hat, self.w_hat))).max())

    def cfl(self) -> float:
        g = self.grid
        u, v, w = self.velocity()
        rate = np.abs(u) / g.dx + np.abs(g.face_to_centre(v)) / g.dy[:, None, None] + np.abs(w) / g.dz
        return float(self.cfg.dt * rate.max())

    def matching_gradient(self) -> tuple[np.ndarray, np.ndarray]:
        """(|U|, d|U|/dn) at the matching cell of both walls, n the distance from the wall; (2, nx, nz) each."""
        g = self.grid
        u, w = g.to_physical(self.u_hat), g.to_physical(self.w_hat)
        speed = np.sqrt(u * u + w * w)
        m = self.cfg.matching_cell
        out = []
        for rows, n in (((m - 1, m, m + 1), g.y_c + 1.0), ((g.ny - m, g.ny - 1 - m, g.ny - 2 - m), 1.0 - g.y_c)):
            lo, mid, hi = rows
            if m == 0:  # one-sided from the wall cell
                out.append((speed[hi] - speed[mid]) / (n[hi] - n[mid]))
                continue
            h1, h2 = n[mid] - n[lo], n[hi] - n[mid]
            out.append(((speed[hi] - speed[mid]) * h1 / h2 + (speed[mid] - speed[lo]) * h2 / h1) / (h1 + h2))
        return speed[list(self.rows)], np.stack(out)


def _faces_to_centres(qf: np.ndarray) -> np.ndarray:
    """Centre values from the ny-1 interior faces: the mean of the two faces, one-sided at the walls."""
    out = np.empty((qf.shape[0] + 1,) + qf.shape[1:], qf.dtype)
    out[1:-1] = 0.5 * (qf[:-1] + qf[1:])
    out[0], out[-1] = qf[0], qf[-1]
    return out
