"""Pseudo-spectral solver for 2D incompressible flow in vorticity-streamfunction form.

On the periodic box [0, 2 pi]^2 with n x n points (x along axis 1, y along axis 0):

    d(omega)/dt + u d(omega)/dx + v d(omega)/dy = nu lap(omega) + div(nu_e grad(omega)),
    lap(psi) = -omega,  u = d(psi)/dy,  v = -d(psi)/dx,

with the Smagorinsky eddy viscosity nu_e = Cs^2 Delta^2 |S|, |S| = sqrt(4 psi_xy^2 + (psi_xx - psi_yy)^2)
(Delta = grid spacing; Cs^2 may be a field). Products are formed on the grid and truncated by the
2/3 rule (Orszag 1971) so the state only holds |kx|, |ky| <= n/3; time stepping is the three-stage
strong-stability-preserving Runge-Kutta scheme of Shu & Osher (1988), as in San & Staples,
Computers & Fluids 63 (2012). The state is the real-FFT coefficient array of omega (numpy
normalisation: f_hat = sum f exp(-i k x)).
"""
from __future__ import annotations

import numpy as np
import scipy.fft as sfft


class SpectralGrid:
    """Wavenumbers, dealiasing mask and FFT helpers for an n x n periodic grid."""

    def __init__(self, n: int) -> None:
        if n < 8 or n % 2:
            raise ValueError(f"grid size must be even and >= 8, got {n}")
        self.n = n
        self.dx = 2 * np.pi / n
        self.kx = sfft.rfftfreq(n, 1.0 / n)[None, :]
        self.ky = sfft.fftfreq(n, 1.0 / n)[:, None]
        self.k2 = self.kx**2 + self.ky**2
        self.inv_k2 = np.where(self.k2 > 0, 1.0 / np.where(self.k2 > 0, self.k2, 1.0), 0.0)
        cut = n // 3
        self.mask = (np.abs(self.kx) <= cut) & (np.abs(self.ky) <= cut)
        # weight of each stored coefficient in sums over the full (Hermitian) spectrum
        self.weight = np.full(self.k2.shape, 2.0)
        self.weight[:, 0] = 1.0
        self.weight[:, -1] = 1.0
        self.shell = np.rint(np.sqrt(self.k2)).astype(int)
        self.kmax = cut

    # ------------------------------------------------------------------ transforms
    def to_grid(self, f_hat: np.ndarray) -> np.ndarray:
        return sfft.irfft2(f_hat, s=(self.n, self.n), axes=(-2, -1))

    def to_spectral(self, f: np.ndarray) -> np.ndarray:
        return sfft.rfft2(f, axes=(-2, -1))

    def psi_hat(self, w_hat: np.ndarray) -> np.ndarray:
        return w_hat * self.inv_k2

    # ------------------------------------------------------------------ dynamics
    def rhs(self, w_hat: np.ndarray, nu: float, cs2: float | np.ndarray = 0.0) -> np.ndarray:
        """d(omega_hat)/dt: dealiased advection, viscous diffusion and (if cs2 != 0) Smagorinsky."""
        ikx, iky = 1j * self.kx, 1j * self.ky
        p_hat = self.psi_hat(w_hat)
        u, v, wx, wy = self.to_grid(np.stack([iky * p_hat, -ikx * p_hat, ikx * w_hat, iky * w_hat]))
        out = -self.to_spectral(u * wx + v * wy) - nu * self.k2 * w_hat
        if np.any(np.asarray(cs2) != 0.0):
            pxy, pxx, pyy = self.to_grid(np.stack([-self.kx * self.ky * p_hat, -self.kx**2 * p_hat, -self.ky**2 * p_hat]))
            nu_e = np.asarray(cs2) * self.dx**2 * np.sqrt(4.0 * pxy**2 + (pxx - pyy) ** 2)
            fx, fy = self.to_spectral(np.stack([nu_e * wx, nu_e * wy]))
            out += ikx * fx + iky * fy
        return out * self.mask

    def rk3_step(self, w_hat: np.ndarray, dt: float, nu: float, cs2: float | np.ndarray = 0.0) -> np.ndarray:
        """One SSP-RK3 step (Shu & Osher 1988)."""
        w1 = w_hat + dt * self.rhs(w_hat, nu, cs2)
        w2 = 0.75 * w_hat + 0.25 * (w1 + dt * self.rhs(w1, nu, cs2))
        return w_hat / 3.0 + 2.0 / 3.0 * (w2 + dt * self.rhs(w2, nu, cs2))

    # ------------------------------------------------------------------ diagnostics
    def _mean_square(self, f_hat: np.ndarray) -> np.ndarray:
        return self.weight * np.abs(f_hat) ** 2 / float(self.n) ** 4

    def energy(self, w_hat: np.ndarray) -> float:
        """Kinetic energy per unit area, <u^2 + v^2> / 2."""
        return 0.5 * float(np.sum(self._mean_square(w_hat) * self.inv_k2))

    def enstrophy(self, w_hat: np.ndarray) -> float:
        """<omega^2> / 2."""
        return 0.5 * float(np.sum(self._mean_square(w_hat)))

    def energy_spectrum(self, w_hat: np.ndarray, kmax: int | None = None) -> np.ndarray:
        """E(k) for integer shells k = 0..kmax (sum over round(|k|) == k); sums to the energy."""
        kmax = self.kmax if kmax is None else kmax
        e = 0.5 * self._mean_square(w_hat) * self.inv_k2
        return np.bincount(self.shell.ravel(), weights=e.ravel(), minlength=kmax + 1)[: kmax + 1]

    def max_speed(self, w_hat: np.ndarray) -> float:
        p_hat = self.psi_hat(w_hat)
        u, v = self.to_grid(np.stack([1j * self.ky * p_hat, -1j * self.kx * p_hat]))
        return float(np.sqrt(np.max(u**2 + v**2)))

    def strain_rate(self, w_hat: np.ndarray) -> np.ndarray:
        p_hat = self.psi_hat(w_hat)
        pxy, pxx, pyy = self.to_grid(np.stack([-self.kx * self.ky * p_hat, -self.kx**2 * p_hat, -self.ky**2 * p_hat]))
        return np.sqrt(4.0 * pxy**2 + (pxx - pyy) ** 2)


