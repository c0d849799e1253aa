"""MARLess learning check: IPPO, MAPPO, IQL, VDN on MPE simple-spread (6 agents) vs a random policy.

Each algorithm trains through `hpcrl run hpcrl/configs/mpe_spread_ALGO.yaml` (serial runner by
default; ``--runner mpi`` starts MPI ranks) for ``--seeds`` seeds (env.seed = 0, 1, ...) and a
budget of ``--steps`` agent steps. From each run's run.h5 ``rounds`` table: the first round's
mean episodic return per agent, the final one (mean of the last ``--last`` rounds) and the
wall-clock. The random policy's mean return per agent comes from ``--random-episodes``
episodes per seed with uniformly drawn actions, stepped by the actors' sampler on the same env
copies and seeds as the training runs (simple-spread's returns depend strongly on the start
positions, so the baseline must see the same ones). The table prints each algorithm's mean
and spread over the seeds and the ratios final - random and final - first.

    hpcrl bench marless [--algos ippo,mappo,iql,vdn] [--seeds 3] [--steps 144000] [-o KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

import numpy as np

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def random_return(seeds: int, episodes: int) -> float:
    """Mean per-agent episodic return of uniformly random actions, stepped by the actors' own sampler
    on the same env copies and seeds as the training runs (env.seed = 0 .. seeds - 1)."""
    import torch

    from hpcrl.algos import make_algorithm
    from hpcrl.config import load_config
    from hpcrl.runtime.sampler import VectorSampler, describe_env

    returns = []
    for seed in range(seeds):
        cfg = load_config(CONFIGS / "mpe_spread_iql.yaml", [f"env.seed={seed}", "algo.epsilon_start=1.0"])
        info = describe_env(cfg.env)
        algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
        model = algo.make_model(info.observation_space, info.action_space)  # epsilon 1: uniform actions
        sampler = VectorSampler(cfg.env, 0)
        eps: list[dict] = []
        with torch.no_grad():
            while len(eps) < episodes * cfg.algo.agents:
                eps += sampler.sample(algo, model, cfg.actors.fragment_length, 0, 0)[1]
        sampler.close()
        returns += [e["return"] for e in eps]
    return float(np.mean(returns))


def train(algo: str, seed: int, steps: int, runner: str, overrides: list[str], run_dir: Path) -> dict:
    """One `hpcrl run` in this process; first and final round returns and wall-clock from run.h5."""
    from hpcrl.cli import main as cli_main
    from hpcrl.io import read_table

    args = ["run", str(CONFIGS / f"mpe_spread_{algo}.yaml"), "--runner", runner]
    for o in [f"env.seed={seed}", f"stop.total_env_steps={steps}", f"io.run_dir={run_dir}", *overrides]:
        args += ["-o", o]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the run's progress lines (serial runner)
        rc = cli_main(args)
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"hpcrl bench marless: {algo} seed {seed} failed (hpcrl run exit code {rc})")
    rounds = read_table(run_dir / "run.h5", "rounds")
    rewards = rounds["reward_mean"][np.isfinite(rounds["reward_mean"])]
    return {"first": float(rewards[0]), "rewards": rewards, "wall": wall, "rounds": len(rounds["round"])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench marless", description=__doc__.splitlines()[0])
    p.add_argument("--algos", default="ippo,mappo,iql,vdn")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=144_000, help="agent steps per run (6 per env step)")
    p.add_argument("--last", type=int, default=5, help="final return = mean of the last this many rounds")
    p.add_argument("--runner", choices=("serial", "mpi"), default="serial")
    p.add_argument("--random-episodes", type=int, default=200, help="random-policy episodes per seed")
    p.add_argument("-o", "--override", action="append", default=[], help="KEY=VALUE for every run (e.g. algo.policies=shared)")
    args = p.parse_args(argv)
    baseline = random_return(args.seeds, args.random_episodes)
    print(f"random policy: {baseline:.2f} mean episodic return per agent "
          f"({args.random_episodes} episodes per seed, the training runs' sampler and seeds)")
    print(f"{'algo':6s} {'seed':>4s} {'rounds':>6s} {'first':>8s} {'final':>8s} {'final-random':>12s} "
          f"{'final-first':>11s} {'wall s':>7s}", flush=True)
    summary = {}
    with tempfile.TemporaryDirectory(prefix="hpcrl-bench-marless-") as tmp:
        for algo in args.algos.split(","):
            rows = []
            for seed in range(args.seeds):
                r = train(algo, seed, args.steps, args.runner, args.override, Path(tmp) / f"{algo}-{seed}")
                final = float(np.mean(r["rewards"][-args.last:]))
                rows.append((r["first"], final, r["wall"]))
                print(f"{algo:6s} {seed:4d} {r['rounds']:6d} {r['first']:8.2f} {final:8.2f} {final - baseline:12.2f} "
                      f"{final - r['first']:11.2f} {r['wall']:7.1f}", flush=True)
            summary[algo] = np.array(rows)
    print("\nover seeds: mean +- std")
    print(f"{'algo':6s} {'first':>14s} {'final':>14s} {'final-random':>13s} {'final-first':>12s} {'wall s':>7s}")
    for algo, a in summary.items():
        first, final, wall = a[:, 0], a[:, 1], a[:, 2]
        print(f"{algo:6s} {first.mean():7.2f}+-{first.std():5.2f} {final.mean():7.2f}+-{final.std():5.2f} "
              f"{(final - baseline).mean():13.2f} {(final - first).mean():12.2f} {wall.mean():7.1f}")
    return 0
