"""Size presets of the wall-model environment: ``tiny`` (tests), ``small`` (one core), ``paper`` (clusters).

All three are the channel at Re_tau = 2000 of Bae & Koumoutsakos (2022) in a 2 pi x 2 x pi box
(delta = u_tau = 1, nu = 1 / Re_tau, so tau_ref = 1), driven at constant flow rate with the
bulk velocity of Dean's correlation, and differ in resolution, agent density and episode length.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from hpcrl.envs.turbulence.grid import ChannelGrid
from hpcrl.envs.turbulence.solver import SolverConfig
from hpcrl.errors import ConfigError


def dean_bulk_velocity(re_tau: float) -> float:
    """U_b / u_tau from Dean (1978): C_f = 0.073 Re_m^(-1/4), Re_m = 2 delta U_b / nu, C_f = 2 / U_b+^2."""
    return ((2.0 * re_tau) ** 0.25 / 0.0365) ** (4.0 / 7.0)


@dataclass(frozen=True)
class ChannelPreset:
    name: str
    nx: int
    ny: int
    nz: int
    """Grid points in x (streamwise), y (wall-normal cells), z (spanwise)."""
    dt: float
    """Solver time step (delta / u_tau units)."""
    matching_cell: int
    """Cell counted from each wall whose velocity feeds the wall model and the observations."""
    agent_stride: int
    """Agents sit on every agent_stride-th wall point in x and z, on both walls."""
    steps_per_action: int
    """Solver steps between two actions."""
    max_actions: int
    """Actions per episode (then truncation)."""
    spinup_steps: int
    """Solver steps of the cached spin-up with the log-law wall model."""
    snapshots: int
    """Fields saved from the last part of the spin-up; each episode starts from one."""
    snapshot_every: int
    """Solver steps between saved snapshots."""
    re_tau: float = 2000.0
    lx: float = 2 * math.pi
    lz: float = math.pi
    stretch: float = 1.0
    """Wall clustering of the y faces (0 = uniform)."""
    cs: float = 0.1
    """Smagorinsky constant."""

    @property
    def nu(self) -> float:
        return 1.0 / self.re_tau

    @property
    def bulk_velocity(self) -> float:
        return dean_bulk_velocity(self.re_tau)

    def grid(self) -> ChannelGrid:
        return ChannelGrid(self.nx, self.ny, self.nz, lx=self.lx, lz=self.lz, stretch=self.stretch)

    def solver_config(self) -> SolverConfig:
        return SolverConfig(nu=self.nu, dt=self.dt, wall="wallstress", forcing="flow_rate", dpdx=1.0,
                            bulk_velocity=self.bulk_velocity, cs=self.cs, matching_cell=self.matching_cell)

    def replace(self, **overrides) -> "ChannelPreset":
        names = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(overrides) - names)
        if bad:
            raise ConfigError(f"env.preset overrides: unknown field(s) {', '.join(bad)}; allowed: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **overrides)


PRESETS = {
    # tests: ~4 ms per solver step, 200 steps (under a second) per episode, 32 agents; the spin-up
    # (t = 24) keeps its snapshots (t = 18 to 24) past the start-up overshoot of tau_w (t ~ 10)
    "tiny": ChannelPreset("tiny", nx=16, ny=24, nz=16, dt=0.008, matching_cell=1, agent_stride=4,
                          steps_per_action=10, max_actions=20, spinup_steps=3000, snapshots=4, snapshot_every=250),
    # one actor core: ~15 ms per step, 4000 steps (about a minute) per episode, 128 agents
    "small": ChannelPreset("small", nx=32, ny=32, nz=32, dt=0.004, matching_cell=2, agent_stride=4,
                           steps_per_action=20, max_actions=200, spinup_steps=10000, snapshots=8, snapshot_every=500),
    # clusters: 512 agents, Re_tau = 2000 at the resolution of the literature's coarse WMLES
    "paper": ChannelPreset("paper", nx=64, ny=48, nz=64, dt=0.002, matching_cell=3, agent_stride=4,
                           steps_per_action=40, max_actions=400, spinup_steps=30000, snapshots=16, snapshot_every=1000),
}


def get_preset(name: str, **overrides) -> ChannelPreset:
    if name not in PRESETS:
        raise ConfigError(f"env.preset: unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
