"""Stellaris' Fig. 11 on Hopper-v5: sync, pure async, SSP, Softsync, Stellaris and Stellaris without IS truncation.

PPO on ``hpcrl/configs/stellaris/hopper_ppo.yaml`` (Tables II and III, evaluation after every round) with
2 actors x 4 envs and 2 learner groups (``stellaris_runs.LAYOUT``), each setting ``--seeds`` times
(env.seed 0..K-1) for ``--budget`` env steps, under the MPI runner (one process per role, so the groups
really run at once). Writes into OUT:

- results.jsonl: one row per finished run (appended at once; ``--out`` on an existing folder runs only
  the runs missing at this budget);
- runs/SETTING-BUDGET-sK/: the run directories, run as a sweep (sweep.json: a bench stopped part way goes on
  from the runs' checkpoints); logs/SETTING-BUDGET-sK/: the Stellaris artifact's
  ``~info.csv`` / ``~timeline.csv`` under its names (its ``plot.py`` reads them);
- summary.csv and table.md: per setting mean +- std of the last evaluation's return, the last 20
  training episodes' return, wall-clock, Stellaris cost, admitted staleness and updates, and Welch's
  t-test p of both returns against ``stellaris``.

    hpcrl bench stellaris-ablation [--budget 1000000] [--seeds 5] [--jobs 1] [--out DIR]
        [--settings sync,pure_async,ssp,softsync,stellaris,stellaris_no_is] [--minibatch artifact|small]
        [--runner mpi|serial] [-o KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from hpcrl.bench import stellaris_runs as SR


def common_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """The arguments both Stellaris comparison benches take (the caller adds its own)."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--budget", type=int, default=1_000_000, help="env steps per run (default 1000000)")
    p.add_argument("--seeds", type=int, default=5, help="runs per setting, env.seed 0..K-1 (default 5)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1: a run is 5 MPI processes)")
    p.add_argument("--minibatch", choices=sorted(SR.MINIBATCH), default="artifact",
                   help="artifact: a group's whole share per gradient, 10 passes (default); small: 256 x 4 passes")
    p.add_argument("--runner", choices=("mpi", "serial"), default="mpi")
    p.add_argument("--out", help="results folder (default: a new temporary one); existing results are kept")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    return p


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.budget < 1 or args.seeds < 1 or args.jobs < 1:
        p.error("--budget, --seeds and --jobs must be at least 1")


def layout_extra(args: argparse.Namespace) -> list[str]:
    return [*SR.MINIBATCH[args.minibatch](2), *args.overrides]


def main(argv: list[str]) -> int:
    p = common_parser("hpcrl bench stellaris-ablation", __doc__)
    p.add_argument("--settings", default=",".join(SR.ABLATION),
                   help=f"comma-separated, from {', '.join(SR.ABLATION)} (default: all)")
    args = p.parse_args(argv)
    check(p, args)
    settings = SR.chosen(p, args.settings, SR.ABLATION, "setting")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-stellaris-ablation-"))
    bench = SR.Bench("stellaris-ablation", {s: SR.ABLATION[s] for s in settings}, list(range(args.seeds)),
                     args.budget, out, layout_extra(args), args.runner)
    results = bench.run(args.jobs)
    reference = "stellaris" if "stellaris" in settings else settings[0]
    rows = SR.table(results, settings, reference)
    heading = (f"Hopper-v5 PPO, {args.budget:,} env steps per run, seeds 0..{args.seeds - 1}, minibatch "
               f"{args.minibatch}, runner {args.runner}, 2 actors x 4 envs, 2 learner groups; runs in {out}")
    print("\n" + SR.write_table(out, rows, reference, heading))
    missing = [(s, k) for s in settings for k in range(args.seeds) if (s, k) not in results]
    if missing:
        print(f"{len(missing)} run(s) failed or are missing; run again with --out {out}", file=sys.stderr)
    return 1 if missing else 0
