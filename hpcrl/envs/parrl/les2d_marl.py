"""Multi-agent 2D LES closure: one PettingZoo agent per PAR-RL probe sets the local Cs^2.

See les2d.py for the physics, the reference and the single-agent rules.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv  # optional dependency: hpcrl[marl]

from hpcrl.envs.parrl.les2d import N_PROBES_SIDE, KraichnanLESEnv
from hpcrl.errors import ConfigError


class KraichnanLESParallelEnv(ParallelEnv):
    """Multi-agent (PettingZoo ParallelEnv): agent `probe_{row}_{col}` sets Cs^2 at its probe.

    Observation per agent (float32): probe vorticity / omega_rms(t=0), probe |S| / omega_rms(t=0),
    log10 of its region's enstrophy, log10 of the domain enstrophy, t / t_end.
    Reward: -( (1 - global_share) * regional enstrophy error + global_share * spectrum error ).
    """

    metadata = {"name": "hpcrl_kraichnan_les_probes_v0", "render_modes": []}

    def __init__(self, cs2_range: tuple[float, float] = (0.05, 0.5), realisations: int = 1, global_share: float = 0.5,
                 blowup_reward: float = -10.0, **les_kwargs: Any) -> None:
        if not 0.0 <= global_share <= 1.0:
            raise ConfigError(f"env.global_share: must be in [0, 1], got {global_share}")
        self._single = KraichnanLESEnv(cs2_range, realisations, blowup_reward, **les_kwargs)
        self.les = self._single.les
        self.global_share, self.blowup_reward = float(global_share), float(blowup_reward)
        self.possible_agents = [f"probe_{i}_{j}" for i in range(N_PROBES_SIDE) for j in range(N_PROBES_SIDE)]
        self.agents: list[str] = []
        self._action_space = spaces.Box(*cs2_range, shape=(1,), dtype=np.float32)
        self._observation_space = spaces.Box(-np.inf, np.inf, shape=(5,), dtype=np.float32)

    def observation_space(self, agent: str) -> spaces.Box:
        return self._observation_space  # the same object every call, as PettingZoo requires

    def action_space(self, agent: str) -> spaces.Box:
        return self._action_space

    def _observations(self) -> dict[str, np.ndarray]:
        les, s = self.les, self.les.omega_scale
        wp, sp = les.probe_vorticity().ravel() / s, les.probe_strain().ravel() / s
        zr = np.log10(np.maximum(les.regional_enstrophy().ravel(), 1e-30))
        z = np.log10(max(les.grid.enstrophy(les.w_hat), 1e-30))
        t = les.step_index / les.n_actions
        return {a: np.array([wp[i], sp[i], zr[i], z, t], dtype=np.float32) for i, a in enumerate(self.possible_agents)}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = self._single.reset(seed=seed, options=options if options and "realisation" in options else None)
        self.agents = list(self.possible_agents)
        return self._observations(), {a: dict(info) for a in self.agents}

    def step(self, actions: dict[str, np.ndarray]):
        lo, hi = float(self._action_space.low[0]), float(self._action_space.high[0])
        chosen = [float(np.asarray(actions.get(a, [lo])).reshape(-1)[0]) for a in self.possible_agents]
        probes = np.clip(np.array(chosen), lo, hi)
        ok = self.les.advance(self.les.cs2_field(probes.reshape(N_PROBES_SIDE, N_PROBES_SIDE)))
        agents = self.agents
        if not ok:
            obs = {a: np.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0) for a, o in self._observations().items()}
            rewards = dict.fromkeys(agents, self.blowup_reward)
            done, infos = True, {a: {"blowup": True} for a in agents}
        else:
            obs = self._observations()
            g, local = self.les.spectrum_error(), self.les.regional_error().ravel()
            rewards = {a: -float((1 - self.global_share) * local[i] + self.global_share * g)
                       for i, a in enumerate(self.possible_agents) if a in agents}
            done = self.les.done
            infos = {a: {"spectrum_error": g, "region_error": float(local[i])}
                     for i, a in enumerate(self.possible_agents) if a in agents}
        obs = {a: obs[a] for a in agents}
        terminations = dict.fromkeys(agents, done)
        truncations = dict.fromkeys(agents, False)
        if done:
            self.agents = []
        return obs, rewards, terminations, truncations, infos
