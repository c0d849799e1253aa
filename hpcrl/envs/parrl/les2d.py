"""2D LES closure of decaying Kraichnan turbulence: the agent sets the Smagorinsky Cs^2.

PAR-RL left this workload unfinished (github.com/Romit-Maulik/PAR-RL,
turbulence_closure_les/rl_les_closure.py: a 32^2 LES against a 256^2 DNS at Re = 2000, k0 = 5,
Cs^2 in [0.05, 0.5], 16 probes on a 4 x 4 lattice at ((i + 1/2) n/4, (j + 1/2) n/4), reward the
probe vorticity error; the Smagorinsky term there was never switched on). Here it is finished:

- DNS: `dns_n`^2 pseudo-spectral solve (see spectral2d.py) from a Kraichnan spectrum, run once
  per realisation and cached on disk (`cache_dir`) as the sharp-spectral-cutoff filtered
  vorticity on the LES grid at every action time.
- LES: `les_n`^2, same solver plus the Smagorinsky closure nu_e = Cs^2 dx^2 |S| (the eddy-viscosity
  form of PAR-RL's `smag`), starting from the filtered DNS at t = 0.
- Reward (single agent): minus the mean over resolved shells k = 1..les_n/3 of
  |log10(E_les(k) / E_dns(k))|, the energy-spectrum error against the filtered DNS. A spectrum is
  used rather than PAR-RL's pointwise probe error because LES and DNS decorrelate pointwise, and
  a pointwise error then rewards damping the field towards zero.
- Multi-agent (les2d_marl.py): one agent per probe; Cs^2 is interpolated bilinearly (periodically) between the
  probes; agent i is rewarded by minus |log10(Z_les,i / Z_dns,i)| with Z the mean enstrophy of its
  (les_n/4)^2 region, mixed with the global spectrum reward by `global_share`.
- Episode: one action every `interval` time units until `t_end` (then terminated: the reference
  ends there and t/t_end is observed). A non-finite or exploding LES terminates with
  `blowup_reward`.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from hpcrl.envs.parrl.spectral2d import SpectralGrid, kraichnan_initial, spectral_cutoff
from hpcrl.errors import ConfigError

N_PROBES_SIDE = 4  # PAR-RL: npx = npy = 4


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "hpcrl" / "les2d"


class KraichnanLES:
    """The LES run, its cached filtered-DNS reference and the error measures (no RL API)."""

    def __init__(self, les_n: int = 32, dns_n: int = 256, re: float = 2000.0, kp: float = 5.0, t_end: float = 4.0,
                 interval: float = 0.1, cfl: float = 0.3, seed: int = 0, cache_dir: str | os.PathLike | None = None) -> None:
        if les_n % (2 * N_PROBES_SIDE) or les_n < 16:
            raise ConfigError(f"env.les_n: must be a multiple of 8 and >= 16, got {les_n}")
        if dns_n < les_n or dns_n % 2:
            raise ConfigError(f"env.dns_n: must be even and >= les_n={les_n}, got {dns_n}")
        n_actions = t_end / interval
        if interval <= 0 or abs(n_actions - round(n_actions)) > 1e-9 or round(n_actions) < 1:
            raise ConfigError(f"env.interval: must divide t_end={t_end} into a whole number of steps, got {interval}")
        self.les_n, self.dns_n, self.re, self.kp = les_n, dns_n, float(re), float(kp)
        self.t_end, self.interval, self.cfl, self.seed = float(t_end), float(interval), float(cfl), int(seed)
        self.n_actions = int(round(n_actions))
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.grid = SpectralGrid(les_n)
        self.kc = self.grid.kmax
        b = les_n // N_PROBES_SIDE
        self.probe_index = np.arange(N_PROBES_SIDE) * b + b // 2
        self._interp = self._probe_interpolation(les_n, b)
        self.reference: dict[str, np.ndarray] | None = None
        self._loaded: dict[int, dict[str, np.ndarray]] = {}
        self.w_hat = np.zeros_like(self.grid.k2, dtype=complex)
        self.step_index = 0
        self.les_dt = 0.0
        self.nsub = 1

    # ------------------------------------------------------------------ reference (filtered DNS)
    def cache_path(self, realisation: int) -> Path:
        key = (f"dns{self.dns_n}-les{self.les_n}-re{self.re:g}-kp{self.kp:g}"
               f"-T{self.t_end:g}-dt{self.interval:g}-cfl{self.cfl:g}")
        tag = hashlib.sha1(key.encode()).hexdigest()[:8]
        return self.cache_dir / f"kraichnan-{key}-seed{self.seed + realisation}-{tag}.npz"

    def load_reference(self, realisation: int = 0) -> dict[str, np.ndarray]:
        """The filtered DNS for one realisation: generated on first use, then read from the cache."""
        path = self.cache_path(realisation)
        if not path.exists():
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            data = generate_reference(self, self.seed + realisation)
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".npz.part")
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **data)
            os.replace(tmp, path)  # atomic: concurrent actors never see half a file
        with np.load(path) as f:
            return {k: f[k] for k in f.files}

    # ------------------------------------------------------------------ LES run
    def reset(self, realisation: int = 0) -> None:
        if realisation not in self._loaded:
            self._loaded[realisation] = self.load_reference(realisation)
        self.reference = self._loaded[realisation]
        self.w_hat = self.reference["w_hat"][0].copy()
        self.step_index = 0
        self.nsub = max(1, int(np.ceil(self.interval * self.grid.max_speed(self.w_hat) / (self.cfl * self.grid.dx))))
        self.les_dt = self.interval / self.nsub

    def advance(self, cs2: float | np.ndarray) -> bool:
        """Run one action interval with Cs^2 (scalar or les_n^2 field); False if the LES blew up."""
        for _ in range(self.nsub):
            self.w_hat = self.grid.rk3_step(self.w_hat, self.les_dt, 1.0 / self.re, cs2)
        self.step_index += 1
        e0 = self.grid.energy(self.reference["w_hat"][0])
        return bool(np.all(np.isfinite(self.w_hat))) and self.grid.energy(self.w_hat) < 10.0 * e0

    @property
    def done(self) -> bool:
        return self.step_index >= self.n_actions

    def cs2_field(self, probe_values: np.ndarray) -> np.ndarray:
        """Bilinear periodic interpolation of 4 x 4 probe values (row = y) onto the LES grid."""
        return self._interp @ probe_values @ self._interp.T

    @staticmethod
    def _probe_interpolation(n: int, b: int) -> np.ndarray:
        s = (np.arange(n) - b // 2) / b
        m0 = np.floor(s).astype(int)
        w = s - m0
        out = np.zeros((n, N_PROBES_SIDE))
        out[np.arange(n), m0 % N_PROBES_SIDE] += 1.0 - w
        out[np.arange(n), (m0 + 1) % N_PROBES_SIDE] += w
        return out

    # ------------------------------------------------------------------ measures
    def spectrum(self, w_hat: np.ndarray | None = None) -> np.ndarray:
        """E(k), k = 1..kc (floored at 1e-30 so logs stay finite)."""
        return np.maximum(self.grid.energy_spectrum(self.w_hat if w_hat is None else w_hat)[1:], 1e-30)

    def spectrum_error(self) -> float:
        ref = self.reference["spectra"][self.step_index]
        return float(np.mean(np.abs(np.log10(self.spectrum() / ref))))

    def regional_enstrophy(self, w_hat: np.ndarray | None = None) -> np.ndarray:
        """Mean omega^2 / 2 over each of the 4 x 4 probe regions, shape (4, 4) (row = y)."""
        w = self.grid.to_grid(self.w_hat if w_hat is None else w_hat)
        b = self.les_n // N_PROBES_SIDE
        return 0.5 * (w**2).reshape(N_PROBES_SIDE, b, N_PROBES_SIDE, b).mean(axis=(1, 3))

    def regional_error(self) -> np.ndarray:
        ref = np.maximum(self.regional_enstrophy(self.reference["w_hat"][self.step_index]), 1e-30)
        return np.abs(np.log10(np.maximum(self.regional_enstrophy(), 1e-30) / ref))

    def probe_vorticity(self) -> np.ndarray:
        w = self.grid.to_grid(self.w_hat)
        return w[np.ix_(self.probe_index, self.probe_index)]

    def probe_strain(self) -> np.ndarray:
        return self.grid.strain_rate(self.w_hat)[np.ix_(self.probe_index, self.probe_index)]

    @property
    def omega_scale(self) -> float:
        """rms vorticity of the reference at t = 0, the unit of observed vorticities."""
        return float(np.sqrt(2.0 * self.grid.enstrophy(self.reference["w_hat"][0])))


def generate_reference(les: KraichnanLES, seed: int) -> dict[str, np.ndarray]:
    """Run the DNS to t_end and keep the filtered vorticity and spectrum at every action time."""
    fine = SpectralGrid(les.dns_n)
    w = kraichnan_initial(fine, les.kp, np.random.default_rng(seed))
    nsub = max(1, int(np.ceil(les.interval * fine.max_speed(w) / (les.cfl * fine.dx))))
    dt = les.interval / nsub
    snaps = [spectral_cutoff(w, fine, les.grid)]
    for _ in range(les.n_actions):
        for _ in range(nsub):
            w = fine.rk3_step(w, dt, 1.0 / les.re)
        snaps.append(spectral_cutoff(w, fine, les.grid))
    w_hat = np.stack(snaps)
    spectra = np.stack([les.spectrum(s) for s in snaps])
    return {"w_hat": w_hat, "spectra": spectra, "dns_dt": np.array(dt), "dns_energy_end": np.array(fine.energy(w))}


class KraichnanLESEnv(gym.Env):
    """Single agent: one Cs^2 for the whole LES, updated every `interval`.

    Observation (float32): vorticity at the 16 probes / omega_rms(t=0), log10 E_les(k) for
    k = 1..les_n/3, and t / t_end. Action: Cs^2 in `cs2_range` (default [0.05, 0.5], PAR-RL's).
    """

    metadata = {"render_modes": []}

    def __init__(self, cs2_range: tuple[float, float] = (0.05, 0.5), realisations: int = 1,
                 blowup_reward: float = -10.0, **les_kwargs: Any) -> None:
        lo, hi = cs2_range
        if not 0.0 <= lo < hi:
            raise ConfigError(f"env.cs2_range: need 0 <= low < high, got {cs2_range}")
        if realisations < 1:
            raise ConfigError(f"env.realisations: must be >= 1, got {realisations}")
        self.les = KraichnanLES(**les_kwargs)
        self.realisations, self.blowup_reward = int(realisations), float(blowup_reward)
        self.action_space = spaces.Box(lo, hi, shape=(1,), dtype=np.float32)
        n_obs = N_PROBES_SIDE**2 + self.les.kc + 1
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(n_obs,), dtype=np.float32)

    def _obs(self) -> np.ndarray:
        les = self.les
        return np.concatenate([les.probe_vorticity().ravel() / les.omega_scale, np.log10(les.spectrum()),
                               [les.step_index / les.n_actions]]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        r = int((options or {}).get("realisation", self.np_random.integers(self.realisations)))
        self.les.reset(r)
        return self._obs(), {"realisation": r}

    def step(self, action):
        lo, hi = float(self.action_space.low[0]), float(self.action_space.high[0])
        cs2 = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], lo, hi))
        if not self.les.advance(cs2):
            obs = np.nan_to_num(self._obs(), nan=0.0, posinf=0.0, neginf=0.0)
            return obs, self.blowup_reward, True, False, {"blowup": True}
        err = self.les.spectrum_error()
        return self._obs(), -err, self.les.done, False, {"spectrum_error": err, "t": self.les.step_index * self.les.interval}
