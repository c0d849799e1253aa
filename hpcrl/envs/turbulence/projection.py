"""Pressure projection: FFT in x-z, one tridiagonal solve in y per wavenumber.

With D the discrete divergence at cell centres (spectral i k in x and z, face differences in y)
and G the discrete gradient (i k at centres, centre differences on interior faces, zero on the
walls), the Poisson operator is L = D G, tridiagonal in y for every (kx, kz). Solving
L phi = D u* and setting u = u* - G phi gives D u = 0 up to the round-off of the solve, whatever
the grid stretching. All wavenumbers are stacked into one block-tridiagonal system that is
factored once (the blocks never couple).
"""
from __future__ import annotations

import numpy as np

from hpcrl.envs.turbulence.grid import ChannelGrid, Tridiagonal


class PressureProjection:
    def __init__(self, grid: ChannelGrid):
        self.grid = g = grid
        sub, diag, sup = g.d2dy2_centre("neumann")
        nb = g.spectral_shape[0] * g.spectral_shape[1]
        k2 = g.k2.reshape(nb)
        big_sub = np.tile(sub, nb)
        big_sup = np.tile(sup, nb)
        big_diag = (diag[None, :] - k2[:, None]).reshape(-1)
        big_sub[:: g.ny] = 0.0  # blocks never couple
        big_sup[g.ny - 1 :: g.ny] = 0.0
        # singular blocks: the mean mode (phi defined up to a constant: pin phi_0 = 0) and the
        # modes the 2/3 rule removes (right-hand side always 0: identity block)
        singular = ~g.mask.reshape(nb)
        singular[0] = True
        for b in np.flatnonzero(singular):
            s = slice(b * g.ny, (b + 1) * g.ny)
            if b == 0:
                big_diag[b * g.ny], big_sup[b * g.ny] = 1.0, 0.0
            else:
                big_sub[s], big_diag[s], big_sup[s] = 0.0, 1.0, 0.0
        self._poisson = Tridiagonal(big_sub, big_diag, big_sup)
        self._nb = nb

    def divergence(self, u_hat: np.ndarray, v_hat: np.ndarray, w_hat: np.ndarray) -> np.ndarray:
        """D u at cell centres, spectral, (ny, nx, nz//2+1); v_hat holds all ny+1 faces."""
        g = self.grid
        return g.ikx * u_hat + g.ikz * w_hat + g.ddy_faces_to_centre(v_hat)

    def project(self, u_hat: np.ndarray, v_hat: np.ndarray, w_hat: np.ndarray) -> np.ndarray:
        """Make (u, v, w) discretely divergence-free in place; return phi (spectral)."""
        g = self.grid
        rhs = self.divergence(u_hat, v_hat, w_hat)
        rhs[0, 0, 0] = 0.0  # the pinned row of the mean-mode block
        b = np.ascontiguousarray(np.moveaxis(rhs, 0, -1)).reshape(self._nb * g.ny)
        phi = np.moveaxis(self._poisson.solve(b).reshape(g.spectral_shape + (g.ny,)), -1, 0)
        u_hat -= g.ikx * phi
        w_hat -= g.ikz * phi
        v_hat[1:-1] -= g.ddy_centres_to_face(phi)
        return phi
