"""The ClusterEnv seed's KL-threshold sweep (its Figs. 2 and 3): PPO on LunarLander, one Parsl MPI app per delta.

    python workflows/clusterenv_aaps.py --site local --total-timesteps 81920
    python workflows/clusterenv_aaps.py --site polaris --account MyProject --queue debug --workers 64 --num-envs 256

Each app runs workflows/clusterenv_aaps_train.py as workers + 1 ranks (rank 0 is the head, the
others ClusterEnv workers), writing OUT/kl-DELTA.h5; a dependent app then draws the return curves
(Fig. 2) and the cumulative syncs per worker (Fig. 3) with analysis/hpcrl_analysis/clusterenv.py and
writes OUT/summary.csv (syncs per worker and the final mean return per delta). Default deltas: the
seed's {0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 0.8, 1.0}; the seed's run is 4 x 64 envs for 5M steps.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import parsl
from parsl import python_app

from _common import ConfigError, fail, make_config, parsl_scripts_on_path, site_settings, stamp
from hpcrl.parsl_runs import launcher_options, mpi_run
from hpcrl.sites import load_site
from hpcrl.sites.parsl_configs import BATCH_SITE, SITES

SEED_DELTAS = (0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 0.8, 1.0)
TRAIN = Path(__file__).resolve().parent / "clusterenv_aaps_train.py"
ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"


@python_app(executors=["local"])
def figures(records: list[str], out_dir: str, analysis_dir: str, inputs=()) -> list[dict]:
    """Runs once every app in ``inputs`` has finished: Figs. 2 and 3 and summary.csv (h5py, matplotlib)."""
    import sys

    sys.path.insert(0, analysis_dir)
    from hpcrl_analysis import clusterenv

    return clusterenv.analyze(records, out_dir)["rows"]


def app_command(args, delta: float, record: Path) -> str:
    words = [sys.executable, "-u", str(TRAIN), "--kl-threshold", str(delta), "--record", str(record),
             "--workers", str(args.workers), "--num-envs", str(args.num_envs),
             "--total-timesteps", str(args.total_timesteps), "--seed", str(args.seed)]
    root = Path(__file__).resolve().parents[1]
    return (f"export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTHONPATH={shlex.quote(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
            f"cd {shlex.quote(str(record.parent))}\n$PARSL_MPI_PREFIX {' '.join(shlex.quote(w) for w in words)}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", required=True, choices=sorted(SITES), help="where the runs go (local: this machine)")
    p.add_argument("--deltas", type=float, nargs="+", default=list(SEED_DELTAS), help="KL thresholds")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--total-timesteps", type=int, default=81_920, help="per run (the seed: 5M)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="sweep directory (default: runs/clusterenv-aaps-TIME)")
    p.add_argument("--parallel-runs", type=int, default=1)
    p.add_argument("--account")
    p.add_argument("--queue")
    p.add_argument("--walltime")
    p.add_argument("--address")
    args = p.parse_args(argv)
    out = Path(args.out or f"runs/clusterenv-aaps-{stamp()}").absolute()
    try:
        facts = load_site(BATCH_SITE[args.site]) if BATCH_SITE[args.site] else None
        ranks = args.workers + 1
        resources = {"num_nodes": 1, "ranks_per_node": ranks, "num_ranks": ranks,
                     "launcher_options": launcher_options(facts, None)}
        parsl_cfg = make_config(args.site, **site_settings(args, 1, args.parallel_runs, out / "parsl"))
    except ConfigError as exc:
        return fail(str(exc))
    out.mkdir(parents=True, exist_ok=True)
    print(f"ClusterEnv AAPS sweep {out} on {args.site}: deltas {args.deltas}")
    parsl_scripts_on_path()
    with parsl.load(parsl_cfg):
        records = [out / f"kl-{d:g}.h5" for d in args.deltas]
        runs = [mpi_run(app_command(args, d, rec), stdout=str(rec.with_suffix(".out")),
                        stderr=str(rec.with_suffix(".err")), parsl_resource_specification=resources)
                for d, rec in zip(args.deltas, records)]
        summary = figures([str(r) for r in records], str(out), str(ANALYSIS), inputs=runs)
        try:
            rows = summary.result()
        except Exception as exc:
            print(f"sweep failed: {exc}; see the kl-*.out/.err files under {out}")
            return 1
    print(f"{'delta':>7} {'syncs/worker':>13} {'publishes':>10} {'episodes':>9} {'final return':>13}")
    for r in rows:
        print(f"{r['kl_threshold']:>7g} {r['syncs_per_worker']:>13.1f} {r['publishes']:>10d} {r['episodes']:>9d} "
              f"{r['final_return']:>13.1f}")
    print(f"figures and summary.csv: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
