"""Hopper: hpcrl's shipped config against CleanRL's ppo_continuous_action.py, side by side, same seeds.

CleanRL is run as it is published: its script file, unmodified, in a Python environment of its own
with the versions CleanRL pins (gymnasium 0.29.1, tyro, tensorboard; ``scripts/cleanrl_env.sh``
makes one). hpcrl runs ``hpcrl/configs/hopper.yaml`` with only the env id, the seed and the step
budget overridden. Both train on the same env id (Hopper-v4 by default: CleanRL's gymnasium has no
v5), one core each (``OMP_NUM_THREADS=1``), ``--jobs`` runs at a time: hpcrl's runs first, as a sweep
(hpcrl/bench/sweep_runs.py: ``OUT/runs/hpcrl-ENV-STEPS-sSEED``, state in ``OUT/sweep.json``), then CleanRL's, each
an external process in ``OUT/cleanrl-seedSEED``.

Return at a mark M: the mean return of the last 20 episodes that ended at or before M env steps,
for both. Welch's t-test compares the two at each mark over the seeds. Each finished run is
appended to ``OUT/results.jsonl`` at once (one row per side and seed: ``impl``, ``seed``, ``wall_seconds``,
``steps``, ``returns``, and ``env``, ``budget`` and hpcrl's ``overrides``, which rows of older benches lack), so an
interrupted bench loses at most CleanRL's runs in flight (hpcrl's go on from their checkpoints); ``--out`` on an
existing directory keeps its results and runs only what is missing for this env, budget and overrides.

    hpcrl bench hopper-vs-cleanrl --cleanrl-script ppo_continuous_action.py --cleanrl-python VENV/bin/python \
        --seeds 5 [--first-seed 0] [--steps 1000000] [--env Hopper-v4] [--runner serial] [--jobs 2] \
        [--out DIR] [--only hpcrl|cleanrl] [-o KEY=VALUE ...]

``--speed``: the cost per env step only, as issue 42 measures it: one seed of each side at a short budget
(``--steps``, default 40,960), one after the other, each a whole process on one core; env steps/s = budget / wall
seconds, and hpcrl's over CleanRL's (rows with ``"speed": true`` in results.jsonl). ``--repeat N`` runs N pairs in
turns (hpcrl first in even pairs, CleanRL first in odd ones) and reports the median of the pairs' ratios.

    hpcrl bench hopper-vs-cleanrl --speed --cleanrl-script ppo_continuous_action.py --cleanrl-python VENV/bin/python \
        [--steps 40960] [--repeat 3] [--runner serial|mpi] [--out DIR]

The hpcrl runs use ``--runner serial`` by default: the same role objects as an MPI job in one
process, so both sides cost one core (``tests/test_exactness.py`` checks that both runners make
the same weights from the same batches).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hpcrl.bench import curves
from hpcrl.bench.curves import return_at, welch
from hpcrl.bench.sweep_runs import run_sweep
from hpcrl.runtime.signals import EXIT_STOPPED

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "hopper.yaml"
CLEANRL_EPISODE = re.compile(r"global_step=(\d+), episodic_return=\[?([-+0-9.eE]+)\]?")
"""The line CleanRL's script prints for every finished episode."""


