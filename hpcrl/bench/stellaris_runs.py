"""What the Stellaris comparison benches share: the settings of Figs. 11 and 13, one run's numbers, the
artifact's CSVs, a resumable results file and the table with Welch's t-test.

``hpcrl bench stellaris-ablation`` and ``hpcrl bench stellaris-sensitivity`` (and the Parsl workflows
``workflows/stellaris_grid.py``, ``stellaris_sensitivity.py``) read their settings from here. Each run is
an ``hpcrl run`` of ``hpcrl/configs/stellaris/hopper_ppo.yaml`` with :data:`LAYOUT` and the setting's
overrides, run as a sweep (``hpcrl sweep``'s local runner: state in ``OUT/sweep.json``, runs in
``OUT/runs/SETTING-BUDGET-sSEED``): an interrupted bench goes on from the runs' checkpoints. Each finished
run's row goes to ``OUT/results.jsonl``, and the same ``--out`` runs only what is missing.

Minibatches (issue 28 item 2). ``artifact`` (default): each gradient is one learner group's whole share
of the round's batch (``algo.minibatch_size = train_batch_size / learners.groups``), 10 passes: what the
artifact's asynchronous learners compute (its ``train_ops.py`` cuts the ``sgd_minibatch_size =
train_batch_size`` batch into one slice per async learner and queues every slice once per pass) and what
the shipped configs hold. ``small``: 256-row minibatches x 4 passes (``bench stellaris-hopper``'s choice),
more and noisier pushes per batch.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcrl.bench.curves import welch

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "stellaris"

ABLATION = {
    "sync": ["aggregation.policy=sync"],
    "pure_async": ["aggregation.policy=pure_async"],
    "ssp": ["aggregation.policy=ssp"],
    "softsync": ["aggregation.policy=softsync"],
    "stellaris": ["aggregation.policy=stellaris"],
    "stellaris_no_is": ["aggregation.policy=stellaris", "aggregation.is_truncation=false"],
}
"""Fig. 11: the aggregation methods and Stellaris without IS truncation (Fig. 11b), as config overrides."""

SENSITIVITY_GRID = {"d": (0.92, 0.94, 0.96, 0.98, 1.0), "v": (1, 2, 3, 4), "rho": (0.6, 0.8, 1.0, 1.2)}
"""Fig. 13: one parameter at a time around the paper's setting (aggregation.d, aggregation.v, aggregation.rho)."""
PAPER = {"d": 0.96, "v": 3, "rho": 1.0}
"""The paper's d, v, rho (Section VIII-A)."""

LAYOUT = ["actors.count=2", "env.num_envs=4", "learners.groups=2", "learners.min_active=2", "stop.target_return=null"]
"""The 21-rank workload on a small node: 2 actors x 4 envs, 2 learner groups (both always active), no early stop."""
MINIBATCH = {"artifact": lambda groups: [f"algo.minibatch_size={4096 // groups}", "algo.num_sgd_iter=10"],
             "small": lambda groups: ["algo.minibatch_size=256", "algo.num_sgd_iter=4"]}
"""Overrides per minibatch mode for ``groups`` learner groups (Table III's 4096-step round)."""


def policy_overrides(name: str) -> list[str]:
    """The overrides of an ablation setting, or ``aggregation.policy=NAME`` for any other policy name."""
    return ABLATION.get(name, [f"aggregation.policy={name}"])


def sensitivity_settings(params: list[str]) -> dict[str, list[str]]:
    """Setting name -> overrides for the Fig. 13 grid of ``params``; the paper's setting once (``paper``),
    shared by every parameter's panel."""
    out = {"paper": ["aggregation.policy=stellaris"]}
    for p in params:
        for value in SENSITIVITY_GRID[p]:
            if value != PAPER[p]:
                out[f"{p}={value:g}"] = ["aggregation.policy=stellaris", f"aggregation.{p}={value}"]
    return out