def kraichnan_initial(grid: SpectralGrid, kp: float, rng: np.random.Generator) -> np.ndarray:
    """Random-phase vorticity with E(k) = A k^4 exp(-(k/kp)^2), A = 4 kp^-5 / (3 pi).

    The spectrum of decaying Kraichnan turbulence used by San & Staples (2012) and Maulik & San,
    J. Fluid Mech. 858 (2019); total energy 1 / (2 sqrt(pi)). Phases come from the FFT of white
    noise (so Hermitian symmetry holds); each integer shell is scaled to hold exactly E(k).
    """
    phase = grid.to_spectral(rng.standard_normal((grid.n, grid.n)))
    phase = np.where(np.abs(phase) > 0, phase / np.maximum(np.abs(phase), 1e-300), 0.0) * grid.mask
    k = np.sqrt(grid.k2)
    w_hat = phase * np.sqrt(k) * float(grid.n) ** 2  # |omega_hat|^2 ~ k E(k) up to shell scaling
    shells = np.arange(grid.kmax + 1)
    target = 4.0 / (3.0 * np.pi) * kp**-5 * shells**4.0 * np.exp(-((shells / kp) ** 2))
    have = grid.energy_spectrum(w_hat)
    scale = np.where(have > 0, np.sqrt(target / np.where(have > 0, have, 1.0)), 0.0)
    return w_hat * scale[np.minimum(grid.shell, grid.kmax)] * (grid.shell <= grid.kmax)


def spectral_cutoff(w_hat: np.ndarray, fine: SpectralGrid, coarse: SpectralGrid) -> np.ndarray:
    """Sharp spectral filter of a fine-grid field onto a coarse grid (kept modes: the coarse mask)."""
    m = coarse.n
    out = np.zeros((m, m // 2 + 1), dtype=complex)
    half = m // 2
    out[:half, :] = w_hat[:half, : half + 1]
    out[half:, :] = w_hat[fine.n - half:, : half + 1]
    return out * (float(m) / fine.n) ** 2 * coarse.mask
