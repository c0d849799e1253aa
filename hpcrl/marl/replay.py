"""The learner-side replay buffer of IQL and VDN: joint transitions, one per env copy and step.

A row holds every agent of one env copy at one step (A agents): observations [A, d], actions,
rewards, the next observations, ``alive`` (0 where the agent's episode terminated: no
bootstrap), ``fixed`` (1 where it was truncated: the bootstrap is ``fixed_value``, the actor's
max_a Q'(final observation), since the final observation itself is gone after the reset) and
``fixed_value``. IQL uses the rows agent by agent, VDN as a whole (one team transition).
"""
from __future__ import annotations

import numpy as np
import torch

KEYS = ("obs", "actions", "rewards", "next_obs", "alive", "fixed", "fixed_value")


def joint_transitions(fragment, agents: int) -> dict[str, np.ndarray]:
    """One fragment ([T, N] time-major, N = C copies x A agents) -> T x C joint rows."""
    obs = np.asarray(fragment["obs"], dtype=np.float32)
    T, N = obs.shape[:2]
    if N % agents:
        raise RuntimeError(f"fragment of {N} instances is not whole env copies of {agents} agents")
    C = N // agents
    nxt = np.concatenate([obs[1:], np.asarray(fragment["last_obs"], dtype=np.float32)[None]], axis=0)
    term = np.asarray(fragment["terminated"]).astype(bool)
    trunc = np.asarray(fragment["truncated"]).astype(bool) & ~term

    def rows(x, dtype):
        x = np.asarray(x)
        return x.reshape(T * C, agents, *x.shape[2:]).astype(dtype)

    return {"obs": rows(obs.reshape(T, N, -1), np.float32), "actions": rows(fragment["actions"], np.int64),
            "rewards": rows(fragment["rewards"], np.float32), "next_obs": rows(nxt.reshape(T, N, -1), np.float32),
            "alive": rows(~term, np.float32), "fixed": rows(trunc, np.float32),
            "fixed_value": rows(fragment["final_values"], np.float32)}


class ReplayBuffer:
    """A ring of joint transitions; :meth:`sample` draws uniformly with a torch generator."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data: dict[str, np.ndarray] | None = None
        self.next = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, rows: dict[str, np.ndarray]) -> None:
        n = len(rows["obs"])
        if self.data is None:
            self.data = {k: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for k, v in rows.items()}
        for start in range(0, n, self.capacity):  # a batch larger than the ring keeps its newest rows
            chunk = {k: v[start:start + self.capacity] for k, v in rows.items()}
            m = len(chunk["obs"])
            idx = (self.next + np.arange(m)) % self.capacity
            for k, v in chunk.items():
                self.data[k][idx] = v
            self.next = (self.next + m) % self.capacity
            self.size = min(self.size + m, self.capacity)

    def sample(self, batch: int, generator: torch.Generator, device) -> dict[str, torch.Tensor]:
        if self.size == 0:
            raise RuntimeError("sample from an empty replay buffer")
        idx = torch.randint(self.size, (batch,), generator=generator).numpy()
        return {k: torch.as_tensor(v[idx], device=device) for k, v in self.data.items()}
