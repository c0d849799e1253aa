"""Pressure projection: FFT in x-z, one tridiagonal solve in y per wavenumber.

With D the discrete divergence at cell centres (spectral i k in x and z, face differences in y)
and G the discrete gradient (i k at centres, centre differences on interior faces, zero on the
walls), the Poisson operator is L = D G, tridiagonal in y for every (kx, kz). Solving
L phi = D u* and setting u = u* - G phi gives D u = 0 up to the round-off of the solve, whatever
the grid stretching. The (ny, nx, nz//2+1) coefficient arrays hold one tridiagonal matrix per
wavenumber; they are factored once and solved together, plane by plane, by a Thomas sweep.
"""
from __future__ import annotations

import numpy as np

from hpcrl.envs.turbulence.grid import ChannelGrid, Tridiagonal


class PressureProjection:
    def __init__(self, grid: ChannelGrid):
        self.grid = g = grid
        sub, diag, sup = g.d2dy2_centre("neumann")
        shape = (g.ny,) + g.spectral_shape
        e = (slice(None), None, None)
        big_sub = np.broadcast_to(sub[e], shape).copy()
        big_sup = np.broadcast_to(sup[e], shape).copy()
        big_diag = diag[e] - g.k2[None]
        # singular blocks: the modes the 2/3 rule removes (right-hand side always 0: identity)
        # and the mean mode (phi defined up to a constant: pin phi_0 = 0)
        dropped = ~g.mask
        big_sub[:, dropped], big_diag[:, dropped], big_sup[:, dropped] = 0.0, 1.0, 0.0
        big_diag[0, 0, 0], big_sup[0, 0, 0] = 1.0, 0.0
        self._poisson = Tridiagonal(big_sub, big_diag, big_sup)

    def divergence(self, u_hat: np.ndarray, v_hat: np.ndarray, w_hat: np.ndarray) -> np.ndarray:
        """D u at cell centres, spectral, (ny, nx, nz//2+1); v_hat holds all ny+1 faces."""
        g = self.grid
        return g.ikx * u_hat + g.ikz * w_hat + g.ddy_faces_to_centre(v_hat)

    def project(self, u_hat: np.ndarray, v_hat: np.ndarray, w_hat: np.ndarray) -> np.ndarray:
        """Make (u, v, w) discretely divergence-free in place; return phi (spectral)."""
        g = self.grid
        rhs = self.divergence(u_hat, v_hat, w_hat)
        rhs[0, 0, 0] = 0.0  # the pinned row of the mean-mode block
        phi = self._poisson.solve(rhs)
        u_hat -= g.ikx * phi
        w_hat -= g.ikz * phi
        v_hat[1:-1] -= g.ddy_centres_to_face(phi)
        return phi
