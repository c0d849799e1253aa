"""Stellaris' sensitivity analysis (Section VIII-E, Fig. 13): final reward and cost against d, v and rho.

    python workflows/stellaris_sensitivity.py --site local --d 0.92 1.0 --v --rho --repeats 1 \\
        -o actors.count=2 -o learners.groups=2 -o learners.min_active=2 -o stop.total_env_steps=20000
    python workflows/stellaris_sensitivity.py --site perlmutter --account m0000 --repeats 10

One parameter at a time around the paper's setting (d = 0.96, v = 3, rho = 1.0): the decay d
of Eq. 3 (default 0.92 ... 1.0 by 0.02), the learning-rate root v of Eq. 4 (1 ... 4) and the IS
truncation level rho of Eq. 2 (0.6 ... 1.2 by 0.2), each value with ``--repeats`` seeds, PPO with
stellaris admission on ``--workload`` (default hopper, as in the paper). Give a flag no values to
skip that parameter. Each run is one Parsl MPI app; a dependent app then writes into OUT
(default runs/stellaris-sensitivity-WORKLOAD-TIME):

- sensitivity.csv: parameter, value, repeats, final return (last 20 episodes) and Stellaris cost
  (USD), mean and std over repeats;
- sensitivity.png: one panel per parameter, final reward (left axis) and cost (right axis);
- runs.csv and logs/PARAMVALUE-seedK/: every run's numbers and the Stellaris artifact's files.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from parsl import python_app

from _common import ConfigError, fail, make_config, site_settings, stamp
from _stellaris import (RUN_COLUMNS, WORKLOADS, artifact_logs, mean_std, pyplot, run_grid, run_numbers,
                        workload_config, write_csv)
from hpcrl.bench.stellaris_runs import SENSITIVITY_GRID
from hpcrl.parsl_runs import prepare
from hpcrl.sites.parsl_configs import SITES

GRID = SENSITIVITY_GRID
COLUMNS = ["parameter", "value", "repeats", "final_return_mean", "final_return_std", "cost_mean", "cost_std"]


@python_app(executors=["local"])
def summarise(runs: list[dict], out: str, window: int = 20, inputs=()) -> list[dict]:
    """Runs once every run in ``inputs`` has finished; ``runs``: [{parameter, value, seed, run_dir}]."""
    out_dir = Path(out)
    for r in runs:
        r.update(run_numbers(r["run_dir"], window))
        artifact_logs(r["run_dir"], out_dir / "logs" / f"{r['parameter']}{r['value']}-seed{r['seed']}")
    write_csv(out_dir / "runs.csv", runs, ["parameter", "value", "seed", *RUN_COLUMNS, "run_dir"])
    rows = []
    for parameter, value in dict.fromkeys((r["parameter"], r["value"]) for r in runs):
        mine = [r for r in runs if (r["parameter"], r["value"]) == (parameter, value)]
        ret, cost = mean_std([r["final_return"] for r in mine]), mean_std([r["cost"] for r in mine])
        rows.append({"parameter": parameter, "value": value, "repeats": len(mine), "final_return_mean": ret[0],
                     "final_return_std": ret[1], "cost_mean": cost[0], "cost_std": cost[1]})
    rows.sort(key=lambda r: (list(GRID).index(r["parameter"]), r["value"]))
    write_csv(out_dir / "sensitivity.csv", rows, COLUMNS)
    figure(rows, out_dir / "sensitivity.png")
    return rows


def figure(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    params = list(dict.fromkeys(r["parameter"] for r in rows))
    fig, axes = plt.subplots(1, len(params), figsize=(4 * len(params), 3.5), squeeze=False)
    for ax, p in zip(axes[0], params):
        mine = [r for r in rows if r["parameter"] == p]
        x = [r["value"] for r in mine]
        ax.errorbar(x, [r["final_return_mean"] for r in mine], [r["final_return_std"] for r in mine], marker="o",
                    color="tab:blue")
        ax.set(xlabel={"d": "decay factor d", "v": "lr smoothness v", "rho": "IS threshold rho"}[p],
               ylabel="Final reward")
        twin = ax.twinx()
        twin.plot(x, [r["cost_mean"] for r in mine], marker="s", color="tab:red")
        twin.set_ylabel("Cost ($)", color="tab:red")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True, choices=sorted(SITES), help="where the runs go (local: this machine)")
    parser.add_argument("--workload", default="hopper", choices=WORKLOADS, help="Stellaris workload (default hopper)")
    parser.add_argument("--algo", default="ppo", choices=["ppo", "impact"], help="algorithm (default ppo, as Fig. 13)")
    for name, values in GRID.items():
        parser.add_argument(f"--{name}", type=float, nargs="*", default=list(values),
                            help=f"values of aggregation.{name} (default {' '.join(map(str, values))}; none: skip)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per value, env.seed 0..K-1 (paper: 10)")
    parser.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value for every run (repeatable)")
    parser.add_argument("--out", help="output directory (default: runs/stellaris-sensitivity-WORKLOAD-TIME)")
    parser.add_argument("--parallel-runs", type=int, default=1, help="runs at the same time in one Parsl block")
    for flag, text in (("--account", "project to charge"), ("--queue", "queue / QOS / partition"),
                       ("--walltime", "walltime of each Parsl block, HH:MM:SS"),
                       ("--address", "address of this machine that the compute nodes reach")):
        parser.add_argument(flag, help=text)
    args = parser.parse_args(argv)
    out = Path(args.out or f"runs/stellaris-sensitivity-{args.workload}-{stamp()}").absolute()
    grid = [(name, v) for name in GRID for v in getattr(args, name)]
    if not grid:
        return fail("--d, --v and --rho are all empty: nothing to run")
    try:
        apps = []
        for seed in range(args.repeats):
            for name, value in grid:
                cfg = workload_config(args.workload, args.algo, args.overrides,
                                      ["aggregation.policy=stellaris", f"aggregation.{name}={value}", f"env.seed={seed}"])
                run = prepare(cfg, args.site, out / f"{name}{value}-seed{seed}")
                apps.append(({"parameter": name, "value": value, "seed": seed, "run_dir": str(run.run_dir)}, run))
        nodes = max(run.resources["num_nodes"] for _, run in apps) * args.parallel_runs
        parsl_cfg = make_config(args.site, **site_settings(args, nodes, args.parallel_runs, out / "parsl"))
    except ConfigError as exc:
        return fail(str(exc))
    print(f"stellaris sensitivity {out} on {args.site}: {args.workload} {args.algo}, {len(grid)} values x "
          f"{args.repeats} repeats")
    rows = run_grid(parsl_cfg, apps, summarise, out, "sensitivity")
    if rows is None:
        return 1
    print(f"{'parameter':<9} {'value':>6} {'final return':>18} {'cost $':>18}")
    for r in rows:
        print(f"{r['parameter']:<9} {r['value']:>6} {r['final_return_mean']:>9.1f} +- {r['final_return_std']:<5.1f} "
              f"{r['cost_mean']:>9.4f} +- {r['cost_std']:<6.4f}")
    print(f"summary: {out / 'sensitivity.csv'}; figure: {out / 'sensitivity.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
