"""Stellaris' Fig. 13 on Hopper-v5: final reward and cost against d, v and rho, one parameter at a time.

Around the paper's setting (d = 0.96, v = 3, rho = 1.0; run once as ``paper`` and shared by the three
panels): the decay d of Eq. 3 (0.92 ... 1.0), the learning-rate root v of Eq. 4 (1 ... 4) and the IS
truncation level rho of Eq. 2 (0.6 ... 1.2), PPO with stellaris admission on
``hpcrl/configs/stellaris/hopper_ppo.yaml``, 2 actors x 4 envs, 2 learner groups, ``--seeds`` seeds
each for ``--budget`` env steps. OUT as ``hpcrl bench stellaris-ablation`` writes it (results.jsonl,
runs/, logs/ with the artifact's CSVs, summary.csv, table.md), Welch's p against ``paper``.

    hpcrl bench stellaris-sensitivity [--budget 1000000] [--seeds 5] [--jobs 1] [--out DIR]
        [--params d,v,rho] [--minibatch artifact|small] [--runner mpi|serial] [-o KEY=VALUE ...]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hpcrl.bench import stellaris_runs as SR
from hpcrl.bench.stellaris_ablation import check, common_parser, layout_extra


def main(argv: list[str]) -> int:
    p = common_parser("hpcrl bench stellaris-sensitivity", __doc__)
    p.add_argument("--params", default=",".join(SR.SENSITIVITY_GRID),
                   help="comma-separated, from d, v, rho (default: all three)")
    args = p.parse_args(argv)
    check(p, args)
    params = SR.chosen(p, args.params, SR.SENSITIVITY_GRID, "parameter")
    settings = SR.sensitivity_settings(params)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-stellaris-sensitivity-"))
    bench = SR.Bench("stellaris-sensitivity", settings, list(range(args.seeds)), args.budget, out,
                     layout_extra(args), args.runner)
    results = bench.run(args.jobs)
    rows = SR.table(results, list(settings), "paper")
    heading = (f"Hopper-v5 PPO, stellaris admission, {args.budget:,} env steps per run, seeds 0..{args.seeds - 1}, "
               f"minibatch {args.minibatch}, runner {args.runner}, 2 actors x 4 envs, 2 learner groups; paper = "
               f"d {SR.PAPER['d']}, v {SR.PAPER['v']}, rho {SR.PAPER['rho']}; runs in {out}")
    print("\n" + SR.write_table(out, rows, "paper", heading))
    missing = [(s, k) for s in settings for k in range(args.seeds) if (s, k) not in results]
    if missing:
        print(f"{len(missing)} run(s) failed or are missing; run again with --out {out}", file=sys.stderr)
    return 1 if missing else 0
