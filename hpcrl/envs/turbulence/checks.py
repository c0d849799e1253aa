"""The checks that show the solver is a solver; tests assert on them, the bench prints them.

- ``laminar_poiseuille``: start-up plane Poiseuille flow from rest (plus a small random 3-D
  disturbance of zero plane mean that must decay), no-slip walls, constant pressure gradient, compared with the
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
    # zero plane mean: the disturbance is 3-D only, so the mean flow starts from rest as the
    # analytic solution does (a random mean profile would decay slowly and bias the error)
    u, v, w = (disturbance * rng.standard_normal(sh) for sh in (shape_c, shape_f, shape_c))
    s.set_velocity(*(a - a.mean(axis=(1, 2), keepdims=True) for a in (u, v, w)))
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


@dataclass(frozen=True)
class TurbulentResult:
    preset: str
    grid: tuple[int, int, int]
    t_end: float
    t_average_from: float
    re_tau: float  # sqrt(<tau_w>) / nu
    tau_w: float  # <tau_w> over walls and the averaging window (target 1)
    tau_error: float  # |<tau_w> - 1|
    log_law_error: float  # max |U+ - (ln y+ / kappa + B)| over cells from h to 0.3 delta
    v_rms_min: float  # smallest max_y v_rms seen in the averaging window (0 if relaminarised)
    divergence: float  # max |div u| / (U_b / min dy) at the end
    ms_per_step: float
    y: np.ndarray  # centres of the lower half
    u_plus: np.ndarray  # <U>/u_tau there
    v_rms: np.ndarray  # time-averaged v_rms / u_tau there


def turbulent_channel(preset, t_end: float, t_average_from: float, seed: int = 0, sample_every: int = 20,
                      log=None) -> TurbulentResult:
    """Run a preset's WMLES with the log-law wall model from a perturbed log-law profile; average the tail."""
    import time

    from hpcrl.envs.turbulence.spinup import initial_field, make_solver
    from hpcrl.envs.turbulence.wall_models import B_LOG, KAPPA

    s = make_solver(preset)
    g = s.grid
    s.set_velocity(*initial_field(g, preset.nu, preset.bulk_velocity, np.random.default_rng(seed)))
    n_steps = int(round(t_end / preset.dt))
    n_avg_from = int(round(t_average_from / preset.dt))
    taus, profiles, vrms, vmax = [], [], [], []
    start = time.perf_counter()
    for i in range(n_steps):
        s.step()
        if i >= n_avg_from:
            taus.append(s.tau_w.mean())
            profiles.append(s.mean_profile())
            if i % sample_every == 0:
                v = s.velocity()[1]
                prof = g.face_to_centre(v.std(axis=(1, 2)))
                vrms.append(prof)
                vmax.append(prof.max())
        if log is not None and (i + 1) % max(1, n_steps // 10) == 0:
            log(f"{preset.name}: t={s.t:.2f} tau_w={s.tau_w.mean():.4f} cfl={s.cfl():.2f}")
    ms = (time.perf_counter() - start) / n_steps * 1e3
    tau = float(np.mean(taus))
    u_tau = np.sqrt(tau)
    half = slice(0, g.ny // 2)
    prof = 0.5 * (np.mean(profiles, axis=0) + np.mean(profiles, axis=0)[::-1])  # both walls
    y = g.y_c[half] + 1.0
    u_plus = prof[half] / u_tau
    yplus = y * u_tau / preset.nu
    log_region = (y >= s.h - 1e-12) & (y <= 0.3)
    dev = np.abs(u_plus - (np.log(yplus) / KAPPA + B_LOG))[log_region]
    v_prof = np.mean(vrms, axis=0)
    v_prof = 0.5 * (v_prof + v_prof[::-1])[half] / u_tau
    div = s.max_divergence() / (preset.bulk_velocity / g.dy.min())
    return TurbulentResult(preset.name, (g.nx, g.ny, g.nz), s.t, t_average_from, u_tau / preset.nu, tau,
                           abs(tau - 1.0), float(dev.max()), float(min(vmax)), div, ms, y, u_plus, v_prof)
