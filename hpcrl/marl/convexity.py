"""Convexity ratio of a loss surface (MARLess section 4.3.4, Eq. 1): C = e_max / e_min.

e_max and e_min are the largest and smallest eigenvalue magnitudes of the Hessian of a
policy's loss with respect to that policy's parameters. The Hessian is never formed: it is
touched only through Hessian-vector products (double backward with ``torch.autograd``), as
PyHessian does. :func:`lanczos` runs m steps of Lanczos with full reorthogonalisation and
returns the Ritz values (exact eigenvalues once m reaches the dimension);
:func:`power_iteration` gives the dominant eigenvalue alone. :func:`convexity_ratio` takes
max |Ritz| / min |Ritz|: with m much smaller than the dimension (a neural network), the
smallest Ritz value is the smallest curvature the Krylov space has found, the same estimate the
seed's subsampled PyHessian run makes.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

HVP = Callable[[Tensor], Tensor]


def hvp_function(loss: Tensor, params: Sequence[Tensor]) -> HVP:
    """v -> H v for the Hessian of ``loss`` w.r.t. ``params`` (all flattened into one vector)."""
    params = list(params)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    flat_grad = torch.cat([g.reshape(-1) for g in grads])

    def hvp(v: Tensor) -> Tensor:
        hv = torch.autograd.grad(flat_grad @ v.to(flat_grad.dtype), params, retain_graph=True, allow_unused=True)
        return torch.cat([(h if h is not None else torch.zeros_like(p)).reshape(-1) for h, p in zip(hv, params)])

    return hvp


def power_iteration(hvp: HVP, dim: int, iters: int = 50, seed: int = 0, tol: float = 1e-6) -> float:
    """The eigenvalue of largest magnitude (signed), by power iteration on H."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(dim, generator=g, dtype=torch.float64)
    v /= v.norm()
    eig = 0.0
    for _ in range(iters):
        hv = hvp(v.float()).double()
        new = float(v @ hv)
        norm = hv.norm()
        if norm == 0:
            return 0.0
        v = hv / norm
        if abs(new - eig) <= tol * max(abs(new), 1e-12):
            return new
        eig = new
    return eig


def lanczos(hvp: HVP, dim: int, steps: int = 20, seed: int = 0) -> Tensor:
    """Ritz values (ascending) of m = min(steps, dim) Lanczos steps with full reorthogonalisation."""
    m = min(steps, dim)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(dim, generator=g, dtype=torch.float64)
    q /= q.norm()
    Q = [q]
    alpha, beta = [], []
    for k in range(m):
        w = hvp(Q[k].float()).double()
        a = float(Q[k] @ w)
        alpha.append(a)
        basis = torch.stack(Q)
        w = w - basis.T @ (basis @ w)  # full reorthogonalisation (twice is enough)
        w = w - basis.T @ (basis @ w)
        b = float(w.norm())
        if k == m - 1 or b < 1e-10:
            break
        beta.append(b)
        Q.append(w / b)
    T = torch.diag(torch.tensor(alpha, dtype=torch.float64))
    if beta:
        off = torch.tensor(beta, dtype=torch.float64)
        T += torch.diag(off, 1) + torch.diag(off, -1)
    return torch.linalg.eigvalsh(T)


def convexity_ratio(hvp: HVP, dim: int, steps: int = 20, seed: int = 0, floor: float = 1e-12) -> float:
    """C = max |e| / min |e| over the Lanczos Ritz values (Eq. 1); ``floor`` keeps it finite."""
    ritz = lanczos(hvp, dim, steps, seed).abs()
    return float(ritz.max() / ritz.min().clamp_min(floor))


def loss_convexity_ratio(loss: Tensor, params: Sequence[Tensor], steps: int = 20, seed: int = 0) -> float:
    """C of ``loss`` over ``params`` (one policy's parameters)."""
    params = list(params)
    return convexity_ratio(hvp_function(loss, params), sum(p.numel() for p in params), steps, seed)
