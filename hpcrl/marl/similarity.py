"""Policy similarity between agents (MARLess section 4.3.2).

Each agent's latest (observation, action) samples describe its policy's observation-action
distribution. The samples of all agents are compressed together by PCA (one projection, so
the agents stay comparable), a Gaussian kernel density estimate (KDE) is fitted per agent in
the compressed space, and the KL divergence between every pair of agents is estimated by
Monte Carlo on the first agent's own samples:

    KL(p_i || p_j) ~ (1/n_i) sum_{x in X_i} [log p_i(x) - log p_j(x)]

(leave-one-out for log p_i, so a KDE is not rewarded for its own sample). The bandwidth is
Scott's rule per agent on the whitened components. Discrete actions enter as one-hot vectors.
"""
from __future__ import annotations

import numpy as np


def pca_project(x: np.ndarray, components: int) -> np.ndarray:
    """x [n, d] centred and projected on its first ``components`` principal axes, then whitened
    (unit variance per component; components with no variance are dropped)."""
    x = np.asarray(x, dtype=np.float64)
    centred = x - x.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    keep = min(components, int((s > 1e-9 * max(s[0], 1e-300)).sum())) if s.size else 0
    if keep == 0:
        return np.zeros((x.shape[0], 1))
    z = centred @ vt[:keep].T
    return z / (s[:keep] / np.sqrt(max(x.shape[0] - 1, 1)))


def _log_kde(points: np.ndarray, data: np.ndarray, bandwidth: float, leave_out_self: bool = False) -> np.ndarray:
    """log of a Gaussian KDE on ``data`` [m, k] (isotropic ``bandwidth``) at ``points`` [n, k]."""
    k = data.shape[1]
    d2 = ((points[:, None, :] - data[None, :, :]) ** 2).sum(-1) / (bandwidth ** 2)
    m = data.shape[0]
    if leave_out_self:
        np.fill_diagonal(d2, np.inf)
        m -= 1
    log_kernel = -0.5 * d2 - 0.5 * k * np.log(2 * np.pi * bandwidth ** 2)
    top = log_kernel.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return (top[:, 0] + np.log(np.exp(log_kernel - top).sum(axis=1))) - np.log(max(m, 1))


def scott_bandwidth(n: int, k: int) -> float:
    """Scott's rule n^(-1/(k+4)) for whitened data."""
    return float(n ** (-1.0 / (k + 4)))


def kl_matrix(samples: list[np.ndarray], components: int = 3) -> np.ndarray:
    """[A, A] estimated KL(p_i || p_j) between the agents' sample sets (each [n_i, d], same d)."""
    sizes = [len(s) for s in samples]
    if min(sizes) < 3:
        raise ValueError(f"kl_matrix: each agent needs at least 3 samples, got {sizes}")
    z = pca_project(np.concatenate(samples), components)
    parts = np.split(z, np.cumsum(sizes)[:-1])
    k = z.shape[1]
    bw = [scott_bandwidth(n, k) for n in sizes]
    A = len(samples)
    out = np.zeros((A, A))
    for i in range(A):
        own = _log_kde(parts[i], parts[i], bw[i], leave_out_self=True)
        for j in range(A):
            if i != j:
                out[i, j] = max(float(np.mean(own - _log_kde(parts[i], parts[j], bw[j]))), 0.0)
    return out


def observation_action_samples(obs: np.ndarray, actions: np.ndarray, num_actions: int | None) -> np.ndarray:
    """[n, obs_dim + action_dim] rows (obs, action); discrete actions (``num_actions``) one-hot."""
    obs = np.asarray(obs, dtype=np.float64).reshape(len(obs), -1)
    a = np.asarray(actions)
    if num_actions is not None:
        a = np.eye(num_actions)[a.astype(np.int64).reshape(-1)]
    return np.concatenate([obs, a.reshape(len(obs), -1).astype(np.float64)], axis=1)
