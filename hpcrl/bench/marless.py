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

    hpcrl bench marless [--env spread] [--algos ippo,mappo,iql,vdn] [--seeds 3] [--steps 144000] [--jobs 1]
        [--out DIR] [-o KEY=VALUE ...]

``--compare``: MARLess' ablation (section 6.3-6.4): each algorithm and seed once per arm, for
``--rounds`` rounds each (``stop.max_rounds``; the seed trains 100): ``off`` (as configured, sharing
and actor scaling off), ``on`` (``algo.sharing=true algo.actor_scaling=true``), and with ``--arms``
also ``sharing`` or ``scaling`` alone. Per run: the final return
(mean of the last ``--last`` rounds), rounds, learner and actor active rank-seconds and the
learner+actor serverless cost, computed by ``hpcrl analyze``'s own accounting (hpcrl_analysis'
``marl.cost_split``, ``--prices`` or analysis/prices.json); then per algorithm the means over the
seeds and the cost ratio on/off. ``--pricing marless`` adds MARLess' own pricing per arm (AWS Lambda
functions with pre-warm against a c6a.16xlarge, hpcrl_analysis/pricing.py), the ratio both ways.

    hpcrl bench marless --compare [--algos ippo] [--seeds 3] [--rounds 100] [--arms off,on] [--pricing marless]
        [--jobs 1] [--out DIR] [-o actors.count=6 ...]

Both modes run their ``hpcrl run``s as a sweep in ``--out`` (default: a new temporary folder), ``--jobs`` at a
time (hpcrl/bench/sweep_runs.py: runs in ``OUT/runs/ENV-ALGO-STEPS-sSEED`` or ``ALGO-ARM-rROUNDS-sSEED``, state
in ``OUT/sweep.json``), and append each finished run's row to ``OUT/results.jsonl`` (the random policy's returns
too). A row counts only for the run's config file, overrides and the settings it was read with (``--prices``,
``--cross-episodes``), so the same ``--out`` runs only what is missing, goes on from the checkpoints of runs
stopped part way, and prints the same tables again when nothing is.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
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
    from hpcrl.algos import make_algorithm
    from hpcrl.config import load_config
    from hpcrl.runtime.roles.sampler import describe_env

    returns, agent = [], []
    for seed in range(seeds):
        # an IQL model at epsilon 1 acts uniformly (simple-adversary's IQL config: VDN refuses it)
        cfg = load_config(config_path(env, "iql"), [f"env.seed={seed}", "algo.epsilon_start=1.0"])
        info = describe_env(cfg.env)
        algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
        model = algo.make_model(info.observation_space, info.action_space)  # epsilon 1: uniform actions
        eps = play(cfg, algo, model, episodes)
        returns += [e.episode_return for e in eps]
        agent += [e.env_index % cfg.algo.agents for e in eps]
    returns, agent = np.array(returns), np.array(agent)
    out = {g: float(returns[np.isin(agent, m)].mean()) for g, m in GROUPS[env].items()}
    return with_sum(out)


class AgainstRandom:
    """An algorithm's ``act`` for the agents of ``trained`` (indices in an env copy); the others draw
    their actions uniformly (what :func:`random_return`'s agents do)."""

    def __init__(self, algo, trained: tuple[int, ...], agents: int, actions: int, seed: int) -> None:
        import torch

        self.algo, self.agents, self.actions = algo, agents, actions
        self.trained = torch.as_tensor(trained)
        self.generator = torch.Generator().manual_seed(seed)

    def act(self, model, obs):
        import torch

        a, logp, v = self.algo.act(model, obs)
        uniform = ~torch.isin(torch.arange(len(a)) % self.agents, self.trained)
        a = a.clone()
        a[uniform] = torch.randint(self.actions, (int(uniform.sum()),), generator=self.generator)
        return a, logp, v

    def act_numpy(self, model, obs):
        return tuple(t.cpu().numpy() for t in self.act(model, obs))

    def value(self, model, obs):
        return self.algo.value(model, obs)


