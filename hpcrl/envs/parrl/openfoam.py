"""OpenFOAM dynamic relaxation: choose SIMPLE relaxation factors so pitzDaily converges in fewer iterations.

PAR-RL's workload (github.com/Romit-Maulik/PAR-RL, examples/OF_dynamic_relaxation): every
`iterations_per_step` simpleFoam iterations the agent sets the relaxation factors of p (fields)
and U (equations), each in [0.2, 0.95]; the state is the mean U^2 at the inlet and over the mesh;
the reward is minus the iterations spent in the step (PAR-RL's reward_type 2); a diverged or failed
solve gives -2000 and ends the episode; the episode ends when the initial residuals of the last
iteration are below PAR-RL's tolerances (p 5e-2, U 1e-3, k 1e-3, epsilon 1e-3); the inlet speed
is drawn per episode from 35-65 m/s. PAR-RL capped an episode at 2000 iterations (max_steps).

Differences: the case is the Debian `openfoam-examples` pitzDaily (v1912, k-epsilon, SIMPLEC as
shipped) rather than PAR-RL's k-omega SST copy; k and epsilon at the inlet and in the initial field
are scaled with the inlet speed (k ~ U^2, epsilon ~ U^3: the tutorial's intensity and length scale);
the observation is read from the written U field directly (PAR-RL went through foamToVTK); cells
are averaged unweighted, as PAR-RL did.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from hpcrl.envs.parrl import foam_case as fc
from hpcrl.errors import ConfigError

PAR_RL_TOLERANCES = {"p": 5e-2, "U": 1e-3, "k": 1e-3, "epsilon": 1e-3}
SPEED_POWER = {"k": 2, "epsilon": 3, "omega": 1}  # how each inlet turbulence field scales with the inlet speed


class FoamRelaxationEnv(gym.Env):
    """Dynamic under-relaxation of simpleFoam on pitzDaily, one case directory per instance.

    Action (float32): (alpha_p, alpha_U) in `relax_range`. Observation (float32): mean |U|^2 over
    the inlet faces, mean |U|^2 over the cells, then the previous `history` cell means (newest first).
    """

    metadata = {"render_modes": []}

    def __init__(self, iterations_per_step: int = 100, max_iterations: int = 2000,
                 inlet_speed_range: tuple[float, float] = (35.0, 65.0), relax_range: tuple[float, float] = (0.2, 0.95),
                 tolerances: dict[str, float] | None = None, penalty: float = -2000.0, timeout_s: float | None = None,
                 history: int = 0, max_speed: float = 1e5, work_dir: str | None = None, foam_bashrc: str | None = None,
                 tutorial: str | None = None, solver: str = "simpleFoam", inlet_patch: str = "inlet") -> None:
        if iterations_per_step < 1:
            raise ConfigError(f"env.iterations_per_step: must be >= 1, got {iterations_per_step}")
        if not 0.0 < relax_range[0] < relax_range[1] <= 1.0:
            raise ConfigError(f"env.relax_range: need 0 < low < high <= 1, got {relax_range}")
        if not 0.0 < inlet_speed_range[0] <= inlet_speed_range[1]:
            raise ConfigError(f"env.inlet_speed_range: need 0 < low <= high, got {inlet_speed_range}")
        self.bashrc = fc.find_bashrc(foam_bashrc)
        self.tutorial = fc.find_tutorial(tutorial)
        if self.bashrc is None:
            looked = foam_bashrc or ", ".join(fc.BASHRC_CANDIDATES)
            raise fc.FoamNotInstalledError(f"OpenFOAM not found (no bashrc at {looked}); {fc.INSTALL_HINT}")
        if self.tutorial is None:
            looked = tutorial or f"{fc.PITZDAILY} under {', '.join(fc.TUTORIAL_ROOTS)}"
            raise fc.FoamNotInstalledError(f"pitzDaily tutorial not found ({looked}); {fc.INSTALL_HINT}")
        self.n_iter, self.max_iterations = int(iterations_per_step), int(max_iterations)
        self.inlet_speed_range, self.penalty, self.max_speed = inlet_speed_range, float(penalty), float(max_speed)
        self.tolerances = dict(PAR_RL_TOLERANCES if tolerances is None else tolerances)
        self.timeout_s = float(timeout_s) if timeout_s is not None else 30.0 + 0.2 * self.n_iter
        self.solver, self.inlet_patch, self.history = solver, inlet_patch, int(history)
        self.work_dir = work_dir
        self.action_space = spaces.Box(relax_range[0], relax_range[1], shape=(2,), dtype=np.float32)
        self.observation_space = spaces.Box(0.0, np.inf, shape=(2 + self.history,), dtype=np.float32)
        self.case: Path | None = None
        self.last_run: fc.RunResult | None = None  # the latest solver run (wall time, pid, log)
        self._own_case = False
        self._pristine: dict[str, str] = {}
        self._time = 0
        self._iterations = 0
        self._obs = np.zeros(2 + self.history, dtype=np.float32)
        self._past: deque[float] = deque(maxlen=self.history)
        self.inlet_speed = 0.0

    # ------------------------------------------------------------------ case setup (first reset)
    def _setup_case(self) -> None:
        self._env = fc.foam_environment(str(self.bashrc))
        root = Path(self.work_dir) if self.work_dir else None
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
        self.case = Path(tempfile.mkdtemp(prefix="pitzDaily-", dir=root))
        self._own_case = True
        fc.copy_case(self.tutorial, self.case)
        control = self.case / "system" / "controlDict"
        text = fc.replace_block(control.read_text(), ["functions"], "")
        for key, value in (("application", self.solver), ("startFrom", "latestTime"), ("stopAt", "endTime"),
                           ("writeControl", "timeStep"), ("writeFormat", "ascii"), ("purgeWrite", "0")):
            text = fc.set_entry(text, key, value)
        control.write_text(text)
        self._pristine = {p.name: p.read_text() for p in (self.case / "0").iterdir() if p.is_file()}
        res = fc.run_foam("blockMesh", self.case, self._env, self.case / "log.blockMesh", timeout_s=300)
        if res.returncode != 0:
            tail = res.log.read_text(errors="replace")[-800:]
            raise fc.FoamOutputError(f"blockMesh failed in {self.case} (exit {res.returncode}):\n{tail}")

    def _write_initial_fields(self, speed: float) -> None:
        zero = self.case / "0"
        u0 = float(fc.read_vector_field_text(self._pristine["U"], self.inlet_patch)[1][0, 0])
        ratio = speed / u0
        for name, text in self._pristine.items():
            if name == "U":
                text = fc.replace_block(text, ["boundaryField", self.inlet_patch],
                                        f"        type fixedValue;\n        value uniform ({speed:.10g} 0 0);")
            elif name in SPEED_POWER:  # keep the tutorial's turbulence intensity and length scale
                scale = ratio ** SPEED_POWER[name]
                text = re.sub(r"uniform\s+(" + fc.NUMBER + r")\s*;",
                              lambda m, s=scale: f"uniform {float(m.group(1)) * s:.10g};", text)
            (zero / name).write_text(text)

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if self.case is None:
            self._setup_case()
        for t, path in fc.time_dirs(self.case):
            if t != 0:
                shutil.rmtree(path)
        for log in self.case.glob("log.solver*"):
            log.unlink()
        lo, hi = self.inlet_speed_range
        self.inlet_speed = float((options or {}).get("inlet_speed", self.np_random.uniform(lo, hi)))
        self._write_initial_fields(self.inlet_speed)
        self._time, self._iterations = 0, 0
        inlet, domain = self._read_u(self.case / "0" / "U")
        self._obs = self._make_obs(inlet, domain, fill=True)
        return self._obs.copy(), {"inlet_speed": self.inlet_speed, "case": str(self.case)}

    def step(self, action):
        if self.case is None:
            raise RuntimeError("call reset() before step()")
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(2), self.action_space.low, self.action_space.high)
        self._write_controls(float(a[0]), float(a[1]))
        log = self.case / f"log.solver.{self._time:08d}"
        run = self.last_run = fc.run_foam(self.solver, self.case, self._env, log, self.timeout_s)
        info: dict[str, Any] = {"relax_p": float(a[0]), "relax_U": float(a[1]), "inlet_speed": self.inlet_speed}
        try:
            iters, residuals, inlet, domain = self._check_run(run)
        except fc.FoamOutputError as e:
            info.update(failure=str(e), iterations_total=self._iterations)
            return self._obs.copy(), self.penalty, True, False, info
        self._time += iters
        self._iterations += iters
        for old in self.case.glob("log.solver.*"):
            if old != log:
                old.unlink()
        for t, path in fc.time_dirs(self.case):
            if t not in (0, self._time):
                shutil.rmtree(path)
        self._obs = self._make_obs(inlet, domain)
        converged = all(residuals[f] < tol for f, tol in self.tolerances.items())
        truncated = not converged and self._iterations >= self.max_iterations
        info.update(iterations=iters, iterations_total=self._iterations, residuals=residuals, converged=converged)
        return self._obs.copy(), -float(iters), converged, truncated, info

    def close(self) -> None:
        if self.case is not None and self._own_case:
            shutil.rmtree(self.case, ignore_errors=True)
            self.case = None

    # ------------------------------------------------------------------ helpers
    def _write_controls(self, relax_p: float, relax_u: float) -> None:
        control = self.case / "system" / "controlDict"
        text = fc.set_entry(control.read_text(), "endTime", str(self._time + self.n_iter))
        control.write_text(fc.set_entry(text, "writeInterval", str(self.n_iter)))
        solution = self.case / "system" / "fvSolution"
        text = fc.replace_block(solution.read_text(), ["relaxationFactors"],
                                f"    fields\n    {{\n        p {relax_p:.6g};\n    }}\n"
                                f"    equations\n    {{\n        U {relax_u:.6g};\n        \".*\" 0.9;\n    }}")
        body = "\n".join(f"        {name} {tol:g};" for name, tol in self.tolerances.items())
        solution.write_text(fc.replace_block(text, ["SIMPLE", "residualControl"], body))

    def _check_run(self, run: fc.RunResult) -> tuple[int, dict[str, float], float, float]:
        """Iterations, residuals per field and the new observation; FoamOutputError on any failure."""
        if run.timed_out:
            raise fc.FoamOutputError(f"solver killed after the {self.timeout_s:g} s timeout")
        try:
            text = run.log.read_text(errors="replace")
        except OSError as e:
            raise fc.FoamOutputError(f"no solver log: {e}") from e
        if run.returncode != 0:
            raise fc.FoamOutputError(f"solver exited with status {run.returncode}: {fc.parse_failure(text)}")
        log = fc.parse_solver_log(text)
        if log.fatal:
            raise fc.FoamOutputError(f"solver reported {log.fatal}")
        expected = [float(self._time + i + 1) for i in range(log.iterations)]
        if log.times != expected or not log.ended:
            raise fc.FoamOutputError("solver log is truncated or out of order")
        if log.iterations != self.n_iter and not log.converged:
            raise fc.FoamOutputError(f"solver stopped after {log.iterations} of {self.n_iter} iterations without converging")
        residuals: dict[str, float] = {}
        for name, value in log.residuals.items():
            base = name[:-1] if name[-1:] in "xyz" and name[:-1] in self.tolerances else name
            residuals[base] = max(residuals.get(base, 0.0), value)
        missing = [f for f in self.tolerances if f not in residuals]
        if missing or not all(np.isfinite(v) for v in residuals.values()):
            raise fc.FoamOutputError(f"residuals missing or not finite: {residuals} (need {list(self.tolerances)})")
        inlet, domain = self._read_u(self.case / f"{self._time + log.iterations:g}" / "U")
        return log.iterations, residuals, inlet, domain

    def _read_u(self, path: Path) -> tuple[float, float]:
        cells, inlet = fc.read_vector_field(path, self.inlet_patch)
        if not (np.all(np.isfinite(cells)) and np.all(np.isfinite(inlet))):
            raise fc.FoamOutputError(f"non-finite velocity in {path}")
        if np.abs(cells).max(initial=0.0) > self.max_speed:
            raise fc.FoamOutputError(f"velocity above {self.max_speed:g} m/s in {path} (diverged)")
        return float(np.mean(np.sum(inlet**2, axis=1))), float(np.mean(np.sum(cells**2, axis=1)))

    def _make_obs(self, inlet: float, domain: float, fill: bool = False) -> np.ndarray:
        if fill:
            self._past = deque([domain] * self.history, maxlen=self.history)
        obs = np.array([inlet, domain, *self._past], dtype=np.float32)
        if not fill and self.history:
            self._past.appendleft(domain)
        return obs