def chosen(parser, text: str, allowed, what: str) -> list[str]:
    """The comma-separated names of ``text``; the parser's one-line error for a name not in ``allowed``."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in allowed]
    if unknown:
        parser.error(f"unknown {what} {unknown[0]!r}; choose from {', '.join(allowed)}")
    return names


def run_numbers(run_dir: str | Path, window: int = 20) -> dict:
    """One run's headline numbers from its run.h5 (through hpcrl_analysis): final and best training return
    (mean of the last / best ``window`` episodes), the last evaluation's mean return (NaN without one),
    wall-clock, env steps, episodes, updates, the Stellaris cost (sum of the per-round cost, USD at the
    paper's AWS prices) and the mean admitted staleness."""
    from hpcrl.commands.analyze import load_analysis

    ha = load_analysis()
    M = ha.metrics
    run = ha.load_run(run_dir)
    ax = M.episode_axes(run)
    ret = ax["return"]
    smooth = M.smooth(ret, window) if len(ret) else ret
    st = M.admitted_staleness(run)["staleness"]
    cost = M.per_round(run, M.load_prices(None))["cost"]
    ev = run.table("eval_episodes")
    last_eval = math.nan
    if ev and len(ev["round"]):
        last_eval = float(ev["return"][ev["round"] == ev["round"].max()].mean())
    return {"final_return": float(ret[-window:].mean()) if len(ret) else math.nan,
            "best_return": float(smooth.max()) if len(smooth) else math.nan, "eval_return": last_eval,
            "wall_seconds": M.wall_seconds(run), "env_steps": M.env_steps(run),  # every step sampled, not the last episode's count
            "episodes": int(len(ret)), "updates": run.rows("updates"),
            "cost": float(np.nansum(cost)) if len(cost) else 0.0,
            "staleness_mean": float(st.mean()) if len(st) else math.nan}


def artifact_logs(run_dir: str | Path, logs_dir: Path, artifact_names: bool = False) -> None:
    """The Stellaris artifact's info/timeline CSV files of one run (scheduler = its aggregation.policy, or with
    ``artifact_names`` the names the artifact's plot.py iterates)."""
    from hpcrl.commands.analyze import load_analysis

    ha = load_analysis()
    logs_dir.mkdir(parents=True, exist_ok=True)
    ha.stellaris_csv.write_stellaris_csv([ha.load_run(run_dir)], logs_dir, ha.metrics.load_prices(None),
                                         "policy", artifact_names)


@dataclass
class Bench:
    """One bench's runs: settings (name -> overrides) x seeds at one budget, into ``out``."""
    name: str
    settings: dict[str, list[str]]
    seeds: list[int]
    budget: int
    out: Path
    extra: list[str]
    runner: str = "mpi"
    config: Path = CONFIGS / "hopper_ppo.yaml"

    @property
    def results_file(self) -> Path:
        return self.out / "results.jsonl"

    def load(self) -> dict[tuple[str, int], dict]:
        """Rows already in results.jsonl for this budget, by (setting, seed); rows of other budgets are kept in
        the file but not used."""
        if not self.results_file.exists():
            return {}
        rows = [json.loads(line) for line in self.results_file.read_text().splitlines() if line.strip()]
        return {(r["setting"], r["seed"]): r for r in rows if r.get("budget") == self.budget}

    def run_name(self, setting: str, seed: int) -> str:
        return f"{setting}-{self.budget}-s{seed}"

    def sweep(self, todo: list[tuple[str, int]], jobs: int):
        """The missing runs as a sweep (hpcrl/sweep): its state in OUT/sweep.json, its runs in OUT/runs/NAME."""
        from hpcrl.sweep.spec import SweepRun, SweepSpec

        runs = []
        for setting, seed in todo:
            overrides = (*LAYOUT, *self.extra, *self.settings[setting], f"env.seed={seed}",
                         f"stop.total_env_steps={self.budget}", f"launch.runner={self.runner}", "io.log_seconds=60")
            runs.append(SweepRun(self.run_name(setting, seed), str(self.config), overrides, self.config.stem, setting,
                                 seed))
        return SweepSpec(self.name, str(self.results_file), tuple(runs), jobs)

    def row(self, setting: str, seed: int, entry: dict) -> dict:
        """A finished run's results row (its artifact CSVs written beside it, in logs/NAME)."""
        name = self.run_name(setting, seed)
        run_dir = self.out / "runs" / name
        artifact_logs(run_dir, self.out / "logs" / name, artifact_names=True)
        return {"bench": self.name, "setting": setting, "seed": seed, "budget": self.budget,
                "overrides": entry["overrides"], "job_seconds": entry.get("seconds", math.nan),
                "run_dir": str(run_dir), **run_numbers(run_dir)}

    def run(self, jobs: int) -> dict[tuple[str, int], dict]:
        """Run what is missing (``jobs`` at a time, seed by seed so machine load hits every setting alike) as a
        sweep (``hpcrl sweep``'s runner: a run stopped or killed goes on from its checkpoint), appending each
        finished run's row to results.jsonl; returns every row of this budget."""
        from hpcrl.bench.sweep_runs import run_sweep

        self.out.mkdir(parents=True, exist_ok=True)
        results = self.load()
        todo = [(s, seed) for seed in self.seeds for s in self.settings if (s, seed) not in results]
        print(f"{self.name}: {len(todo)} of {len(self.settings) * len(self.seeds)} runs of {self.budget:,} env steps "
              f"to go ({jobs} at a time), results in {self.results_file}", flush=True)
        if not todo:
            return results
        state = run_sweep(self.name, self.out, list(self.sweep(todo, jobs).runs), jobs)
        for setting, seed in todo:
            entry = state[self.run_name(setting, seed)]
            if entry["status"] != "done":
                print(f"  {setting} seed {seed}: {entry['status']} {entry.get('message', '')}", flush=True)
                continue
            r = self.row(setting, seed, entry)
            with self.results_file.open("a") as f:
                f.write(json.dumps(r) + "\n")
            results[(setting, seed)] = r
            print(f"  {setting} seed {seed}: eval {r['eval_return']:.1f}, train {r['final_return']:.1f}, "
                  f"{r['job_seconds']:.0f} s", flush=True)
        return results


TABLE_METRICS = (("eval_return", "eval return", 1), ("final_return", "train return (last 20)", 1),
                 ("wall_seconds", "wall s", 0), ("cost", "cost USD", 4), ("staleness_mean", "staleness", 2),
                 ("updates", "updates", 0))


def table(results: dict[tuple[str, int], dict], settings: list[str], reference: str) -> list[dict]:
    """Per setting: runs, mean and std (ddof 1) of every :data:`TABLE_METRICS` column, and Welch's p of the
    evaluation and training returns against ``reference``'s."""
    def values(setting: str, key: str) -> list[float]:
        return [float(r[key]) for (s, _), r in sorted(results.items()) if s == setting]

    rows = []
    for s in settings:
        row: dict = {"setting": s, "runs": len(values(s, "eval_return"))}
        for key, _, _ in TABLE_METRICS:
            v = np.asarray([x for x in values(s, key) if math.isfinite(x)])
            row[f"{key}_mean"] = float(v.mean()) if v.size else math.nan
            row[f"{key}_std"] = float(v.std(ddof=1)) if v.size > 1 else math.nan
        for key in ("eval_return", "final_return"):
            row[f"{key}_p"] = math.nan if s == reference else welch(values(s, key), values(reference, key))
        rows.append(row)
    return rows


def markdown(rows: list[dict], reference: str) -> str:
    """The table as Markdown: mean +- std per metric, Welch's p against ``reference`` for both returns."""
    head = ["setting", "runs", *[label for _, label, _ in TABLE_METRICS], f"p eval vs {reference}",
            f"p train vs {reference}"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["setting"], str(r["runs"])]
        for key, _, digits in TABLE_METRICS:
            m, sd = r[f"{key}_mean"], r[f"{key}_std"]
            cells.append(f"{m:,.{digits}f} +- {sd:,.{digits}f}" if math.isfinite(sd) else f"{m:,.{digits}f}")
        cells += ["" if not math.isfinite(r[f"{k}_p"]) else f"{r[f'{k}_p']:.3f}" for k in ("eval_return", "final_return")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_table(out: Path, rows: list[dict], reference: str, heading: str) -> str:
    """OUT/summary.csv and OUT/table.md; returns the Markdown."""
    import csv

    with open(out / "summary.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["setting"])
        w.writeheader()
        w.writerows(rows)
    text = f"{heading}\n\n{markdown(rows, reference)}"
    (out / "table.md").write_text(text)
    return text