def cross_play(env: str, run_dir: Path, episodes: int, warmup_fragments: int = 10) -> dict[str, float]:
    """simple-adversary: each side's trained policy (the run's last checkpoint) against the other side
    acting uniformly, on the training seeds' env copies: ``good vs uniform adv`` (compare with the random
    policy's ``good``, which meets the same uniform adversary) and ``adv vs uniform good`` (compare with
    its ``adversary``). A competitive run can lower one side's return while that side learns, because the
    other side learns too; against a fixed opponent a side that learned beats the uniform policy.

    The sampler standardises observations with its own running statistics (``env.normalize_obs``, per
    actor as in training): ``warmup_fragments`` fragments fill them before episodes are counted."""
    from hpcrl.algos import make_algorithm
    from hpcrl.config import load_config
    from hpcrl.runtime.record.checkpoint import load_checkpoint
    from hpcrl.runtime.roles.sampler import describe_env

    cfg = load_config(run_dir / "config.yaml")
    info = describe_env(cfg.env)
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    model = algo.make_model(info.observation_space, info.action_space)
    model.flat.load_(np.asarray(load_checkpoint(run_dir)["params"], dtype=np.float32))
    agents, out = cfg.algo.agents, {}
    for name, side in (("good vs uniform adv", "good"), ("adv vs uniform good", "adversary")):
        members = GROUPS[env][side]
        actor = AgainstRandom(algo, members, agents, int(info.action_space.n), cfg.env.seed)
        eps = play(cfg, actor, model, episodes, warmup_fragments)
        out[name] = float(np.mean([e.episode_return for e in eps if e.env_index % agents in members]))
    return out


CROSS_BASELINE = {"good vs uniform adv": "good", "adv vs uniform good": "adversary"}
"""The random-policy group each cross-play row is compared with (both sides uniform)."""


def play(cfg, actor, model, episodes: int, warmup_fragments: int = 0) -> list:
    """At least ``episodes`` finished episodes per agent of ``cfg.env`` (the copies and seed of actor rank 0),
    ``actor.act`` choosing the actions, after ``warmup_fragments`` uncounted fragments."""
    import torch

    from hpcrl.runtime.roles.sampler import VectorSampler

    sampler = VectorSampler(cfg.env, 0)
    eps: list = []
    with torch.no_grad():
        for _ in range(warmup_fragments):
            sampler.sample(actor, model, cfg.actors.fragment_length, 0, 0)
        while len(eps) < episodes * cfg.algo.agents:
            eps += sampler.sample(actor, model, cfg.actors.fragment_length, 0, 0)[1]
    sampler.close()
    return eps


def with_sum(groups: dict) -> dict:
    """simple-adversary's groups plus ``good+adv`` (their sum: the good agents' own distance term)."""
    return {**groups, "good+adv": groups["good"] + groups["adversary"]} if "adversary" in groups else groups


class Results:
    """The bench's rows in OUT/results.jsonl. A row holds the key it was made under (its run, the config file's
    SHA-256, the run's overrides and the settings its numbers were read with) and counts for that key only: rows
    of other settings stay in the file, unused."""

    def __init__(self, out: Path) -> None:
        self.file = out / "results.jsonl"
        text = self.file.read_text() if self.file.exists() else ""
        self.rows = [json.loads(line) for line in text.splitlines() if line.strip()]

    def get(self, key: dict) -> dict | None:
        return next((r for r in reversed(self.rows) if all(r.get(k) == v for k, v in key.items())), None)

    def add(self, key: dict, numbers: dict) -> dict:
        row = {"bench": "marless", **key, **numbers}
        with self.file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.rows.append(row)
        return row


def sweep_run(env: str, algo: str, label: str, seed: int, steps: int, runner: str, overrides: list[str]):
    """One algorithm's ``hpcrl run`` for ``seed``, as the sweep run LABEL-sSEED: env.seed and the budget of ``steps``
    agent steps, then ``overrides`` (so a ``stop.*`` override wins), then ``launch.runner`` (what ``hpcrl run
    --runner`` sets, after the overrides)."""
    from hpcrl.sweep.spec import SweepRun

    config = config_path(env, algo)
    over = (f"env.seed={seed}", f"stop.total_env_steps={steps}", *overrides, f"launch.runner={runner}")
    return SweepRun(f"{label}-s{seed}", str(config), over, config.stem, label, seed)


