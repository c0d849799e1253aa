"""The channel grid: Fourier in x and z, a stretched staggered finite-volume grid in y.

Layout (channel half-height delta = 1, walls at y = -1 and y = +1):

- ``Ny + 1`` faces ``y_f`` clustered towards the walls by ``y_f = tanh(s eta) / tanh(s)``,
  eta uniform in [-1, 1] (s = ``stretch``; s -> 0 is uniform);
- ``Ny`` cell centres ``y_c`` halfway between faces; u, w and p live there, v on the faces;
- physical arrays are ``(ny, nx, nz)``, spectral ones ``(ny, nx, nz // 2 + 1)`` with
  ``norm="forward"`` so the (0, 0) coefficient is the plane mean;
- the 2/3 rule (Orszag 1971) keeps modes with 3 |n| < N in each periodic direction.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.fft

from hpcrl.errors import ConfigError


class Tridiagonal:
    """Real tridiagonal systems along axis 0, factored once, solved by a vectorised Thomas sweep.

    The coefficients have shape (n,) (one matrix for every column of the right-hand side) or
    (n, ...) (one matrix per column, e.g. per wavenumber); right-hand sides broadcast against
    them and may be complex. No pivoting: meant for the diagonally dominant (or pinned Neumann)
    operators of the solver, and a zero pivot raises. The sweep is 2 n NumPy operations on whole
    planes; it uses no BLAS, so its speed does not depend on how many BLAS threads the process
    has (a dense-inverse GEMM was 100x slower with OpenBLAS threads on busy cores).
    """

    def __init__(self, sub: np.ndarray, diag: np.ndarray, sup: np.ndarray):
        """``sub[i]`` multiplies x[i-1] in row i (sub[0] unused), ``sup[i]`` x[i+1] (sup[-1] unused)."""
        sub, diag, sup = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (sub, diag, sup)))
        self.n = diag.shape[0]
        self.sub, self.diag, self.sup = sub.copy(), diag.copy(), sup.copy()
        inv = np.empty_like(diag)  # 1 / pivot of row i
        cp = np.zeros_like(diag)  # sup[i] / pivot of row i
        pivot = diag[0]
        for i in range(self.n):
            if i:
                pivot = diag[i] - sub[i] * cp[i - 1]
            if np.any(np.abs(pivot) <= 1e-14 * (np.abs(diag[i]) + np.abs(sub[i]) + np.abs(sup[i]))):
                raise np.linalg.LinAlgError(f"tridiagonal factorisation: zero pivot in row {i}")
            inv[i] = 1.0 / pivot
            cp[i] = sup[i] * inv[i] if i < self.n - 1 else 0.0
        self._inv, self._cp, self._sub_inv = inv, cp, sub * inv

    def solve(self, b: np.ndarray) -> np.ndarray:
        """Solve A x = b for b of shape (n, ...), real or complex."""
        inv, cp, sub_inv = (_trailing(c, b.ndim) for c in (self._inv, self._cp, self._sub_inv))
        x = np.multiply(b, inv)  # b[i] / pivot[i], then the forward elimination
        for i in range(1, self.n):
            x[i] -= sub_inv[i] * x[i - 1]
        for i in range(self.n - 2, -1, -1):
            x[i] -= cp[i] * x[i + 1]
        return x

    def matvec(self, x: np.ndarray) -> np.ndarray:
        return tridiagonal_matvec(self.sub, self.diag, self.sup, x)


def tridiagonal_matvec(sub: np.ndarray, diag: np.ndarray, sup: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A x along axis 0 for A given by (sub, diag, sup) as in ``Tridiagonal``."""
    sub, diag, sup = (_trailing(c, x.ndim) for c in (sub, diag, sup))
    y = diag * x
    y[1:] += sub[1:] * x[:-1]
    y[:-1] += sup[:-1] * x[1:]
    return y


def _trailing(c: np.ndarray, ndim: int) -> np.ndarray:
    """Coefficients (n, ...) with unit axes appended to broadcast against an ndim-array."""
    return c.reshape(c.shape + (1,) * (ndim - c.ndim))


