"""`analyze.py RUN_DIR [RUN_DIR ...]`: figures, per-round CSV, Markdown summary, HTML report."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import clusterenv as CE
from . import figures as F
from . import marl as MA
from . import metrics as M
from . import pricing as P
from . import report as R
from . import stellaris_csv as S
from . import sweep as SW
from .h5read import AnalysisError, Run, load_run


PRICINGS = ("stellaris", "marless")
"""--pricing: the Stellaris EC2 table alone (default), or MARLess' Lambda vs c6a.16xlarge as well."""


@dataclass
class Outputs:
    out_dir: Path
    figures: dict[str, Path]
    csv: list[Path]
    markdown: Path
    html: Path | None
    runs: list[Run]
    stellaris: list[Path] = field(default_factory=list)
    """The Stellaris artifact's info/timeline CSV files (--stellaris-csv)."""


def analyze(run_dirs: list[str | Path], out_dir: str | Path | None = None, prices: str | Path | None = None,
            labels: list[str] | None = None, html: bool = True, figures: bool = True,
            stellaris_csv: bool = False, stellaris_scheduler: str = "stellaris", artifact_names: bool = False,
            pricing: str = "stellaris", marless_prices: str | Path | None = None) -> Outputs:
    """Analyse runs (same label = repeats of one setting: mean and spread); write everything into out_dir.

    figures=False writes only the CSV and the Markdown summary (no PNG, no HTML); stellaris_csv also
    writes the Stellaris artifact's SCHEDULER~ENV~ALGO~{info,timeline}.csv per run (stellaris_csv.py).
    pricing="marless" adds MARLess' pricing to summary.md (AWS Lambda functions vs a c6a.16xlarge, both ratios;
    pricing.py), with ``marless_prices`` a JSON table overriding its defaults (prices-marless.json).
    """
    if pricing not in PRICINGS:
        raise AnalysisError(f"--pricing {pricing!r}: allowed {', '.join(PRICINGS)}")
    if labels and len(labels) != len(run_dirs):
        raise AnalysisError(f"--label given {len(labels)} times for {len(run_dirs)} run directories")
    runs = [load_run(d, labels[i] if labels else None) for i, d in enumerate(run_dirs)]
    if not labels:
        _label_runners(runs)
    price_table = M.load_prices(prices)
    out = Path(out_dir) if out_dir else (runs[0].path / "analysis" if len(runs) == 1 else _compare_dir(runs))
    out.mkdir(parents=True, exist_ok=True)
    figs = F.all_figures(runs, out, price_table) if figures else {}
    csvs, seen = [], set()
    for r in runs:
        name = R.slug(r.label if r.label not in seen else f"{r.label}-{r.path.name}")
        seen.add(r.label)
        csvs.append(R.write_rounds_csv(r, out / f"rounds-{name}.csv", price_table))
        if MA.is_marl(r):  # policies, map changes and active roles per round (analysis/README.md)
            csvs.append(out / f"marl-rounds-{name}.csv")
            MA.write_csv(r, csvs[-1])
    stellaris = (S.write_stellaris_csv(runs, out, price_table, stellaris_scheduler, artifact_names)
                 if stellaris_csv else [])
    md = out / "summary.md"
    md.write_text(R.markdown(runs, price_table))
    if pricing == "marless":
        with md.open("a") as fh:
            fh.write(P.markdown([(r, r.label) for r in runs], P.load_marless_prices(marless_prices)))
    page = None
    if html and figures:
        page = out / "report.html"
        page.write_text(R.html_report(runs, figs, price_table, csvs))
    return Outputs(out, figs, csvs, md, page, runs, stellaris)


def _runner(run: Run) -> str:
    return f"{run.attrs.get('runner', '?')}{', fused' if run.attrs.get('fused') else ''}"


def _label_runners(runs: list[Run]) -> None:
    """Runs of one config on different runners are not repeats of one setting: their labels name the runner."""
    if len({_runner(r) for r in runs}) > 1:
        for r in runs:
            r.label = f"{r.label} [{_runner(r)}]"