def run_key(mode: str, run, **settings) -> dict:
    """The key of a run's row: what makes the run (config file and contents, overrides) and ``settings``."""
    return {"mode": mode, "run": run.name, "config": Path(run.config).name, "config_sha256": run.config_sha256(),
            "overrides": list(run.overrides), **settings}


def rows_of(results: Results, out: Path, wanted: list[tuple], jobs: int, numbers) -> dict[str, dict]:
    """Each wanted (run, key)'s row: from results.jsonl, else from the run (started, resumed, or only read when
    OUT/sweep.json has it done already: ``numbers(run_dir, seconds)``) and appended. A run that did not finish
    has no row; its status is printed."""
    from hpcrl.bench.sweep_runs import run_sweep

    rows = {run.name: row for run, key in wanted if (row := results.get(key)) is not None}
    todo = [(run, key) for run, key in wanted if run.name not in rows]
    print(f"marless: {len(todo)} of {len(wanted)} runs without a row ({jobs} at a time), results in {results.file}",
          flush=True)
    entries = run_sweep("marless", out, [run for run, _ in todo], jobs)
    for run, key in todo:
        entry = entries[run.name]
        if entry["status"] == "done":
            rows[run.name] = results.add(key, numbers(out / "runs" / run.name, entry["seconds"]))
        else:
            print(f"  {run.name}: {entry['status']} {entry.get('message', '')}", flush=True)
    return rows


def group_returns(env: str, run_dir: Path) -> tuple[dict[str, np.ndarray], int]:
    """Per group (:data:`GROUPS`) the rounds' mean return per agent (rounds without an episode of the group left
    out), and the number of rounds, from run.h5."""
    from hpcrl.io import read_table

    rounds = read_table(run_dir / "run.h5", "rounds")
    groups = GROUPS[env]
    if len(groups) == 1:
        per_round = {g: rounds["reward_mean"] for g in groups}
    else:
        episodes = read_table(run_dir / "run.h5", "episodes")
        per_round = with_sum({g: round_group_returns(episodes, rounds["episodes"], 6, m) for g, m in groups.items()})
    return {g: r[np.isfinite(r)] for g, r in per_round.items()}, len(rounds["round"])


COMPARE = {"off": ["algo.sharing=false", "algo.actor_scaling=false"],
           "on": ["algo.sharing=true", "algo.actor_scaling=true"],
           "sharing": ["algo.sharing=true", "algo.actor_scaling=false"],
           "scaling": ["algo.sharing=false", "algo.actor_scaling=true"]}
"""The arms of --compare (after the user's overrides, so they decide); MARLess section 6.4's ablation is
sharing (w/o scaling) and scaling (w/o sharing)."""


def run_cost(run_dir: Path, prices: str | None, pricing: str = "stellaris", marless_prices: str | None = None) -> dict:
    """Learner and actor active rank-seconds and the learner+actor serverless cost, as `hpcrl analyze` counts them;
    with ``pricing="marless"`` also MARLess' Lambda cost (every function, pre-warm and requests included) and the
    c6a.16xlarge's (``hpcrl analyze --pricing marless``)."""
    from hpcrl.commands.analyze import load_analysis

    ha = load_analysis()
    run = ha.load_run(run_dir)
    split = ha.marl.cost_split(run, ha.metrics.load_prices(prices))
    out = {"learner_s": float(split["learner_seconds"]), "actor_s": float(split["actor_seconds"]),
           "cost": float(split["serverless_learner_actor"])}
    if pricing == "marless":
        c = ha.pricing.marless_cost(run, ha.pricing.load_marless_prices(marless_prices))
        out.update({"lambda": float(c["serverless"]), "serverful": float(c["serverful"])})
    return out