@dataclass
class ChannelGrid:
    """Sizes, coordinates, wavenumbers and the y finite-volume metrics of one channel box."""

    nx: int
    ny: int
    nz: int
    lx: float = 2 * np.pi
    lz: float = np.pi
    stretch: float = 1.5
    dealias: bool = True
    y_f: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("nx", "nz"):
            n = getattr(self, name)
            if n < 4 or n % 2:
                raise ConfigError(f"grid.{name}: must be an even integer >= 4, got {n}")
        if self.ny < 4:
            raise ConfigError(f"grid.ny: must be an integer >= 4, got {self.ny}")
        if self.lx <= 0 or self.lz <= 0:
            raise ConfigError(f"grid.lx/lz: must be positive, got {self.lx}, {self.lz}")
        if self.stretch < 0:
            raise ConfigError(f"grid.stretch: must be >= 0 (0 = uniform), got {self.stretch}")
        eta = np.linspace(-1.0, 1.0, self.ny + 1)
        self.y_f = np.tanh(self.stretch * eta) / np.tanh(self.stretch) if self.stretch > 0 else eta
        self.y_f[0], self.y_f[-1] = -1.0, 1.0
        self.y_c = 0.5 * (self.y_f[:-1] + self.y_f[1:])
        self.dy = np.diff(self.y_f)  # cell heights, (ny,)
        self.dyc = np.diff(self.y_c)  # centre-to-centre distances = interior face spacing, (ny-1,)
        self.wall_distance = np.minimum(self.y_c + 1.0, 1.0 - self.y_c)
        # linear interpolation weight of centre j (vs j-1) at interior face j
        self.face_weight = (self.y_f[1:-1] - self.y_c[:-1]) / self.dyc
        self.dx, self.dz = self.lx / self.nx, self.lz / self.nz
        nkx, nkz = np.fft.fftfreq(self.nx, 1.0 / self.nx), np.fft.rfftfreq(self.nz, 1.0 / self.nz)
        keep = (3 * np.abs(nkx)[:, None] < self.nx) & (3 * nkz[None, :] < self.nz)
        keep &= (np.abs(nkx)[:, None] < self.nx // 2) & (nkz[None, :] < self.nz // 2)  # never Nyquist
        self.mask = keep if self.dealias else (np.abs(nkx)[:, None] < self.nx // 2) & (nkz[None, :] < self.nz // 2)
        self.kx = (2 * np.pi / self.lx) * nkx[:, None] * self.mask
        self.kz = (2 * np.pi / self.lz) * nkz[None, :] * self.mask
        self.k2 = self.kx**2 + self.kz**2
        self.ikx, self.ikz = 1j * self.kx, 1j * self.kz
        self.spectral_shape = (self.nx, self.nz // 2 + 1)

    # ---- transforms (x, z are the last two axes) ----
    def to_spectral(self, a: np.ndarray) -> np.ndarray:
        out = scipy.fft.rfft2(a, axes=(-2, -1), norm="forward")
        out *= self.mask
        return out

    def to_physical(self, a: np.ndarray) -> np.ndarray:
        return scipy.fft.irfft2(a, s=(self.nx, self.nz), axes=(-2, -1), norm="forward")

    # ---- y operators on the staggered grid (axis 0) ----
    def centre_to_face(self, q: np.ndarray) -> np.ndarray:
        """Interior faces 1..ny-1 from centres (linear in y)."""
        w = self.face_weight.reshape((-1,) + (1,) * (q.ndim - 1))
        return (1.0 - w) * q[:-1] + w * q[1:]

    @staticmethod
    def face_to_centre(q: np.ndarray) -> np.ndarray:
        """Centres from all ny+1 faces (centres are face midpoints)."""
        return 0.5 * (q[:-1] + q[1:])

    def ddy_faces_to_centre(self, q: np.ndarray) -> np.ndarray:
        """d/dy at centres of a quantity on all ny+1 faces."""
        return np.diff(q, axis=0) / self.dy.reshape((-1,) + (1,) * (q.ndim - 1))

    def ddy_centres_to_face(self, q: np.ndarray) -> np.ndarray:
        """d/dy at interior faces of a quantity at centres."""
        return np.diff(q, axis=0) / self.dyc.reshape((-1,) + (1,) * (q.ndim - 1))

    def d2dy2_centre(self, wall: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sub, diag, sup) of the conservative d2/dy2 at centres.

        ``wall="dirichlet"``: zero value on the walls (no-slip, ghost-free one-sided flux);
        ``wall="neumann"``: zero flux through the walls (the wall stress enters as a source).
        """
        n = self.ny
        sub, sup = np.zeros(n), np.zeros(n)
        sub[1:] = 1.0 / (self.dyc * self.dy[1:])
        sup[:-1] = 1.0 / (self.dyc * self.dy[:-1])
        diag = -(sub + sup)
        if wall == "dirichlet":
            diag[0] -= 1.0 / ((self.y_c[0] - self.y_f[0]) * self.dy[0])
            diag[-1] -= 1.0 / ((self.y_f[-1] - self.y_c[-1]) * self.dy[-1])
        elif wall != "neumann":
            raise ValueError(f"wall must be 'dirichlet' or 'neumann', got {wall!r}")
        return sub, diag, sup

    def d2dy2_face(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sub, diag, sup) of d2/dy2 at the ny-1 interior faces, zero on the walls."""
        sub, sup = np.zeros(self.ny - 1), np.zeros(self.ny - 1)
        sub[1:] = 1.0 / (self.dy[1:-1] * self.dyc[1:])
        sup[:-1] = 1.0 / (self.dy[1:-1] * self.dyc[:-1])
        diag = -(1.0 / self.dy[:-1] + 1.0 / self.dy[1:]) / self.dyc
        return sub, diag, sup

    def plane_mean(self, a_hat: np.ndarray) -> np.ndarray:
        """Mean over x and z of a spectral field (the (0, 0) coefficient), per y."""
        return a_hat[..., 0, 0].real

    def bulk(self, profile: np.ndarray) -> float:
        """Bulk (y-averaged) value of a centre profile."""
        return float(np.sum(profile * self.dy) / 2.0)