def _compare_dir(runs: list[Run]) -> Path:
    """Several runs: ``analysis-compare/`` in the folder that holds them all (not the current folder)."""
    return Path(os.path.commonpath([str(r.path.resolve()) for r in runs])) / "analysis-compare"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run directories (or run.h5 files); same label = repeats; or one sweep directory (hpcrl sweep): "
                        "its arms compared")
    p.add_argument("--out", help="output folder (default: RUN_DIR/analysis for one run, analysis-compare/ in the "
                                 "folder holding several)")
    p.add_argument("--prices", help="JSON price table overriding the defaults (see prices.json next to this script)")
    p.add_argument("--pricing", choices=PRICINGS, default="stellaris",
                   help="marless: summary.md also prices every run as MARLess does (AWS Lambda GB-seconds and requests, "
                        "pre-warm charged, against a c6a.16xlarge), cost ratio both ways")
    p.add_argument("--marless-prices", metavar="JSON", help="with --pricing marless: a table overriding its defaults "
                                                           "(see prices-marless.json next to this script)")
    p.add_argument("--label", action="append", help="label per run directory, in order (default: config name and policy)")
    p.add_argument("--no-html", action="store_true", help="skip the HTML report")
    p.add_argument("--no-figures", action="store_true", help="only the CSV and the Markdown summary (fast)")
    p.add_argument("--stellaris-csv", action="store_true",
                   help="also write the Stellaris artifact's SCHEDULER~ENV~ALGO~info.csv and ~timeline.csv per run "
                        "(its evaluation/experiment/plot.py reads them)")
    p.add_argument("--reference", metavar="ARM", help="a sweep's arm the others are tested against (default: its first)")
    p.add_argument("--artifact-names", action="store_true",
                   help="(implies --stellaris-csv) the artifact's file names (Hopper-v3, Humanoid-v3, Walker2d-v3; scheduler "
                        "stellaris for the Stellaris policies; sync stays sync: the artifact's rllib is RLlib's), so its plot.py "
                        "runs unedited")
    p.add_argument("--stellaris-scheduler", default="stellaris", metavar="NAME",
                   help="SCHEDULER in those file names (default stellaris; 'policy': each run's aggregation.policy)")


def run_clusterenv(args: argparse.Namespace) -> int:
    """ClusterEnv AAPS records (hpcrl.ClusterEnv(record=...)): the seed's Figs. 2 and 3 and summary.csv."""
    first = Path(args.run_dirs[0])
    out = args.out or (first.parent if first.is_file() else first) / "analysis"
    res = CE.analyze(args.run_dirs, out)
    print(f"wrote {len(res['figures'])} figures and {res['csv'].name} to {out}")
    print(f"{'kl_threshold':>12} {'syncs/worker':>13} {'publishes':>10} {'episodes':>9} {'final return':>13}")
    for r in res["rows"]:
        print(f"{r['kl_threshold']:>12g} {r['syncs_per_worker']:>13.1f} {r['publishes']:>10d} {r['episodes']:>9d} "
              f"{r['final_return']:>13.1f}")
    return 0


