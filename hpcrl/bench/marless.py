"""MARLess learning check: IPPO, MAPPO, IQL, VDN on MPE simple-spread or simple-adversary (6 agents) vs a random policy.

Each algorithm trains through `hpcrl run hpcrl/configs/mpe_ENV_ALGO.yaml` (``--env spread`` or
``adversary``; serial runner by default, ``--runner mpi`` starts MPI ranks) for ``--seeds`` seeds
(env.seed = 0, 1, ...) and a budget of ``--steps`` agent steps. From each run's run.h5: the
first round's mean episodic return per agent, the final one (mean of the last ``--last``
rounds) and the wall-clock. The random policy's mean return per agent comes from
``--random-episodes`` episodes per seed with uniformly drawn actions, stepped by the actors'
sampler on the same env copies and seeds as the training runs (simple-spread's returns depend
strongly on the start positions, so the baseline must see the same ones). The table prints
each algorithm's mean and spread over the seeds and the ratios final - random and final - first.

Returns are per agent group (:data:`GROUPS`): simple-spread has one (``all``, the ``rounds``
table's ``reward_mean``); simple-adversary's agent 0 is the adversary and agents 1-5 the good
agents, whose returns are reported apart (the ``episodes`` table, agent = ``env_index`` mod 6,
split into rounds by the ``rounds`` table's ``episodes`` counts). A good agent's reward is the
adversary's distance to the target minus the nearest good agent's, the adversary's minus its
own distance, so a learning adversary lowers the good agents' return; the row ``good+adv``
(the two groups' sum, = -sum_t min_i |good_i - target|) shows the good agents' own part.

    hpcrl bench marless [--env spread] [--algos ippo,mappo,iql,vdn] [--seeds 3] [--steps 144000] [-o KEY=VALUE ...]
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

GROUPS = {"spread": {"all": (0, 1, 2, 3, 4, 5)}, "adversary": {"good": (1, 2, 3, 4, 5), "adversary": (0,)}}
"""Agent groups whose returns are reported apart, per env (agent index in the env's possible_agents order)."""


def config_path(env: str, algo: str) -> Path:
    return CONFIGS / f"mpe_{env}_{algo}.yaml"


def round_group_returns(episodes: dict, round_episodes: np.ndarray, agents: int,
                        members: tuple[int, ...]) -> np.ndarray:
    """Mean return per round of the episodes of agents ``members``, NaN for a round without any.

    ``episodes``: the run's ``episodes`` table (rows in arrival order); ``round_episodes``: the
    ``rounds`` table's ``episodes`` column (how many of those rows each round received)."""
    bounds = np.concatenate([[0], np.cumsum(round_episodes)])
    if bounds[-1] > len(episodes["return"]):
        raise ValueError(f"rounds count {bounds[-1]} episodes, the episodes table has {len(episodes['return'])}")
    agent = np.asarray(episodes["env_index"]) % agents
    mine = np.isin(agent, members)
    ret = np.asarray(episodes["return"], dtype=np.float64)
    out = np.full(len(round_episodes), np.nan)
    for k in range(len(round_episodes)):
        sel = mine[bounds[k]:bounds[k + 1]]
        if sel.any():
            out[k] = ret[bounds[k]:bounds[k + 1]][sel].mean()
    return out


def random_return(env: str, seeds: int, episodes: int) -> dict[str, float]:
    """Mean per-agent episodic return of uniformly random actions per agent group, stepped by the actors'
    own sampler on the same env copies and seeds as the training runs (env.seed = 0 .. seeds - 1)."""
    import torch

    from hpcrl.algos import make_algorithm
    from hpcrl.config import load_config
    from hpcrl.runtime.sampler import VectorSampler, describe_env

    returns, agent = [], []
    for seed in range(seeds):
        # an IQL model at epsilon 1 acts uniformly (simple-adversary's IQL config: VDN refuses it)
        cfg = load_config(config_path(env, "iql"), [f"env.seed={seed}", "algo.epsilon_start=1.0"])
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
        agent += [e["env_index"] % cfg.algo.agents for e in eps]
    returns, agent = np.array(returns), np.array(agent)
    out = {g: float(returns[np.isin(agent, m)].mean()) for g, m in GROUPS[env].items()}
    return with_sum(out)


def with_sum(groups: dict) -> dict:
    """simple-adversary's groups plus ``good+adv`` (their sum: the good agents' own distance term)."""
    return {**groups, "good+adv": groups["good"] + groups["adversary"]} if "adversary" in groups else groups


def train(env: str, algo: str, seed: int, steps: int, runner: str, overrides: list[str], run_dir: Path) -> dict:
    """One `hpcrl run` in this process; per group the rounds' returns, and the wall-clock, from run.h5."""
    from hpcrl.cli import main as cli_main
    from hpcrl.io import read_table

    args = ["run", str(config_path(env, algo)), "--runner", runner]
    for o in [f"env.seed={seed}", f"stop.total_env_steps={steps}", f"io.run_dir={run_dir}", *overrides]:
        args += ["-o", o]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the run's progress lines (serial runner)
        rc = cli_main(args)
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"hpcrl bench marless: {algo} seed {seed} failed (hpcrl run exit code {rc})")
    rounds = read_table(run_dir / "run.h5", "rounds")
    groups = GROUPS[env]
    if len(groups) == 1:
        per_round = {g: rounds["reward_mean"] for g in groups}
    else:
        episodes = read_table(run_dir / "run.h5", "episodes")
        per_round = with_sum({g: round_group_returns(episodes, rounds["episodes"], 6, m) for g, m in groups.items()})
    rewards = {g: r[np.isfinite(r)] for g, r in per_round.items()}
    return {"rewards": rewards, "wall": wall, "rounds": len(rounds["round"])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench marless", description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=tuple(GROUPS), default="spread", help="MPE simple-spread or simple-adversary")
    p.add_argument("--algos", default=None, help="default: ippo,mappo,iql,vdn (spread), ippo,mappo,iql (adversary)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=144_000, help="agent steps per run (6 per env step)")
    p.add_argument("--last", type=int, default=5, help="final return = mean of the last this many rounds")
    p.add_argument("--runner", choices=("serial", "mpi"), default="serial")
    p.add_argument("--random-episodes", type=int, default=200, help="random-policy episodes per seed")
    p.add_argument("-o", "--override", action="append", default=[], help="KEY=VALUE for every run (e.g. algo.policies=shared)")
    args = p.parse_args(argv)
    algos = (args.algos or ("ippo,mappo,iql,vdn" if args.env == "spread" else "ippo,mappo,iql")).split(",")
    baseline = random_return(args.env, args.seeds, args.random_episodes)
    for g, b in baseline.items():
        print(f"random policy ({g}): {b:.2f} mean episodic return per agent "
              f"({args.random_episodes} episodes per seed, the training runs' sampler and seeds)")
    print(f"{'algo':6s} {'group':9s} {'seed':>4s} {'rounds':>6s} {'first':>8s} {'final':>8s} {'final-random':>12s} "
          f"{'final-first':>11s} {'wall s':>7s}", flush=True)
    summary: dict[tuple[str, str], list] = {}
    with tempfile.TemporaryDirectory(prefix="hpcrl-bench-marless-") as tmp:
        for algo in algos:
            for seed in range(args.seeds):
                r = train(args.env, algo, seed, args.steps, args.runner, args.override, Path(tmp) / f"{algo}-{seed}")
                for g, rewards in r["rewards"].items():
                    first, final = float(rewards[0]), float(np.mean(rewards[-args.last:]))
                    summary.setdefault((algo, g), []).append((first, final, r["wall"]))
                    print(f"{algo:6s} {g:9s} {seed:4d} {r['rounds']:6d} {first:8.2f} {final:8.2f} "
                          f"{final - baseline[g]:12.2f} {final - first:11.2f} {r['wall']:7.1f}", flush=True)
    print("\nover seeds: mean +- std")
    print(f"{'algo':6s} {'group':9s} {'first':>14s} {'final':>14s} {'final-random':>13s} {'final-first':>12s} "
          f"{'wall s':>7s}")
    for (algo, g), rows in summary.items():
        a = np.array(rows)
        first, final, wall = a[:, 0], a[:, 1], a[:, 2]
        print(f"{algo:6s} {g:9s} {first.mean():7.2f}+-{first.std():5.2f} {final.mean():7.2f}+-{final.std():5.2f} "
              f"{(final - baseline[g]).mean():13.2f} {(final - first).mean():12.2f} {wall.mean():7.1f}")
    return 0
