"""Copies of MPE simple-spread stepped together in numpy, each the same to the bit as mpe2's ``simple_spread_v3``.

An actor rank of the MARLess workloads steps ``env.num_envs`` copies of ``hpcrl/MPESimpleSpread-v3``. Through
PettingZoo each copy is stepped agent by agent (the AEC env behind the parallel wrapper) and each of its entity
pairs and observations in Python, about half of a MARLess run's CPU. Here one step of every copy is a few array
operations per agent pair, in the order mpe2 takes them (``World.step``: the action forces, then each colliding
pair's contact force added to both in pair order, then the integration; the rewards and observations after it), so
every number is the one mpe2 computes; ``tests/test_mpe_spread_copies.py`` compares them, step by step and across
resets, with the PettingZoo env. Each copy draws its positions from its own generator, seeded as mpe2 seeds it.

Supported: discrete actions, full observability, no curriculum, no early termination (mpe2's defaults); any other
setting makes :func:`spread_copies` return None, and the actor steps the PettingZoo copies instead.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding

SIZE = 0.15  # an agent's radius (landmarks do not collide)
DT, DAMPING, CONTACT_FORCE, CONTACT_MARGIN, SENSITIVITY, MASS = 0.1, 0.25, 1e2, 1e-3, 5.0, 1.0
DIM_C = 2  # silent agents: their communication is zeros, but it is in every observation
MOVES = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]])
"""The force direction of each discrete action (mpe2's ``_set_action``: none, left, right, down, up)."""
DEFAULTS = {"continuous_actions": False, "curriculum": False, "terminate_on_success": False,
            "num_agent_neighbors": None, "num_landmark_neighbors": None}
"""Settings the copies implement only at these values."""
NO_EFFECT = ("render_mode", "dynamic_rescaling", "benchmark_data")
"""Settings that change no observation, reward or ending (rendering; benchmark_data fills only the infos)."""


def spread_copies(count: int, N: int = 6, local_ratio: float = 0.5, max_cycles: int = 25, **settings):
    """``count`` copies of simple_spread_v3 with these settings, or None where the copies do not implement one."""
    if any(k not in DEFAULTS and k not in NO_EFFECT for k in settings) or any(
            settings.get(k, v) != v for k, v in DEFAULTS.items()):
        return None
    return SpreadCopies(count, N, local_ratio, max_cycles)


class SpreadCopies:
    """C copies of N agents and N landmarks; agent j of copy k is row (k, j) of every array."""

    def __init__(self, copies: int, N: int = 6, local_ratio: float = 0.5, max_cycles: int = 25) -> None:
        self.copies, self.N, self.local_ratio, self.max_cycles = copies, N, local_ratio, max_cycles
        self.possible_agents = [f"agent_{i}" for i in range(N)]
        obs_dim = 4 + 2 * N + 2 * (N - 1) + DIM_C * (N - 1)
        self.observation_space = spaces.Box(low=-np.float32(np.inf), high=+np.float32(np.inf), shape=(obs_dim,),
                                            dtype=np.float32)
        self.action_space = spaces.Discrete(5)
        self.pos = np.zeros((copies, N, 2))  # agents' positions and velocities
        self.vel = np.zeros((copies, N, 2))
        self.landmarks = np.zeros((copies, N, 2))
        self.steps = np.zeros(copies, dtype=np.int64)
        self.rngs = [seeding.np_random(None)[0] for _ in range(copies)]
        self.pairs = [(a, b) for a in range(N) for b in range(a + 1, N)]  # mpe2's collision loop order
        self.first, self.second = (np.array(side, dtype=np.int64) for side in zip(*self.pairs))
        self.others = np.array([[j for j in range(N) if j != i] for i in range(N)], dtype=np.int64)

    def reset_copy(self, k: int, seed: int | None = None) -> np.ndarray:
        """Copy k's new episode (reseeded when ``seed`` is given); its agents' observations [N, obs] float32."""
        if seed is not None:
            self.rngs[k] = seeding.np_random(seed)[0]
        rng = self.rngs[k]
        for i in range(self.N):  # the draws in reset_world's order: each agent, then each landmark
            self.pos[k, i] = rng.uniform(-1, +1, 2)
        for i in range(self.N):
            self.landmarks[k, i] = rng.uniform(-1, +1, 2)
        self.vel[k] = 0.0
        self.steps[k] = 0
        return self._observations(slice(k, k + 1))[0]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every copy's step with ``actions`` [C, N] (ints in 0..4): observations [C, N, obs] float32, rewards [C, N]
        float64, and whether each copy's episode was truncated (at ``max_cycles`` steps; none terminates)."""
        actions = np.asarray(actions)
        if actions.min() < 0 or actions.max() > 4:
            raise ValueError(f"simple_spread: actions are 0..4, got {actions.min()}..{actions.max()}")
        force = MOVES[actions] * SENSITIVITY + 0.0  # [C, N, 2]
        pos = self.pos
        delta = pos[:, self.first] - pos[:, self.second]  # [C, P, 2] for each colliding pair, in pair order
        dist = np.sqrt(np.sum(np.square(delta), axis=-1))
        k = CONTACT_MARGIN
        penetration = np.logaddexp(0, -(dist - (SIZE + SIZE)) / k) * k
        contact = CONTACT_FORCE * delta / dist[..., None] * penetration[..., None]
        for p, (a, b) in enumerate(self.pairs):  # added to both, pair after pair, as mpe2 does
            force[:, a] = contact[:, p] + force[:, a]
            force[:, b] = -contact[:, p] + force[:, b]
        pos += self.vel * DT
        self.vel = self.vel * (1 - DAMPING)
        self.vel += (force / MASS) * DT
        self.steps += 1
        return self._observations(), self._rewards(), self.steps >= self.max_cycles

    def _rewards(self) -> np.ndarray:
        """mpe2's ``local_ratio`` mix of the global reward (minus each landmark's nearest agent's distance, summed)
        and each agent's (minus one per other agent it collides with)."""
        to_landmarks = np.sqrt(np.sum(np.square(self.pos[:, :, None] - self.landmarks[:, None]), axis=-1))  # [C,A,L]
        nearest = to_landmarks.min(axis=1)
        total = np.zeros(self.copies)
        for lm in range(self.N):
            total = total - nearest[:, lm]
        gaps = np.sqrt(np.sum(np.square(self.pos[:, :, None] - self.pos[:, None]), axis=-1))  # [C, A, A]
        colliding = (gaps < SIZE + SIZE) & ~np.eye(self.N, dtype=bool)
        own = 0.0 - colliding.sum(axis=2).astype(np.float64)
        return total[:, None] * (1 - self.local_ratio) + own * self.local_ratio

    def _observations(self, copies: slice = slice(None)) -> np.ndarray:
        """[own velocity, own position, each landmark's and each other agent's position relative to it, the others'
        communication (zeros)] for every agent of ``copies`` (default all: a reset asks for its copy's), float32."""
        pos, vel, landmarks = self.pos[copies], self.vel[copies], self.landmarks[copies]
        C, N = len(pos), self.N
        to_landmarks = landmarks[:, None] - pos[:, :, None]  # [C, A, L, 2]
        to_others = (pos[:, None] - pos[:, :, None])[:, np.arange(N)[:, None], self.others]  # [C, A, A-1, 2]
        return np.concatenate([vel, pos, to_landmarks.reshape(C, N, -1), to_others.reshape(C, N, -1),
                               np.zeros((C, N, DIM_C * (N - 1)))], axis=-1).astype(np.float32)

    def close(self) -> None:
        pass
