"""Wall models: wall shear stress from the LES velocity at the matching height h.

The equilibrium log-law model (the baseline of Bae & Koumoutsakos 2022) solves, pointwise,

    U / u_tau = (1 / kappa) ln(h u_tau / nu) + B,        tau_w = u_tau^2,

by Newton's method; below h+ = h u_tau / nu = ``viscous_hplus`` it uses the viscous sublayer
U+ = y+ instead (tau_w = nu U / h).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KAPPA = 0.41
B_LOG = 5.2


def log_law_u_tau(
    u: np.ndarray, h: float, nu: float, kappa: float = KAPPA, b: float = B_LOG, tol: float = 1e-12, max_iter: int = 50
) -> np.ndarray:
    """Friction velocity from the log law for speeds ``u`` (any shape, >= 0) at height ``h``.

    f(u_tau) = U/u_tau - ln(h u_tau/nu)/kappa - B is strictly decreasing in u_tau, so the root is
    unique; Newton starts from the viscous-sublayer value and each step is kept positive.
    Points where the root lies below h+ = 11 (about where the log law and U+ = y+ meet) use the
    sublayer law.
    """
    u = np.abs(np.asarray(u, dtype=np.float64))
    us = np.maximum(u, 1e-30)
    # start left of the root (f > 0): ln(h U / nu) = ln h+ + ln U+ > ln h+ whenever U+ > 1; f is
    # convex and decreasing, so Newton from the left rises monotonically to the root
    ut = us / (np.log(np.maximum(h * us / nu, np.e)) / kappa + b)
    for _ in range(max_iter):
        f = us / ut - np.log(h * ut / nu) / kappa - b
        df = -us / ut**2 - 1.0 / (kappa * ut)
        new = ut - f / df
        new = np.where(new > 0, new, 0.5 * ut)
        done = np.all(np.abs(new - ut) <= tol * ut)
        ut = new
        if done:
            break
    hplus = h * ut / nu
    lam = np.sqrt(nu * u / h)
    return np.where(hplus < 11.0, lam, np.where(u > 0, ut, 0.0))


@dataclass(frozen=True)
class EquilibriumWallModel:
    """Local instantaneous log-law wall model: tau_w(x, z) = u_tau(|U(x, h, z)|)^2."""

    h: float
    nu: float
    kappa: float = KAPPA
    b: float = B_LOG

    def __call__(self, speed: np.ndarray) -> np.ndarray:
        return log_law_u_tau(speed, self.h, self.nu, self.kappa, self.b) ** 2


def log_law_state(
    speed: np.ndarray, dspeed_dy: np.ndarray, tau_w: np.ndarray, h: float, nu: float, kappa: float = KAPPA
) -> tuple[np.ndarray, np.ndarray]:
    """Local log-law quantities at the matching height (Bae & Koumoutsakos 2022, states).

    With u_tau = sqrt(tau_w): 1/kappa_loc = h+ (dU+/dy+) = h (dU/dy) / u_tau and
    B_loc = U+ - (1/kappa) ln h+. Both equal (1/kappa, B) when the log law holds exactly.
    """
    ut = np.sqrt(np.maximum(tau_w, 1e-12))
    inv_kappa = h * dspeed_dy / ut
    b_loc = speed / ut - np.log(h * ut / nu) / kappa
    return inv_kappa, b_loc