def compare_numbers(run_dir: Path, seconds: float, args) -> dict:
    """A --compare run's row: rounds, agent steps, the rounds' mean returns, its cost (:func:`run_cost`), the
    mean active actors per round and its seconds."""
    from hpcrl.io import read_table

    rewards, rounds = group_returns("spread", run_dir)
    table = read_table(run_dir / "run.h5", "rounds")
    sc = read_table(run_dir / "run.h5", "actor_scaling")
    count = int(read_table(run_dir / "run.h5", "rank_map")["role"].tolist().count(2))
    # active actors per round: the count in force (the decision of the round before)
    actors = np.concatenate([[count], sc["active"][:-1]]) if len(sc["round"]) else np.full(rounds, count)
    return {"rounds": rounds, "agent_steps": int(table["env_steps"].sum()), "rewards": rewards["all"].tolist(),
            **run_cost(run_dir, args.prices, args.pricing, args.marless_prices), "wall": seconds,
            "actors": float(np.mean(actors))}


def compare(args, out: Path) -> int:
    """Sharing + actor scaling on vs off at equal rounds: final return and learner+actor serverless cost."""
    algos = args.algos.split(",")
    wanted = {}
    for seed in range(args.seeds):  # seed by seed: machine load hits every algorithm and arm alike
        for algo in algos:
            for arm in args.arms:
                run = sweep_run("spread", algo, f"{algo}-{arm}-r{args.rounds}", seed, 10**12, args.runner,
                                [f"stop.max_rounds={args.rounds}", *args.override, *COMPARE[arm]])
                wanted[(algo, arm, seed)] = (run, run_key("compare", run, prices=args.prices, pricing=args.pricing,
                                                          marless_prices=args.marless_prices))
    rows = rows_of(Results(out), out, list(wanted.values()), args.jobs,
                   lambda run_dir, seconds: compare_numbers(run_dir, seconds, args))
    print(f"{'algo':6s} {'arm':7s} {'seed':>4s} {'rounds':>6s} {'agent steps':>11s} {'final':>8s} {'learner s':>9s} "
          f"{'actor s':>8s} {'cost':>10s} {'mean actors':>11s} {'wall s':>7s}", flush=True)
    done: dict[tuple[str, str], list] = {}
    for algo in algos:
        for seed in range(args.seeds):
            for arm in args.arms:
                r = rows.get(wanted[(algo, arm, seed)][0].name)
                if r is None:
                    continue
                r = {**r, "final": float(np.mean(r["rewards"][-args.last:]))}
                done.setdefault((algo, arm), []).append(r)
                print(f"{algo:6s} {arm:7s} {seed:4d} {r['rounds']:6d} {r['agent_steps']:11d} {r['final']:8.2f} "
                      f"{r['learner_s']:9.1f} {r['actor_s']:8.1f} {r['cost']:10.3g} {r['actors']:11.2f} "
                      f"{r['wall']:7.1f}", flush=True)
    print("\nover seeds: mean +- std; cost = learner + actor serverless (hpcrl analyze's accounting)")
    print(f"{'algo':6s} {'arm':7s} {'final':>14s} {'learner s':>9s} {'actor s':>8s} {'cost':>10s} {'cost/off':>8s}")
    for algo in algos:
        base = np.mean([x["cost"] for x in done[(algo, "off")]]) if (algo, "off") in done else float("nan")
        for arm in [a for a in args.arms if (algo, a) in done]:
            runs = done[(algo, arm)]
            final, cost = np.array([x["final"] for x in runs]), float(np.mean([x["cost"] for x in runs]))
            print(f"{algo:6s} {arm:7s} {final.mean():7.2f}+-{final.std():5.2f} "
                  f"{np.mean([x['learner_s'] for x in runs]):9.1f} {np.mean([x['actor_s'] for x in runs]):8.1f} "
                  f"{cost:10.3g} {cost / base if base > 0 else float('nan'):8.3f}")
    if args.pricing == "marless":
        marless_table(done, args)
    return missing(len(wanted) - len(rows), out)


