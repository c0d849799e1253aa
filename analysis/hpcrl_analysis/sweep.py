"""A sweep directory (``hpcrl sweep``: ``SWEEP_DIR/sweep.json``, runs under ``SWEEP_DIR/runs/``): its arms compared.

An arm is a run's name without its ``-sSEED`` (config and arm, or grid point); its seeds are repeats. Runs of another
system beside the sweep (``SWEEP_DIR/external/ARM-sSEED/rounds.jsonl``, e.g. ``hpcrl bench rllib-ppo --out
SWEEP_DIR/external``) are arms too, scored by their evaluations. Per arm: the return at marks of the budget (the
last evaluation's mean return at or before M env steps when every run has evaluations, else the mean of the last
``window`` training episodes that ended by M, on every seed), mean and standard deviation (ddof 1) over the seeds, Welch's t-test against the reference arm at
each mark, the final return, the run's (virtual, for a simulated run) seconds, and its cost as
``metrics.cost`` prices it (serverless and serverful). Two figures: mean +- std of the smoothed return against
env steps and against time. Only ``done`` runs count; the others are named in the notes. The Stellaris artifact's
CSV files (``--stellaris-csv``, ``--artifact-names``) go to a folder per seed, ``stellaris-csv/sN/``, named by the
run's arm (``stellaris~Hopper-v3~ppo~info.csv``, ``sync~...``, an external ``rllib~...``): their names hold the
scheduler, env and algorithm, not the seed.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import metrics as M
from . import pricing as P
from .h5read import AnalysisError, Run, load_run

SEED = re.compile(r"-s\d+$")
MARLESS_COLUMNS = ("Lambda USD", "c6a.16xlarge USD", "Lambda / ref Lambda", "Lambda / ref c6a")
MARKS = (0.25, 0.5, 0.75, 1.0)
"""Marks as shares of the smallest budget any run reached."""


def is_sweep(path: str | Path) -> bool:
    return (Path(path) / "sweep.json").is_file()


@dataclass
class External:
    """A run of another system beside the sweep (``SWEEP_DIR/external/ARM-sSEED/rounds.jsonl``, one row per round:
    env_steps, seconds, eval_returns; ``hpcrl bench rllib-ppo`` writes them): in the arm table by its evaluations."""

    path: Path
    label: str
    rounds: list[dict]


def load_external(path: Path) -> External:
    try:
        rounds = [json.loads(line) for line in (path / "rounds.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{path / 'rounds.jsonl'}: not readable ({exc})") from None
    if not rounds:
        raise AnalysisError(f"{path / 'rounds.jsonl'}: no round")
    return External(path, SEED.sub("", path.name), rounds)


def load_sweep(path: str | Path) -> tuple[str, dict[str, dict[str, list]], list[str]]:
    """(the sweep's name, config -> arm -> its done runs in seed order, notes on runs left out). A sweep of one
    config has the one config "". External runs (``external/ARM-sSEED/``) are arms too; beside a sweep of several
    configs, ``external/CONFIG-ARM-sSEED/`` goes with CONFIG."""
    path = Path(path)
    try:
        state = json.loads((path / "sweep.json").read_text())
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{path / 'sweep.json'}: not readable ({exc})") from None
    configs = {e.get("config_name", "") for e in state["runs"].values()}
    several = len(configs) > 1
    groups: dict[str, dict[str, list]] = {}
    left: dict[str, list[str]] = {}
    for name, entry in state["runs"].items():
        if entry.get("status") != "done":
            left.setdefault(entry.get("status", "?"), []).append(name)
            continue
        config = entry.get("config_name", "") if several else ""
        arm = entry.get("arm") or SEED.sub("", name)
        groups.setdefault(config, {}).setdefault(arm, []).append(load_run(path / "runs" / name, label=arm))
    if not groups:
        raise AnalysisError(f"{path}: no run of sweep {state.get('name')!r} is done yet")
    for ext in sorted((path / "external").glob("*/rounds.jsonl")):
        run = load_external(ext.parent)
        config = next((c for c in configs if several and run.label.startswith(f"{c}-")), "")
        run.label = run.label[len(config) + 1:] if config else run.label
        groups.setdefault(config, {}).setdefault(run.label, []).append(run)
    notes = [f"{len(names)} {status}" + (f" ({', '.join(names)})" if len(names) <= 10 else "")
             for status, names in sorted(left.items())]
    return state.get("name", path.name), groups, notes


def return_at(run: Run, mark: float, window: int) -> float:
    ax = M.episode_axes(run)
    sel = ax["return"][ax["env_steps"] <= mark]
    return float(sel[-window:].mean()) if sel.size else math.nan


def evaluations(run) -> tuple[np.ndarray, np.ndarray]:
    """(env steps when each evaluation was asked for, its mean return): an hpcrl run's evaluation k follows its k-th
    round (the rounds table's env_steps_total), an external run's follows its round."""
    if isinstance(run, External):
        return (np.asarray([r["env_steps"] for r in run.rounds], dtype=float),
                np.asarray([np.mean(r["eval_returns"]) for r in run.rounds], dtype=float))
    ev, rounds = M.evaluations(run), run.table("rounds")
    if not len(ev["round"]) or not rounds or "env_steps_total" not in rounds:
        return np.zeros(0), np.zeros(0)
    # evaluation k follows k rounds ended: the rounds table's round k - 1 (it counts from 0)
    steps = {r + 1: n for r, n in zip(rounds["round"].tolist(), rounds["env_steps_total"].tolist())}
    keep = [i for i, k in enumerate(ev["round"].tolist()) if k in steps]
    return np.asarray([steps[ev["round"][i]] for i in keep], dtype=float), ev["mean"][keep]


def eval_at(run, mark: float) -> float:
    """The last evaluation's mean return at or before ``mark`` env steps (NaN before the first)."""
    steps, means = evaluations(run)
    sel = means[steps <= mark]
    return float(sel[-1]) if sel.size else math.nan


def budget(run) -> float:
    return float(run.rounds[-1]["env_steps"]) if isinstance(run, External) else float(M.env_steps(run))


def seconds(run) -> float:
    return float(run.rounds[-1]["seconds"]) if isinstance(run, External) else M.wall_seconds(run)


def welch_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value of Welch's t-test (NaN with fewer than two finite values a side, or no spread)."""
    a, b = np.asarray([x for x in a if math.isfinite(x)]), np.asarray([x for x in b if math.isfinite(x)])
    if a.size < 2 or b.size < 2:
        return math.nan
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        return math.nan
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    return _betainc(df / 2, 0.5, df / (df + t * t))  # P(|T| > |t|) for Student's t with df degrees of freedom


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below the mean; use the symmetry above it
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


def compare(arms: dict[str, list], prices: dict, reference: str | None = None, window: int = 20,
            marless_prices: dict | None = None) -> dict:
    """The arm table: marks (env steps), and per arm its rows of numbers (see the module docstring). Scored by
    evaluation returns when every run has evaluations (an external arm has only those), else by the training
    episodes' returns. With ``marless_prices`` (``hpcrl analyze --pricing marless``) each arm is also priced as
    MARLess prices it (pricing.marless_cost: its functions on AWS Lambda, and a c6a.16xlarge for its wall-clock),
    and set against the reference arm: Lambda over the reference's Lambda (MARLess against MARLess without its
    designs) and over the reference's c6a.16xlarge (against the serverful job)."""
    reference = reference if reference in arms else next(iter(arms)) if reference is None else reference
    if reference not in arms:
        raise AnalysisError(f"--reference {reference!r}: not an arm of this sweep ({', '.join(arms)})")
    runs_all = [r for runs in arms.values() for r in runs]
    by_eval = all(len(evaluations(r)[0]) for r in runs_all)
    least = min(budget(r) for r in runs_all)
    marks = [int(least * share) for share in MARKS]

    def score(run, mark: int) -> float:  # an external run has only its evaluations
        return eval_at(run, mark) if by_eval or isinstance(run, External) else return_at(run, mark, window)

    at = {arm: [[score(r, m) for r in runs] for m in marks] for arm, runs in arms.items()}
    rows = []
    for arm, runs in arms.items():
        costs = [M.cost(r, prices) for r in runs if not isinstance(r, External)]
        row = {"arm": arm, "runs": len(runs)}
        for m, values, ref in zip(marks, at[arm], at[reference]):
            v = np.asarray([x for x in values if math.isfinite(x)])
            row[f"return@{m}"] = (float(v.mean()) if v.size else math.nan, float(v.std(ddof=1)) if v.size > 1 else math.nan)
            row[f"p@{m}"] = math.nan if arm == reference else welch_p(values, ref)
        # at the last mark: how many of this arm's runs fall within the reference arm's seeds' range (min..max)
        last, ref_last = [x for x in at[arm][-1] if math.isfinite(x)], [x for x in at[reference][-1] if math.isfinite(x)]
        inside = sum(min(ref_last) <= x <= max(ref_last) for x in last) if ref_last else 0
        row["in ref range"] = f"{inside}/{len(last)}"
        for key, values in (("seconds", [seconds(r) for r in runs]),
                            ("serverless USD", [sum(v for k, v in c.items() if k.startswith("serverless_")) for c in costs]),
                            ("serverful USD", [sum(v for k, v in c.items() if k.startswith("serverful_")) for c in costs])):
            v = np.asarray(values, dtype=float)
            row[key] = (float(v.mean()) if v.size else math.nan, float(v.std(ddof=1)) if v.size > 1 else math.nan)
        if marless_prices is not None:
            priced = [P.marless_cost(r, marless_prices) for r in runs if not isinstance(r, External)]
            for key, part in (("Lambda USD", "serverless"), ("c6a.16xlarge USD", "serverful")):
                v = np.asarray([c[part] for c in priced], dtype=float)
                row[key] = (float(v.mean()) if v.size else math.nan, float(v.std(ddof=1)) if v.size > 1 else math.nan)
        rows.append(row)
    if marless_prices is not None:
        ref = next(r for r in rows if r["arm"] == reference)
        for row in rows:
            lam = row["Lambda USD"][0]
            row["Lambda / ref Lambda"] = lam / ref["Lambda USD"][0] if ref["Lambda USD"][0] > 0 else math.nan
            row["Lambda / ref c6a"] = lam / ref["c6a.16xlarge USD"][0] if ref["c6a.16xlarge USD"][0] > 0 else math.nan
    mixed = not by_eval and any(isinstance(r, External) for r in runs_all)
    return {"reference": reference, "marks": marks, "rows": rows, "window": window, "by_eval": by_eval,
            "mixed": mixed}


def _cell(value, digits: int = 1) -> str:
    if isinstance(value, tuple):
        m, sd = value
        if not math.isfinite(m):
            return "-"
        return f"{m:,.{digits}f} +- {sd:,.{digits}f}" if math.isfinite(sd) else f"{m:,.{digits}f}"
    if isinstance(value, float):
        return "" if not math.isfinite(value) else f"{value:.3f}"
    return str(value)


def markdown(name: str, table: dict, notes: list[str], config: str = "") -> str:
    marks, ref = table["marks"], table["reference"]
    marless = [k for k in MARLESS_COLUMNS if k in table["rows"][0]]
    head = ["arm", "runs", *[f"return at {m:,}" for m in marks], *[f"p at {m:,}" for m in marks],
            f"in {ref}'s range at {marks[-1]:,}", "seconds", "serverless USD", "serverful USD", *marless]
    lines = [f"# Sweep {name}{': ' + config if config else ''}: arms against {ref}", "",
             ("Return: mean +- std over seeds of each run's last evaluation (greedy episodes) at or before the mark "
              "(env steps)" if table["by_eval"] else
              f"Return: mean +- std over seeds of each run's last {table['window']} episodes at or before the mark "
              "(env steps)") + f"; p: Welch's t-test against {ref} at the mark; in range: the arm's runs whose return at the last "
             f"mark lies within {ref}'s seeds' (min to max); seconds: the run's (virtual, if "
             "simulated); cost: the run's rank-seconds at the price table's rates (none for an external run).", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in table["rows"]:
        cells = [row["arm"], str(row["runs"]), *[_cell(row[f"return@{m}"]) for m in marks],
                 *[_cell(row[f"p@{m}"]) for m in marks], row["in ref range"], _cell(row["seconds"]), _cell(row["serverless USD"], 4),
                 _cell(row["serverful USD"], 4), *[_cell(row[k], 4) for k in marless]]
        lines.append("| " + " | ".join(cells) + " |")
    if marless:
        lines += ["", f"MARLess' pricing (pricing.py): every function at AWS Lambda's GB-second and request prices, "
                      f"pre-warm charged; the serverful job on c6a.16xlarge instances for the run's wall-clock. The "
                      f"ratios set each arm's Lambda cost against {ref}'s Lambda and c6a.16xlarge costs."]
    if table.get("mixed"):
        lines += ["", "The external arms are scored by their evaluations, the sweep's runs (which have none) by their "
                      "training episodes: not the same measure."]
    if notes:
        lines += ["", "Runs not done, left out: " + "; ".join(notes)]
    return "\n".join(lines) + "\n"


def write_csv(tables: list[tuple[str, dict]], path: Path) -> Path:
    """Every config's arm table (``tables``: (config, compare's table)), a row per arm, mean and std apart."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        for i, (config, table) in enumerate(tables):
            first = table["rows"][0]
            keys = [k for k in first if k not in ("arm", "runs")]
            head = [f"{k} {part}".strip() for k in keys for part in (("mean", "std") if isinstance(first[k], tuple)
                                                                        else ("",))]
            if i == 0 or keys != [k for k in tables[i - 1][1]["rows"][0] if k not in ("arm", "runs")]:
                w.writerow(["config", "arm", "runs", *head])
            for row in table["rows"]:
                out = [config, row["arm"], row["runs"]]
                for k in keys:
                    out += list(row[k]) if isinstance(row[k], tuple) else [row[k]]
                w.writerow(out)
    return path