def run_sweep(args: argparse.Namespace) -> int:
    """A sweep directory: every done run analysed with its arm as label, then the arms compared, config by config
    (sweep.py)."""
    if len(args.run_dirs) != 1:
        raise AnalysisError("a sweep directory is analysed alone (its runs are the sweep's)")
    name, groups, notes = SW.load_sweep(args.run_dirs[0])
    out = Path(args.out) if args.out else Path(args.run_dirs[0]) / "analysis"
    every = [r for arms in groups.values() for runs in arms.values() for r in runs]
    runs = [r for r in every if not isinstance(r, SW.External)]
    external = [r for r in every if isinstance(r, SW.External)]
    labelled = [f"{c}-{r.label}" if c else r.label for c, arms in groups.items() for runs in arms.values()
                for r in runs if not isinstance(r, SW.External)]
    res = analyze([r.path for r in runs], out, args.prices, labelled, html=not args.no_html,
                  figures=not args.no_figures, pricing=args.pricing, marless_prices=args.marless_prices)
    if args.stellaris_csv or args.artifact_names:  # a folder per seed (the artifact's names hold no seed); each
        # run's SCHEDULER is its arm (stellaris, sync, stellaris_no_is), CONFIG-ARM where two configs share an env
        placed = [(c, r, S.names(r, "policy", args.artifact_names)[1]) for c, arms in groups.items()
                  for g in arms.values() for r in g if not isinstance(r, SW.External)]
        shared = {(r.label, env) for c, r, env in placed
                  if len({c2 for c2, r2, env2 in placed if (r2.label, env2) == (r.label, env)}) > 1}
        for config, run, env in placed:
            folder = out / "stellaris-csv" / run.path.name.rsplit("-", 1)[-1]
            folder.mkdir(parents=True, exist_ok=True)
            scheduler = f"{config}-{run.label}" if (run.label, env) in shared else run.label
            S.write_stellaris_csv([run], folder, M.load_prices(args.prices), scheduler, args.artifact_names)
        for run in external:  # an external run's own artifact files (rllib~...) beside them
            folder = out / "stellaris-csv" / run.path.name.rsplit("-", 1)[-1]
            folder.mkdir(parents=True, exist_ok=True)
            for f in run.path.glob("*~*.csv"):
                shutil.copyfile(f, folder / f.name)
    texts, tables = [], []
    for config, arms in groups.items():
        table = SW.compare(arms, M.load_prices(args.prices), args.reference,
                           marless_prices=P.load_marless_prices(args.marless_prices) if args.pricing == "marless" else None)
        tables.append((config, table))
        texts.append(SW.markdown(name, table, notes if config == list(groups)[-1] else [], config))
        if not args.no_figures:
            for x in ("env_steps", "time"):
                F.arms({a: [r for r in g if not isinstance(r, SW.External)] for a, g in arms.items()}, x,
                       out / f"arms{'-' + config if config else ''}-return-vs-{x.replace('_', '-')}.png")
    text = "\n".join(texts)
    (out / "arms.md").write_text(text)
    SW.write_csv(tables, out / "arms.csv")
    print(f"sweep {name}: {len(runs)} runs{f' and {len(external)} external' if external else ''} in "
          f"{sum(len(a) for a in groups.values())} arms; wrote arms.md, arms.csv"
          + ("" if args.no_figures else ", arms-*.png") + f" and each run's analysis to {res.out_dir}")
    print(text)
    return 0


def run_cli(args: argparse.Namespace) -> int:
    if any(SW.is_sweep(d) for d in args.run_dirs):
        try:
            return run_sweep(args)
        except AnalysisError as exc:
            print(f"analyze: error: {exc}", file=sys.stderr)
            return 2
    if all(CE.record_path(d) for d in args.run_dirs):
        try:
            return run_clusterenv(args)
        except (AnalysisError, OSError, KeyError) as exc:
            print(f"analyze: error: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
    try:
        res = analyze(args.run_dirs, args.out, args.prices, args.label, html=not args.no_html,
                      figures=not args.no_figures, stellaris_csv=args.stellaris_csv or args.artifact_names,
                      stellaris_scheduler=args.stellaris_scheduler, artifact_names=args.artifact_names,
                      pricing=args.pricing, marless_prices=args.marless_prices)
    except AnalysisError as exc:
        print(f"analyze: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # e.g. a bad prices.json
        print(f"analyze: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    for r in res.runs:
        for note in r.notes:
            print(f"{r.path}: {note}", file=sys.stderr)
    print(f"wrote {len(res.figures)} figures, {len(res.csv) + len(res.stellaris)} CSV, {res.markdown.name}"
          + (f", {res.html.name}" if res.html else "") + f" to {res.out_dir}")
    print(res.markdown.read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="analyze.py", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_cli(p.parse_args(argv))