def marless_table(done: dict, args) -> None:
    """Per algorithm and arm, MARLess' pricing (mean over seeds): Lambda, c6a.16xlarge, both ratios, and vs off."""
    print("\nMARLess pricing (hpcrl analyze --pricing marless): every function at AWS Lambda's GB-second and request "
          "prices, pre-warm charged, against a c6a.16xlarge for the wall-clock; USD, mean over seeds")
    print(f"{'algo':6s} {'arm':7s} {'Lambda':>10s} {'c6a.16xl':>10s} {'L / c6a':>8s} {'c6a / L':>8s} {'L / L off':>9s}")
    for algo in args.algos.split(","):
        base = np.mean([x["lambda"] for x in done[(algo, "off")]]) if (algo, "off") in done else float("nan")
        for arm in [a for a in args.arms if (algo, a) in done]:
            lam = float(np.mean([x["lambda"] for x in done[(algo, arm)]]))
            sf = float(np.mean([x["serverful"] for x in done[(algo, arm)]]))
            print(f"{algo:6s} {arm:7s} {lam:10.4g} {sf:10.4g} {lam / sf if sf > 0 else float('nan'):8.3f} "
                  f"{sf / lam if lam > 0 else float('nan'):8.3f} {lam / base if base > 0 else float('nan'):9.3f}")


def missing(count: int, out: Path) -> int:
    """The exit code: 1 (and a line on stderr) when ``count`` runs failed or are missing."""
    if count:
        print(f"{count} run(s) failed or are missing; run again with --out {out}", file=sys.stderr)
    return 1 if count else 0


def baseline_of(results: Results, env: str, seeds: int, episodes: int) -> dict[str, float]:
    """The random policy's return per group (:func:`random_return`), from results.jsonl or played and appended."""
    key = {"mode": "random", "env": env, "seeds": seeds, "episodes": episodes}
    row = results.get(key) or results.add(key, {"returns": random_return(env, seeds, episodes)})
    return row["returns"]


