"""PAR-RL workloads: Lorenz steps/s, 2D LES step and DNS-reference times, OpenFOAM seconds per step.

Each env is timed against a baseline measured in the same run: the bare integrator or solver
doing the same work outside the env (so the ratio is the env's own overhead), and, for OpenFOAM,
the number of iterations pitzDaily needs with fixed relaxation factors.

    hpcrl bench parrl [--dns-n 256] [--foam-steps 3] [--skip-dns] [--skip-foam]
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def _row(name: str, value: float, unit: str, note: str = "") -> None:
    print(f"{name:44s} {value:12.4g} {unit:10s} {note}")


def bench_lorenz() -> None:
    from hpcrl.envs.parrl.lorenz import LorenzEnv, rk4

    env = LorenzEnv()
    env.reset(seed=0)
    zero = np.zeros(3, np.float32)
    t = time.perf_counter()
    for _ in range(4000):
        env.step(zero)
    env_s = (time.perf_counter() - t) / 4000
    t = time.perf_counter()
    s = (1.0, 1.0, 1.0)
    for _ in range(4000):
        s = rk4(s, 0.002, 10, 20.0, 10.0, 8.0 / 3.0)
    bare_s = (time.perf_counter() - t) / 4000
    _row("lorenz: env step", env_s * 1e6, "us", f"{1 / env_s:,.0f} steps/s")
    _row("lorenz: bare RK4 (10 substeps)", bare_s * 1e6, "us", f"env / bare = {env_s / bare_s:.2f}")


def bench_les(dns_n: int, skip_dns: bool) -> None:
    from hpcrl.envs.parrl.les2d import KraichnanLESEnv
    from hpcrl.envs.parrl.les2d_marl import KraichnanLESParallelEnv

    cache = Path(tempfile.mkdtemp(prefix="hpcrl-bench-les-"))
    try:
        kw = dict(dns_n=dns_n if not skip_dns else 32, cache_dir=cache)
        env = KraichnanLESEnv(**kw)
        t = time.perf_counter()
        env.reset(seed=0)
        gen_s = time.perf_counter() - t
        if not skip_dns:
            snapshots = env.les.reference["w_hat"].shape[0] - 1
            _row(f"les2d: DNS reference {dns_n}^2 to t=4 (generate)", gen_s, "s", f"{snapshots} snapshots")
        t = time.perf_counter()
        KraichnanLESEnv(**kw).reset(seed=0)
        _row("les2d: reference from cache", (time.perf_counter() - t) * 1e3, "ms")
        n, t = 0, time.perf_counter()
        done = False
        while not done:
            _, _, done, _, _ = env.step(np.array([0.05], np.float32))
            n += 1
        step_s = (time.perf_counter() - t) / n
        substeps = env.les.nsub
        les, w = env.les, env.les.reference["w_hat"][0]
        t = time.perf_counter()
        for _ in range(40 * substeps):
            w = les.grid.rk3_step(w, les.les_dt, 1.0 / les.re, 0.05)
        bare_s = (time.perf_counter() - t) / 40
        _row("les2d: single-agent env step (32^2)", step_s * 1e3, "ms", f"{substeps} RK3 substeps / action")
        _row("les2d: bare RK3 substeps for one step", bare_s * 1e3, "ms", f"env / bare = {step_s / bare_s:.2f}")
        marl = KraichnanLESParallelEnv(**kw)
        marl.reset(seed=0)
        acts = {a: np.array([0.05], np.float32) for a in marl.possible_agents}
        n, t = 0, time.perf_counter()
        while marl.agents:
            marl.step(acts)
            n += 1
        _row("les2d: 16-probe parallel env step", (time.perf_counter() - t) / n * 1e3, "ms")
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def bench_foam(steps: int) -> None:
    from hpcrl.envs.parrl import foam_case as fc
    from hpcrl.envs.parrl.openfoam import FoamRelaxationEnv

    if fc.find_bashrc() is None or fc.find_tutorial() is None:
        print(f"openfoam: skipped (not installed; {fc.INSTALL_HINT})")
        return
    work = Path(tempfile.mkdtemp(prefix="hpcrl-bench-foam-"))
    try:
        env = FoamRelaxationEnv(work_dir=str(work))
        t = time.perf_counter()
        env.reset(seed=0, options={"inlet_speed": 50.0})
        _row("openfoam: first reset (copy case + blockMesh)", time.perf_counter() - t, "s")
        walls, solver = [], []
        for _ in range(steps):
            t = time.perf_counter()
            _, _, term, trunc, _ = env.step(np.array([0.5, 0.5], np.float32))
            walls.append(time.perf_counter() - t)
            solver.append(env.last_run.wall_s)
            if term or trunc:
                break
        step_s = float(np.median(walls))
        overhead_s = float(np.median(np.array(walls) - np.array(solver)))
        # baseline: the first 100 iterations by a bare simpleFoam run, repeated from a fresh start
        bare = []
        for _ in range(len(walls)):
            env.reset(seed=0, options={"inlet_speed": 50.0})
            env._write_controls(0.5, 0.5)
            t = time.perf_counter()
            run = fc.run_foam("simpleFoam", env.case, env._env, env.case / "log.bare", timeout_s=600)
            bare.append(time.perf_counter() - t)
        bare_s = float(np.median(bare))
        _row("openfoam: env step (100 simpleFoam iterations)", step_s, "s", f"median of {len(walls)}")
        _row("openfoam: env overhead per step (outside solver)", overhead_s * 1e3, "ms", "edit dicts, parse log and U")
        note = f"env / bare = {step_s / bare_s:.2f} (exit {run.returncode})"
        _row("openfoam: bare simpleFoam, first 100 iterations", bare_s, "s", note)
        for relax in ((0.5, 0.5), (0.95, 0.95)):
            env.reset(seed=0, options={"inlet_speed": 50.0})
            total, t = 0.0, time.perf_counter()
            while True:
                _, r, term, trunc, info = env.step(np.array(relax, np.float32))
                total += r
                if term or trunc:
                    break
            status = "converged" if info.get("converged") else info.get("failure", "truncated")
            note = f"{status}, {time.perf_counter() - t:.1f} s wall"
            _row(f"openfoam: episode return, fixed p,U = {relax}", total, "iters", note)
        env.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench parrl", description=__doc__.splitlines()[0])
    p.add_argument("--dns-n", type=int, default=256, help="DNS grid for the reference-generation timing")
    p.add_argument("--foam-steps", type=int, default=3, help="env steps timed for OpenFOAM")
    p.add_argument("--skip-dns", action="store_true", help="use a 32^2 'DNS' (skips the long generation)")
    p.add_argument("--skip-foam", action="store_true")
    args = p.parse_args(argv)
    print(f"{'measure':44s} {'value':>12s} {'unit':10s} note")
    bench_lorenz()
    bench_les(args.dns_n, args.skip_dns)
    if not args.skip_foam:
        bench_foam(args.foam_steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
