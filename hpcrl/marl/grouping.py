"""Agent categorisation (MARLess section 4.3.3): K-means of the agents into N' groups.

K-means needs points; the agents are given by their pairwise divergences (a symmetrised KL
matrix from :mod:`hpcrl.marl.similarity`). They are embedded by classical multidimensional
scaling (the double-centred squared distances' top eigenvectors), where Euclidean distance
matches the divergence as far as it can, and clustered with k-means++ starts (several
restarts, the lowest within-group sum of squares wins). Deterministic for a given seed.
"""
from __future__ import annotations

import numpy as np


def symmetrise(kl: np.ndarray) -> np.ndarray:
    """D_ij = (KL_ij + KL_ji) / 2, zero diagonal."""
    d = 0.5 * (np.asarray(kl, dtype=np.float64) + np.asarray(kl, dtype=np.float64).T)
    np.fill_diagonal(d, 0.0)
    return d


def mds_embedding(distance: np.ndarray, dims: int | None = None) -> np.ndarray:
    """Classical MDS: [A, dims] points whose Euclidean distances approximate ``distance``."""
    d = np.asarray(distance, dtype=np.float64)
    A = d.shape[0]
    J = np.eye(A) - 1.0 / A
    B = -0.5 * J @ (d ** 2) @ J
    w, v = np.linalg.eigh(B)
    order = np.argsort(w)[::-1][: dims or A]
    w = np.clip(w[order], 0.0, None)
    return v[:, order] * np.sqrt(w)


def kmeans(points: np.ndarray, k: int, seed: int = 0, restarts: int = 8, iters: int = 100) -> np.ndarray:
    """Group labels [n] in 0..k-1 of the lowest-inertia run of k-means++ restarts (every label used
    when the points allow it)."""
    x = np.asarray(points, dtype=np.float64)
    n = len(x)
    if not 1 <= k <= n:
        raise ValueError(f"kmeans: k={k} must be between 1 and the number of points {n}")
    rng = np.random.default_rng(seed)
    best, best_score = None, (True, np.inf)
    for _ in range(restarts):
        centres = [x[rng.integers(n)]]
        for _ in range(1, k):  # k-means++: next centre with probability ~ squared distance
            d2 = np.min(((x[:, None] - np.array(centres)[None]) ** 2).sum(-1), axis=1)
            p = d2 / d2.sum() if d2.sum() > 0 else np.full(n, 1.0 / n)
            centres.append(x[rng.choice(n, p=p)])
        c = np.array(centres)
        for _ in range(iters):
            labels = ((x[:, None] - c[None]) ** 2).sum(-1).argmin(axis=1)
            new = np.array([x[labels == g].mean(axis=0) if (labels == g).any() else c[g] for g in range(k)])
            if np.allclose(new, c):
                break
            c = new
        labels = ((x[:, None] - c[None]) ** 2).sum(-1).argmin(axis=1)
        # a run that leaves a group empty (only with duplicate points) loses to any that does not
        score = (len(set(labels.tolist())) < k, float(((x - c[labels]) ** 2).sum()))
        if best is None or score < best_score:
            best, best_score = labels, score
    return canonical_labels(best)


def canonical_labels(labels) -> np.ndarray:
    """Relabel so groups are numbered by their first member (0 for agent 0's group, ...)."""
    out, names = np.empty(len(labels), dtype=np.int64), {}
    for i, g in enumerate(labels):
        out[i] = names.setdefault(int(g), len(names))
    return out


def group_agents(kl: np.ndarray, groups: int, seed: int = 0) -> np.ndarray:
    """Labels [A] of the agents in ``groups`` groups from their [A, A] KL matrix."""
    return kmeans(mds_embedding(symmetrise(kl)), groups, seed=seed)