def train_all(args, out: Path) -> int:
    """Each algorithm and seed trained for ``--steps`` agent steps, against the random policy and its first round."""
    algos = args.algos.split(",")
    results = Results(out)
    baseline = baseline_of(results, args.env, args.seeds, args.random_episodes)
    cross_episodes = args.cross_episodes if args.env == "adversary" else 0
    wanted = {}
    for seed in range(args.seeds):  # seed by seed: machine load hits every algorithm alike
        for algo in algos:
            run = sweep_run(args.env, algo, f"{args.env}-{algo}-{args.steps}", seed, args.steps, args.runner,
                            args.override)
            wanted[(algo, seed)] = (run, run_key("train", run, cross_episodes=cross_episodes))

    def numbers(run_dir: Path, seconds: float) -> dict:
        rewards, rounds = group_returns(args.env, run_dir)
        return {"rounds": rounds, "rewards": {g: r.tolist() for g, r in rewards.items()}, "wall": seconds,
                "cross": cross_play(args.env, run_dir, cross_episodes) if cross_episodes else {}}

    rows = rows_of(results, out, list(wanted.values()), args.jobs, numbers)
    for g, b in baseline.items():
        print(f"random policy ({g}): {b:.2f} mean episodic return per agent "
              f"({args.random_episodes} episodes per seed, the training runs' sampler and seeds)")
    print(f"{'algo':6s} {'group':9s} {'seed':>4s} {'rounds':>6s} {'first':>8s} {'final':>8s} {'final-random':>12s} "
          f"{'final-first':>11s} {'wall s':>7s}", flush=True)
    done: dict[tuple[str, str], list] = {}
    cross: dict[tuple[str, str], list] = {}
    for algo in algos:
        for seed in range(args.seeds):
            r = rows.get(wanted[(algo, seed)][0].name)
            if r is None:
                continue
            for g, rewards in r["rewards"].items():
                first, final = float(rewards[0]), float(np.mean(rewards[-args.last:]))
                done.setdefault((algo, g), []).append((first, final, r["wall"]))
                print(f"{algo:6s} {g:9s} {seed:4d} {r['rounds']:6d} {first:8.2f} {final:8.2f} "
                      f"{final - baseline[g]:12.2f} {final - first:11.2f} {r['wall']:7.1f}", flush=True)
            for name, value in r["cross"].items():
                cross.setdefault((algo, name), []).append(value)
                print(f"{algo:6s} {name}: {value:.2f} (uniform on both sides: {baseline[CROSS_BASELINE[name]]:.2f}; "
                      f"difference {value - baseline[CROSS_BASELINE[name]]:+.2f})", flush=True)
    print("\nover seeds: mean +- std")
    print(f"{'algo':6s} {'group':9s} {'first':>14s} {'final':>14s} {'final-random':>13s} {'final-first':>12s} "
          f"{'wall s':>7s}")
    for (algo, g), runs in done.items():
        a = np.array(runs)
        first, final, wall = a[:, 0], a[:, 1], a[:, 2]
        print(f"{algo:6s} {g:9s} {first.mean():7.2f}+-{first.std():5.2f} {final.mean():7.2f}+-{final.std():5.2f} "
              f"{(final - baseline[g]).mean():13.2f} {(final - first).mean():12.2f} {wall.mean():7.1f}")
    if cross:
        print("\ncross-play, final weights against a uniform opponent (mean +- std over seeds; uniform on both sides):")
        for (algo, name), values in cross.items():
            v, base = np.array(values), baseline[CROSS_BASELINE[name]]
            print(f"{algo:6s} {name:20s} {v.mean():7.2f}+-{v.std():5.2f}  uniform {base:7.2f}  "
                  f"difference {v.mean() - base:+.2f} ({int((v > base).sum())}/{v.size} seeds above)")
    return missing(len(wanted) - len(rows), out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench marless", description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=tuple(GROUPS), default="spread", help="MPE simple-spread or simple-adversary")
    p.add_argument("--algos", default=None, help="default: ippo,mappo,iql,vdn (spread), ippo,mappo,iql (adversary)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=144_000, help="agent steps per run (6 per env step)")
    p.add_argument("--last", type=int, default=5, help="final return = mean of the last this many rounds")
    p.add_argument("--runner", choices=("serial", "mpi"), default="serial")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--out", help="results folder (default: a new temporary one); a run it holds is not run again")
    p.add_argument("--random-episodes", type=int, default=200, help="random-policy episodes per seed")
    p.add_argument("--cross-episodes", type=int, default=200,
                   help="--env adversary: episodes per side of each run's cross-play against a uniform opponent (0: none)")
    p.add_argument("-o", "--override", action="append", default=[], help="KEY=VALUE for every run (e.g. algo.policies=shared)")
    p.add_argument("--compare", action="store_true",
                   help="sharing + actor scaling on vs off at equal rounds: final return and serverless cost")
    p.add_argument("--rounds", type=int, default=100, help="--compare: rounds per run (stop.max_rounds)")
    p.add_argument("--prices", default=None, help="--compare: price table (default analysis/prices.json)")
    p.add_argument("--pricing", choices=("stellaris", "marless"), default="stellaris",
                   help="--compare: marless also prices every run as MARLess does (AWS Lambda vs c6a.16xlarge, both ways)")
    p.add_argument("--marless-prices", default=None, help="--compare --pricing marless: a table overriding "
                                                        "analysis/prices-marless.json's defaults")
    p.add_argument("--arms", default="off,on", help="--compare: arms to run, of " + ",".join(COMPARE)
                   + " (on = sharing + scaling; cost/off needs off)")
    args = p.parse_args(argv)
    args.algos = args.algos or ("ippo,mappo,iql,vdn" if args.env == "spread" else "ippo,mappo,iql")
    if args.seeds < 1 or args.jobs < 1:
        p.error("--seeds and --jobs must be at least 1")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-bench-marless-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.compare:
        if args.env != "spread":
            p.error("--compare: --env spread only")
        args.arms = args.arms.split(",")
        if unknown := sorted(set(args.arms) - set(COMPARE)):
            p.error(f"--arms: unknown {','.join(unknown)}; allowed: {','.join(COMPARE)}")
        return compare(args, out)
    return train_all(args, out)
