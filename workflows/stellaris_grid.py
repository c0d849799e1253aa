"""Stellaris' comparisons on one workload: admission policies x algorithms x repeats, then curves and cost.

    python workflows/stellaris_grid.py --site local --workload hopper --policies stellaris sync \\
        --algos ppo --repeats 2 --parallel-runs 2 -o actors.count=2 -o learners.groups=2 \\
        -o learners.min_active=2 -o stop.total_env_steps=20000
    python workflows/stellaris_grid.py --site polaris --account MyProject --workload qbert --repeats 10

Each run (hpcrl/configs/stellaris/WORKLOAD_ALGO.yaml with aggregation.policy and env.seed = repeat
index set) is one Parsl MPI app; ``stellaris_no_is`` is stellaris with aggregation.is_truncation
off (Fig. 11b). When every run has finished, a dependent app reads the runs' HDF5 and writes into
OUT (default runs/stellaris-grid-WORKLOAD-TIME):

- summary.csv: per algorithm and policy, mean and std over repeats of the final return (last 20
  episodes), wall-clock, Stellaris cost (USD, Section VIII-A prices) and admitted staleness;
- curves.csv and curves-ALGO.png: mean return with its min-max band over repeats against
  wall-clock, one line per policy (the shape of Figs. 6, 7 and 11);
- cost.png: the mean cost per algorithm and policy (Fig. 8 / 11 shape);
- logs/seedK/POLICY~ENV~ALGO~{info,timeline}.csv: the Stellaris artifact's files, for its plot.py.

The full budget is the configs' (50 rounds); -o applies to every run (an algo.X override only to
the algorithms that have X).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from parsl import python_app

from _common import ConfigError, fail, make_config, site_settings, stamp
from _stellaris import (RUN_COLUMNS, WORKLOADS, artifact_logs, curves, mean_std, pyplot, run_grid, run_numbers,
                        workload_config, write_csv)
from hpcrl.bench.stellaris_runs import ABLATION, policy_overrides
from hpcrl.parsl_runs import prepare
from hpcrl.sites.parsl_configs import SITES

POLICIES = ("stellaris", "sync", "pure_async", "ssp", "softsync")
VARIANTS = {"stellaris_no_is": ABLATION["stellaris_no_is"]}
SUMMARY_COLUMNS = ["algo", "policy", "repeats"] + [f"{c}_{s}" for c in ("final_return", "wall_seconds", "cost",
                                                                        "staleness_mean") for s in ("mean", "std")]


@python_app(executors=["local"])
def summarise(runs: list[dict], out: str, window: int = 20, inputs=()) -> list[dict]:
    """Runs once every run in ``inputs`` has finished; ``runs``: [{algo, policy, seed, run_dir}]."""
    out_dir = Path(out)
    for r in runs:
        r.update(run_numbers(r["run_dir"], window))
        artifact_logs(r["run_dir"], out_dir / "logs" / f"seed{r['seed']}")
    write_csv(out_dir / "runs.csv", runs, ["algo", "policy", "seed", *RUN_COLUMNS, "run_dir"])
    settings = sorted(dict.fromkeys((r["algo"], r["policy"]) for r in runs), key=lambda s: s[0])  # stable: policy order
    rows, curve_rows = [], []
    for algo, policy in settings:
        mine = [r for r in runs if (r["algo"], r["policy"]) == (algo, policy)]
        row = {"algo": algo, "policy": policy, "repeats": len(mine)}
        for col in ("final_return", "wall_seconds", "cost", "staleness_mean"):
            row[f"{col}_mean"], row[f"{col}_std"] = mean_std([r[col] for r in mine])
        rows.append(row)
        c = curves([r["run_dir"] for r in mine], "time", window=window)
        curve_rows += [{"algo": algo, "policy": policy, "wall_seconds": x, "return_mean": m, "return_min": lo,
                        "return_max": hi, "repeats": n}
                       for x, m, lo, hi, n in zip(c["x"], c["mean"], c["min"], c["max"], c["count"])]
    write_csv(out_dir / "summary.csv", rows, SUMMARY_COLUMNS)
    write_csv(out_dir / "curves.csv", curve_rows, ["algo", "policy", "wall_seconds", "return_mean", "return_min",
                                                   "return_max", "repeats"])
    figures(rows, curve_rows, out_dir)
    return rows


def figures(rows: list[dict], curve_rows: list[dict], out_dir: Path) -> None:
    plt = pyplot()
    for algo in sorted({r["algo"] for r in rows}):
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy in [r["policy"] for r in rows if r["algo"] == algo]:
            pts = [c for c in curve_rows if (c["algo"], c["policy"]) == (algo, policy)]
            x = [c["wall_seconds"] for c in pts]
            ax.plot(x, [c["return_mean"] for c in pts], label=policy)
            ax.fill_between(x, [c["return_min"] for c in pts], [c["return_max"] for c in pts], alpha=0.2)
        ax.set(xlabel="Wall clock time (s)", ylabel="Episodic reward", title=algo)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / f"curves-{algo}.png", dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{r['algo']}\n{r['policy']}" for r in rows]
    ax.bar(labels, [r["cost_mean"] for r in rows], yerr=[r["cost_std"] for r in rows])
    ax.set(ylabel="Cost ($)", title="Stellaris cost model, Section VIII-A prices")
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "cost.png", dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True, choices=sorted(SITES), help="where the runs go (local: this machine)")
    parser.add_argument("--workload", default="hopper", choices=WORKLOADS, help="Stellaris workload (default hopper)")
    parser.add_argument("--algos", nargs="+", default=["ppo", "impact"], choices=["ppo", "impact"])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=[*POLICIES, "stellaris_code",
                                                                                   *VARIANTS],
                        help=f"admission policies (default: {' '.join(POLICIES)})")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting, env.seed 0..K-1 (paper: 10)")
    parser.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value for every run (repeatable)")
    parser.add_argument("--out", help="output directory (default: runs/stellaris-grid-WORKLOAD-TIME)")
    parser.add_argument("--parallel-runs", type=int, default=1, help="runs at the same time in one Parsl block")
    for flag, text in (("--account", "project to charge"), ("--queue", "queue / QOS / partition"),
                       ("--walltime", "walltime of each Parsl block, HH:MM:SS"),
                       ("--address", "address of this machine that the compute nodes reach")):
        parser.add_argument(flag, help=text)
    args = parser.parse_args(argv)
    out = Path(args.out or f"runs/stellaris-grid-{args.workload}-{stamp()}").absolute()
    try:
        apps = []
        for seed in range(args.repeats):  # interleaved, so machine load hits every setting alike
            for algo in args.algos:
                for policy in args.policies:
                    cfg = workload_config(args.workload, algo, args.overrides,
                                          [*policy_overrides(policy), f"env.seed={seed}"])
                    run = prepare(cfg, args.site, out / f"{algo}-{policy}-seed{seed}")
                    apps.append(({"algo": algo, "policy": policy, "seed": seed, "run_dir": str(run.run_dir)}, run))
        nodes = max(run.resources["num_nodes"] for _, run in apps) * args.parallel_runs
        parsl_cfg = make_config(args.site, **site_settings(args, nodes, args.parallel_runs, out / "parsl"))
    except ConfigError as exc:
        return fail(str(exc))
    print(f"stellaris grid {out} on {args.site}: {args.workload}, {args.algos} x {args.policies} x {args.repeats}")
    rows = run_grid(parsl_cfg, apps, summarise, out, "grid")
    if rows is None:
        return 1
    print(f"{'algo':<7} {'policy':<16} {'final return':>16} {'wall s':>9} {'cost $':>10} {'staleness':>9}")
    for r in rows:
        print(f"{r['algo']:<7} {r['policy']:<16} {r['final_return_mean']:>9.1f} +- {r['final_return_std']:<4.1f} "
              f"{r['wall_seconds_mean']:>9.1f} {r['cost_mean']:>10.4f} {r['staleness_mean_mean']:>9.2f}")
    print(f"summary: {out / 'summary.csv'}; curves: {out / 'curves.csv'}; artifact logs: {out / 'logs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
