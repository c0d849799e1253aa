"""Multi-agent wall model of a turbulent channel (PettingZoo ParallelEnv), after Bae & Koumoutsakos 2022.

- Agents: every ``agent_stride``-th wall point in x and z, on both walls ("bottom_i_k", "top_i_k").
- Observation (per agent, float32): the local log-law quantities at the matching height h,
  computed with the agent's current wall stress (u_tau = sqrt(tau_w)):
  ``[kappa * (1/kappa_loc) - 1, B_loc / B - 1]`` with 1/kappa_loc = h+ dU+/dy+ and
  B_loc = U+ - ln(h+) / kappa, clipped to +-``obs_clip``; both are 0 on the exact log law.
- Action: a factor in [action_low, action_high] on the local wall stress; the agents' factors are
  interpolated (bilinear, periodic) onto every wall point and tau_w <- factor * tau_w, after which
  the LES runs ``steps_per_action`` steps with that stress (aligned with the local velocity).
- Reward: r_i = -(|tau_ref - tau_i| - |tau_ref - tau_i,prev|) / tau_ref, plus ``bonus`` when
  |tau_ref - tau_i| < ``bonus_tolerance`` tau_ref, then r_i <- (1 - g) r_i + g mean_j r_j.
- Episodes start from a cached spun-up field (``spinup.py``) with tau_w uniform on each wall:
  the log-law model's mean there times a factor 1 +- U(p/2, p), p = ``tau_perturbation``;
  truncation after ``max_actions`` actions; a diverged solver terminates every agent with reward
  ``divergence_penalty``.

``wall_model="log_law"`` runs the equilibrium model instead (actions ignored, same rewards and
metrics): the baseline the agents must beat.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from hpcrl.envs.turbulence.presets import get_preset
from hpcrl.envs.turbulence.solver import SolverDiverged
from hpcrl.envs.turbulence.spinup import load_or_spin_up, make_solver
from hpcrl.envs.turbulence.wall_models import B_LOG, KAPPA, EquilibriumWallModel, log_law_state
from hpcrl.errors import ConfigError

TAU_REF = 1.0  # u_tau = 1 units: the mean wall stress of the target flow


class PrescribedWallStress:
    """The agents' wall stress: a stored field (2, nx, nz) that ignores the LES velocity."""

    def __init__(self, tau: np.ndarray):
        self.tau = tau

    def __call__(self, speed: np.ndarray) -> np.ndarray:
        return self.tau


def periodic_linear_weights(n: int, stride: int) -> np.ndarray:
    """(n, n // stride) weights of linear interpolation from every stride-th point, periodic."""
    m = n // stride
    w = np.zeros((n, m))
    pos = np.arange(n) / stride
    lo = np.floor(pos).astype(int)
    frac = pos - lo
    w[np.arange(n), lo % m] += 1.0 - frac
    w[np.arange(n), (lo + 1) % m] += frac
    return w


