"""Learning-quality guard: the reference configs over several seeds against curves stored in the repo.

Three cases, each a shipped config run as ``hpcrl run`` with a fixed budget (no early stop): the
default CartPole job, Hopper (hpcrl/configs/hopper.yaml, CleanRL's PPO) at 150K env steps, and
MPE simple-spread with IPPO. At each mark the return is the mean of the last 20 episodes ended
by then (hpcrl/bench/curves.py); a case passes when its mean over the seeds is at least the
reference mean minus the band, ``max(2 x reference std over seeds, 5 % of |reference mean|)``, at
every mark (with 3 seeds a side, 2 std is about 2.5 standard errors of the difference of two means:
the guard catches a real loss of learning, not a shift within the seeds' spread). A mean above the band is reported (time to refresh), not failed. Exit status: 0 when
every case passes, 1 otherwise.

The reference (hpcrl/bench/learning_reference.json) holds each case's settings, seeds, marks and
the per-seed values it was made from, with the machine, date and command. Refresh it after a change
that is meant to change learning, on a quiet machine, and commit it with that change:

    hpcrl bench learning [--cases cartpole,hopper,mpe-spread] [--jobs 2] [--out DIR]
    hpcrl bench learning --refresh [--seeds 3] [--cases ...]     # rewrite the reference

A check runs the seeds the reference names. The Hopper and MPE cases use the serial runner (one
core a run), CartPole its default MPI job. A seed does not repeat its numbers exactly (pipelined
actors; actor threads sharing torch's generator), so the band, not the value, is compared.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from hpcrl.bench import curves

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
REFERENCE = Path(__file__).resolve().parent / "learning_reference.json"
BAND_STDS = 2.0
BAND_FLOOR = 0.05
"""The band below the reference mean: max(BAND_STDS x its std over seeds, BAND_FLOOR x |its mean|)."""


@dataclass(frozen=True)
class Case:
    config: str
    """A file in hpcrl/configs/."""
    runner: str
    steps: int
    """stop.total_env_steps (also the lr-anneal horizon of configs that anneal)."""
    marks: tuple[int, ...]
    overrides: tuple[str, ...] = field(default=())


CASES = {
    "cartpole": Case("cartpole.yaml", "mpi", 40_000, (10_000, 20_000, 30_000, 40_000), ("stop.target_return=null",)),
    "hopper": Case("hopper.yaml", "serial", 150_000, (50_000, 100_000, 150_000)),
    # 100 rounds: over fewer, IPPO's gain on simple-spread is within its seed spread (-38.8 random, -37.0 +- 1.8 at 144K)
    "mpe-spread": Case("mpe_spread_ippo.yaml", "serial", 480_000, (160_000, 320_000, 480_000), ("algo.policies=shared",)),
}


def machine() -> str:
    """The CPU model and core count (what the reference's numbers and wall-clocks depend on)."""
    import os

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def run_case(name: str, case: Case, seeds: list[int], out: Path, jobs: int) -> dict:
    """Every seed of one case: per-seed returns at the marks and wall seconds."""
    def one(seed: int) -> tuple[list[float], float]:
        run_dir = out / f"{name}-seed{seed}"
        overrides = [*case.overrides, f"env.seed={seed}", f"stop.total_env_steps={case.steps}"]
        wall = curves.run_hpcrl(CONFIGS / case.config, run_dir, case.runner, overrides, out / f"{name}-seed{seed}.log")
        steps, returns = curves.episodes(run_dir)
        return [curves.return_at(steps, returns, m) for m in case.marks], wall

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = list(pool.map(one, seeds))
    values = np.array([v for v, _ in done])
    return {"values": values.tolist(), "mean": values.mean(0).tolist(),
            "std": values.std(0, ddof=1 if len(seeds) > 1 else 0).tolist(),
            "wall_seconds": [w for _, w in done]}


def band(mean: float, std: float) -> float:
    return max(BAND_STDS * std, BAND_FLOOR * abs(mean))


def compare(name: str, ref: dict, now: dict) -> bool:
    """Print one case's marks against its reference; True when no mark falls below the band."""
    ok = True
    print(f"\n{name} ({ref['config']}, {ref['runner']} runner, seeds {ref['seeds']})")
    print(f"{'env steps':>10} {'reference':>18} {'now':>18} {'lowest allowed':>15}  verdict")
    for i, mark in enumerate(ref["marks"]):
        rm, rs, nm, ns = ref["mean"][i], ref["std"][i], now["mean"][i], now["std"][i]
        low, high = rm - band(rm, rs), rm + band(rm, rs)
        verdict = "below the band" if nm < low else ("above the band: refresh?" if nm > high else "ok")
        ok &= not (nm < low) and np.isfinite(nm)
        print(f"{mark:>10,} {rm:>10.1f} +- {rs:<5.1f} {nm:>10.1f} +- {ns:<5.1f} {low:>15.1f}  {verdict}")
    return ok


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench learning", description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--refresh", action="store_true", help="run the cases and rewrite the reference")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 (with --refresh)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (each takes about one core)")
    p.add_argument("--reference", default=str(REFERENCE), help="the reference file")
    p.add_argument("--out", help="run directories (default: a new temporary one)")
    args = p.parse_args(argv)
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"--cases: unknown {', '.join(unknown)}; allowed: {', '.join(CASES)}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-learning-"))
    out.mkdir(parents=True, exist_ok=True)
    ref_path = Path(args.reference)
    reference = json.loads(ref_path.read_text()) if ref_path.exists() else {"cases": {}}
    if args.refresh:
        seeds = list(range(args.seeds))
        for name in names:
            print(f"{name}: {len(seeds)} seeds ...", flush=True)
            case = CASES[name]
            reference["cases"][name] = {**asdict(case), "seeds": seeds, **run_case(name, case, seeds, out, args.jobs),
                                        "refreshed": {"date": datetime.date.today().isoformat(), "machine": machine(),
                                                      "command": f"hpcrl bench learning --refresh --seeds {args.seeds} "
                                                                 f"--cases {','.join(names)}"}}
        ref_path.write_text(json.dumps(reference, indent=1) + "\n")
        print(f"reference written: {ref_path}")
        for name in names:
            compare(name, reference["cases"][name], reference["cases"][name])
        return 0
    missing = [n for n in names if n not in reference["cases"]]
    if missing:
        p.error(f"the reference {ref_path} has no case {', '.join(missing)}; make it with --refresh")
    print(f"reference: {ref_path}; runs in {out}")
    ok = True
    for name in names:
        ref = reference["cases"][name]
        made = ref.get("refreshed", {})
        print(f"\n{name}: reference made {made.get('date', '?')} on {made.get('machine', '?')}")
        case = Case(ref["config"], ref["runner"], ref["steps"], tuple(ref["marks"]), tuple(ref["overrides"]))
        try:
            now = run_case(name, case, ref["seeds"], out, args.jobs)
        except RuntimeError as exc:
            print(f"\n{name}: {exc}")
            ok = False
            continue
        ok &= compare(name, ref, now)
    print("\nlearning guard: " + ("every case within its reference" if ok else "a case fell below its reference"))
    return 0 if ok else 1