def cleanrl_episodes(stdout: str) -> tuple[np.ndarray, np.ndarray]:
    """(env steps at the end, return) of every episode CleanRL printed, in order."""
    rows = [(int(m.group(1)), float(m.group(2))) for m in CLEANRL_EPISODE.finditer(stdout)]
    arr = np.array(rows, dtype=np.float64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def run_cleanrl(args, seed: int, out: Path) -> dict:
    work = out / f"cleanrl-seed{seed}"
    work.mkdir(parents=True, exist_ok=True)
    cmd = [args.cleanrl_python, str(Path(args.cleanrl_script).resolve()), "--env-id", args.env, "--seed", str(seed),
           "--total-timesteps", str(args.steps), "--no-cuda"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    (work / "stdout.txt").write_text(done.stdout)
    (work / "stderr.txt").write_text(done.stderr)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        raise RuntimeError(f"CleanRL seed {seed} failed with exit code {done.returncode}: {tail[0]} ({work}/stderr.txt)")
    steps, returns = cleanrl_episodes(done.stdout)
    return {"impl": "cleanrl", "seed": seed, "wall_seconds": wall, "steps": steps.tolist(), "returns": returns.tolist(),
            "env": args.env, "budget": args.steps}


def hpcrl_run(args, seed: int):
    """hpcrl's side of one seed as a sweep run: hopper.yaml with the env id, seed and budget, then the ``-o``
    overrides, ``io.log_seconds=60`` and the runner (the ``hpcrl run`` that curves.run_hpcrl starts)."""
    from hpcrl.sweep.spec import SweepRun

    overrides = (f"env.id={args.env}", f"env.seed={seed}", f"stop.total_env_steps={args.steps}", *args.overrides,
                 "io.log_seconds=60", f"launch.runner={args.runner}")
    label = f"hpcrl-{args.env}-{args.steps}"
    return SweepRun(f"{label}-s{seed}", str(CONFIG), overrides, CONFIG.stem, label, seed)


def hpcrl_row(args, seed: int, run_dir: Path, seconds: float) -> dict:
    steps, returns = curves.episodes(run_dir)
    return {"impl": "hpcrl", "seed": seed, "wall_seconds": seconds, "steps": steps.tolist(), "returns": returns.tolist(),
            "env": args.env, "budget": args.steps, "overrides": list(args.overrides), "run_dir": str(run_dir)}


def load_results(path: Path, env: str | None = None, budget: int | None = None,
                 overrides: list[str] | None = None) -> dict[tuple[str, int], dict]:
    """Rows by (impl, seed); with ``env``, ``budget`` and ``overrides`` only the rows made with them (a row
    without such a field, from an older bench, counts for any)."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    wanted = {k: v for k, v in (("env", env), ("budget", budget), ("overrides", overrides)) if v is not None}
    return {(r["impl"], r["seed"]): r for r in rows
            if not r.get("speed") and all(r.get(k, v) == v for k, v in wanted.items())}  # --speed rows: no curves


def report(results: dict[tuple[str, int], dict], seeds: list[int], marks: list[int]) -> bool:
    """Print the side-by-side table; True when hpcrl's mean at the last mark >= CleanRL's."""
    cols = "".join(f"{m // 1000:>8d}K" for m in marks)
    print(f"\n{'impl':<8} {'seed':>4}{cols} {'wall s':>8}")
    table: dict[str, list[list[float]]] = {"cleanrl": [], "hpcrl": []}
    for impl in ("cleanrl", "hpcrl"):
        for s in seeds:
            r = results.get((impl, s))
            if r is None:
                continue
            vals = [return_at(np.asarray(r["steps"]), np.asarray(r["returns"]), m) for m in marks]
            table[impl].append(vals)
            print(f"{impl:<8} {s:>4}" + "".join(f"{v:>9.0f}" for v in vals) + f" {r['wall_seconds']:>8.0f}")
    print()
    for impl, rows in table.items():
        if rows:
            a = np.asarray(rows)
            walls = [results[(impl, s)]["wall_seconds"] for s in seeds if (impl, s) in results]
            print(f"{impl:<8} mean" + "".join(f"{v:>9.0f}" for v in a.mean(0)) + f" {np.mean(walls):>8.0f}")
            print(f"{impl:<8}  std" + "".join(f"{v:>9.0f}" for v in a.std(0, ddof=1 if len(a) > 1 else 0)))
    if not (table["cleanrl"] and table["hpcrl"]):
        return False
    c, h = np.asarray(table["cleanrl"]), np.asarray(table["hpcrl"])
    print("Welch p " + "".join(f"{welch(list(h[:, i]), list(c[:, i])):>9.3f}" for i in range(len(marks))))
    ok = bool(h[:, -1].mean() >= c[:, -1].mean())
    print(f"\nat {marks[-1]:,} env steps: hpcrl {h[:, -1].mean():.0f} vs CleanRL {c[:, -1].mean():.0f} over "
          f"{len(h)} / {len(c)} seeds: hpcrl {'>=' if ok else '<'} CleanRL")
    return ok


SPEED_STEPS = 40_960
"""--speed's default budget (issue 42's: 20 batches of 2,048)."""


def speed(args, out: Path) -> dict:
    """--speed: ``args.repeat`` pairs of runs, one seed each at ``args.steps``, in turns (hpcrl then CleanRL, then
    CleanRL then hpcrl, ...: a shared machine's load falls on both sides); the ratio of each pair and their median.
    Returns {"hpcrl": median sps, "cleanrl": median sps, "ratio": median of the pairs' ratios, "ratios": [...]}."""
    import statistics

    seed, results_file = args.first_seed, out / "results.jsonl"
    overrides = [f"env.id={args.env}", f"env.seed={seed}", f"stop.total_env_steps={args.steps}", *args.overrides]
    print(f"hopper-vs-cleanrl --speed: {args.steps:,} env steps of {args.env}, hpcrl ({args.runner} runner) and "
          f"CleanRL, {args.repeat} pair(s) in turns, one core each; results in {results_file}", flush=True)
    print(f"{'pair':<5} {'impl':<8} {'wall s':>8} {'env steps/s':>12}", flush=True)
    pairs = []
    for k in range(args.repeat):
        rows = {}
        for impl in (("hpcrl", "cleanrl") if k % 2 == 0 else ("cleanrl", "hpcrl")):
            if impl == "hpcrl":
                tag = f"speed-{args.runner}-s{seed}-{k}"
                wall = curves.run_hpcrl(CONFIG, out / "runs" / tag, args.runner, overrides, out / f"{tag}.log")
                row = {"impl": "hpcrl", "seed": seed, "wall_seconds": wall, "runner": args.runner,
                       "overrides": args.overrides}
            else:
                row = {"impl": "cleanrl", "seed": seed, "wall_seconds": run_cleanrl(args, seed, out)["wall_seconds"]}
            row.update(speed=True, pair=k, env=args.env, budget=args.steps,
                       env_steps_per_second=args.steps / row["wall_seconds"])
            with results_file.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{k:<5} {impl:<8} {row['wall_seconds']:>8.1f} {row['env_steps_per_second']:>12.0f}", flush=True)
            rows[impl] = row["env_steps_per_second"]
        pairs.append(rows)
    ratios = [r["hpcrl"] / r["cleanrl"] for r in pairs]
    result = {impl: statistics.median(r[impl] for r in pairs) for impl in ("hpcrl", "cleanrl")}
    result.update(ratio=statistics.median(ratios), ratios=ratios)
    print(f"hpcrl / CleanRL: {result['ratio']:.2f}x env steps/s (whole process, one core each; median of "
          f"{len(ratios)} pair(s): {', '.join(f'{r:.2f}' for r in ratios)})")
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench hopper-vs-cleanrl", description=__doc__.splitlines()[0])
    p.add_argument("--cleanrl-script", help="CleanRL's cleanrl/ppo_continuous_action.py, unmodified")
    p.add_argument("--cleanrl-python", default=sys.executable, help="the Python of CleanRL's environment")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--steps", type=int, help=f"env steps per run (default 1,000,000; --speed: {SPEED_STEPS:,})")
    p.add_argument("--speed", action="store_true", help="env steps/s only: one seed each, one after the other")
    p.add_argument("--repeat", type=int, default=1, help="--speed: pairs of runs, in turns (default 1)")
    p.add_argument("--env", default="Hopper-v4")
    p.add_argument("--runner", choices=("serial", "mpi"), default="serial")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (each takes one core)")
    p.add_argument("--only", choices=("hpcrl", "cleanrl"), help="run one side only")
    p.add_argument("--out", help="results directory (default: a new temporary one); existing results are kept")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="an override of hpcrl's config")
    args = p.parse_args(argv)
    if args.only != "hpcrl" and not args.cleanrl_script:
        p.error("--cleanrl-script is required (CleanRL's ppo_continuous_action.py; see scripts/cleanrl_env.sh)")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-vs-cleanrl-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.steps is None:
        args.steps = SPEED_STEPS if args.speed else 1_000_000
    if args.speed:
        if args.only:
            p.error("--speed runs both sides; leave out --only")
        try:
            speed(args, out)
        except RuntimeError as exc:  # a side failed: its one line (with where its log is), no traceback
            print(f"hopper-vs-cleanrl --speed: {exc}", file=sys.stderr)
            return 1
        return 0
    results_file = out / "results.jsonl"
    results = load_results(results_file, args.env, args.steps, args.overrides)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    marks = [args.steps // 4 * k for k in (1, 2, 3)] + [args.steps]
    impls = [args.only] if args.only else ["cleanrl", "hpcrl"]
    todo = [(impl, s) for s in seeds for impl in impls if (impl, s) not in results]
    print(f"hopper-vs-cleanrl: {len(todo)} runs of {args.steps:,} env steps on {args.env} ({args.jobs} at a time), "
          f"results in {results_file}", flush=True)

    def finished(row: dict) -> None:
        with results_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        results[(row["impl"], row["seed"])] = row
        final = return_at(np.asarray(row["steps"]), np.asarray(row["returns"]), args.steps)
        print(f"  {row['impl']} seed {row['seed']}: {final:.0f} at {args.steps:,} steps, {row['wall_seconds']:.0f} s",
              flush=True)

    ours = {s: hpcrl_run(args, s) for impl, s in todo if impl == "hpcrl"}
    entries = run_sweep("hopper-vs-cleanrl", out, list(ours.values()), args.jobs)
    for seed, run in ours.items():
        entry = entries[run.name]
        if entry["status"] == "done":
            finished(hpcrl_row(args, seed, out / "runs" / run.name, entry["seconds"]))
        else:
            print(f"  hpcrl seed {seed}: {entry['status']} {entry.get('message', '')}", file=sys.stderr, flush=True)
    if any(entries[run.name]["status"] == "stopped" for run in ours.values()):
        print(f"stopped: CleanRL's runs not started; run again with --out {out}", file=sys.stderr)
        return EXIT_STOPPED

    def one(seed: int) -> None:
        try:
            finished(run_cleanrl(args, seed, out))
        except RuntimeError as exc:
            print(f"  {exc}", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, [s for impl, s in todo if impl == "cleanrl"]))
    report(results, seeds, marks)
    missing = [t for t in ((i, s) for s in seeds for i in impls) if t not in results]
    return 1 if missing else 0