class TurbulentChannelEnv(ParallelEnv):
    metadata = {"name": "turbulent_channel_wm_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, preset: str = "tiny", action_low: float = 0.9, action_high: float = 1.1,
                 global_reward_share: float = 0.0, bonus: float = 0.1, bonus_tolerance: float = 0.01,
                 tau_perturbation: float = 0.2, obs_clip: float = 10.0, divergence_penalty: float = -1.0,
                 wall_model: str = "agents", cache_dir: str | os.PathLike | None = None, spinup_seed: int = 0,
                 render_mode: str | None = None, **preset_overrides: Any):
        self.preset = p = get_preset(preset, **preset_overrides)
        if not 0 < action_low <= 1.0 <= action_high:
            raise ConfigError(f"env.action_low/high: need 0 < low <= 1 <= high, got [{action_low}, {action_high}]")
        if not 0.0 <= global_reward_share <= 1.0:
            raise ConfigError(f"env.global_reward_share: must be in [0, 1], got {global_reward_share}")
        if not 0.0 <= tau_perturbation < 1.0:
            raise ConfigError(f"env.tau_perturbation: must be in [0, 1), got {tau_perturbation}")
        if wall_model not in ("agents", "log_law"):
            raise ConfigError(f"env.wall_model: must be 'agents' or 'log_law', got {wall_model!r}")
        if p.nx % p.agent_stride or p.nz % p.agent_stride:
            raise ConfigError(f"env.agent_stride: must divide nx={p.nx} and nz={p.nz}, got {p.agent_stride}")
        if render_mode is not None:
            raise ConfigError(f"env.render_mode: no render modes, got {render_mode!r}")
        self.render_mode = None
        self.action_low, self.action_high = float(action_low), float(action_high)
        self.global_reward_share, self.bonus, self.bonus_tolerance = global_reward_share, bonus, bonus_tolerance
        self.tau_perturbation, self.obs_clip, self.divergence_penalty = tau_perturbation, obs_clip, divergence_penalty
        self.wall_model, self.cache_dir, self.spinup_seed = wall_model, cache_dir, spinup_seed
        self.n_ax, self.n_az = p.nx // p.agent_stride, p.nz // p.agent_stride
        self.possible_agents = [f"{wall}_{i}_{k}" for wall in ("bottom", "top") for i in range(self.n_ax) for k in range(self.n_az)]
        self.agents: list[str] = []
        self._index = {a: j for j, a in enumerate(self.possible_agents)}
        self._wx = periodic_linear_weights(p.nx, p.agent_stride)
        self._wz = periodic_linear_weights(p.nz, p.agent_stride)
        self._obs_space = spaces.Box(-obs_clip, obs_clip, shape=(2,), dtype=np.float32)
        self._act_space = spaces.Box(self.action_low, self.action_high, shape=(1,), dtype=np.float32)
        n = len(self.possible_agents)
        self.state_space = spaces.Box(-obs_clip, obs_clip, shape=(2 * n,), dtype=np.float32)
        self._solver = None
        self._snapshots = None
        self._rng = np.random.default_rng()
        self._n_actions = 0
        self._obs = np.zeros((n, 2), np.float32)

    # ---- spaces ----
    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Box:
        return self._obs_space

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Box:
        return self._act_space

    # ---- wall-stress field at the agents ----
    def _at_agents(self, field: np.ndarray) -> np.ndarray:
        s = self.preset.agent_stride
        return field[:, ::s, ::s].reshape(-1)

    def _current_tau(self) -> np.ndarray:
        return self._solver.tau_w

    def _observe(self) -> np.ndarray:
        speed, dspeed = self._solver.matching_gradient()
        inv_kappa, b_loc = log_law_state(self._at_agents(speed), self._at_agents(dspeed),
                                         self._at_agents(self._current_tau()), self._solver.h, self.preset.nu)
        obs = np.stack([KAPPA * inv_kappa - 1.0, b_loc / B_LOG - 1.0], axis=1)
        self._obs = np.clip(np.nan_to_num(obs), -self.obs_clip, self.obs_clip).astype(np.float32)
        return self._obs

    # ---- API ----
    def reset(self, seed: int | None = None, options: dict | None = None):
        """Options: ``snapshot`` (index of the stored field), ``tau_factor`` (the initial perturbation)."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        options = options or {}
        if self._snapshots is None:
            self._snapshots = load_or_spin_up(self.preset, self.cache_dir, self.spinup_seed)
            self._solver = make_solver(self.preset)
            self._log_law = self._solver.wall_model
        i = int(options.get("snapshot", self._rng.integers(len(self._snapshots))))
        self._solver.load_state(self._snapshots[i % len(self._snapshots)])
        speed, _ = self._solver.matching_gradient()
        p = self.tau_perturbation
        factor = float(options.get("tau_factor", 1.0 + self._rng.choice([-1.0, 1.0]) * self._rng.uniform(p / 2, p)))
        if self.wall_model == "agents":
            # uniform on each wall: the log-law model's mean there, times the perturbation
            tau0 = np.broadcast_to(self._log_law(speed).mean(axis=(1, 2), keepdims=True), speed.shape)
            self._solver.wall_model = PrescribedWallStress(factor * tau0)
            self._solver.tau_w = self._solver.wall_model.tau
        else:
            self._solver.wall_model = self._log_law
            self._solver.tau_w = self._log_law(speed)
        self._n_actions = 0
        self.agents = self.possible_agents[:]
        obs = self._observe()
        return {a: obs[j] for j, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, np.ndarray]):
        if not self.agents:
            raise RuntimeError("step() after the episode ended; call reset()")
        tau_prev = self._at_agents(self._current_tau()).copy()
        if self.wall_model == "agents":
            a = np.ones(len(self.possible_agents))
            for agent, act in actions.items():
                a[self._index[agent]] = float(np.asarray(act).reshape(-1)[0])
            a = np.clip(a, self.action_low, self.action_high).reshape(2, self.n_ax, self.n_az)
            field = np.einsum("xi,wik,zk->wxz", self._wx, a, self._wz)
            tau = self._solver.wall_model.tau
            np.clip(tau * field, 0.05 * TAU_REF, 20.0 * TAU_REF, out=tau)
        diverged = False
        try:
            self._solver.advance(self.preset.steps_per_action)
        except SolverDiverged:
            diverged = True
        self._n_actions += 1
        agents = self.agents
        if diverged:
            obs = np.zeros_like(self._obs)
            r = np.full(len(agents), self.divergence_penalty)
        else:
            obs = self._observe()
            r = self._rewards(tau_prev, self._at_agents(self._current_tau()))
        truncated = self._n_actions >= self.preset.max_actions and not diverged
        tau_now = self._at_agents(self._current_tau())
        out = (
            {a: obs[j] for j, a in enumerate(agents)},
            {a: float(r[j]) for j, a in enumerate(agents)},
            {a: diverged for a in agents},
            {a: truncated for a in agents},
            {a: {"tau_w": float(tau_now[j]), "rel_error": float(abs(TAU_REF - tau_now[j]) / TAU_REF)} for j, a in enumerate(agents)},
        )
        if diverged or truncated:
            self.agents = []
        return out

    def _rewards(self, tau_prev: np.ndarray, tau_now: np.ndarray) -> np.ndarray:
        err_now, err_prev = np.abs(TAU_REF - tau_now) / TAU_REF, np.abs(TAU_REF - tau_prev) / TAU_REF
        r = -(err_now - err_prev) + self.bonus * (err_now < self.bonus_tolerance)
        g = self.global_reward_share
        return (1.0 - g) * r + g * r.mean()

    def state(self) -> np.ndarray:
        return self._obs.reshape(-1).copy()

    def metrics(self) -> dict[str, float]:
        """Wall-stress errors now, over every wall point: the plane mean's and the mean local one."""
        tau = self._current_tau()
        return {"mean_tau_w": float(tau.mean()),
                "mean_error": float(abs(TAU_REF - tau.mean()) / TAU_REF),
                "local_error": float(np.abs(TAU_REF - tau).mean() / TAU_REF),
                "t": float(self._solver.t)}

    def render(self) -> None:
        return None

    def close(self) -> None:
        self._solver = None
        self._snapshots = None
