"""The virtual-time runner against real MPI jobs: rates, staleness, admission, with the errors.

Each case runs twice with the same config and budget: as a real MPI job on this machine (``hpcrl run``,
launch.runner=mpi) and simulated on a cluster profile of this machine (launch.runner=sim,
``--profile``, default this-machine). From each run.h5, over the steady part of the run (the fragments and
gradients after the first ``--skip`` share of the run's time): env steps/s, pushes/s into rank 0, the admitted
gradients' staleness (mean, p50, p95), the admitted share, and versions per fragment (updates over fragments).
The table gives both and the error of the sim: relative for rates, and for staleness the Wasserstein-1 distance
between the two distributions (in versions: how far, on average, a gradient's staleness has to move to turn one
distribution into the other).

    hpcrl bench sim-vs-real [--steps 30000] [--cases default,two-groups,update-push] [--profile this-machine]
                            [--json FILE] [--out DIR]

Run it on a quiet machine: the real jobs share the cores with whatever else runs, the profile's costs do not.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CASES = {
    "default": [],
    "two-groups": ["learners.groups=2", "algo.minibatch_size=128"],
    "update-push": ["learners.push=update", "algo.num_sgd_iter=4"],
}
"""Case -> overrides of the default job (hpcrl/configs/cartpole.yaml)."""


def run_case(case: str, runner: str, steps: int, profile: str, out: Path, extra: list[str]) -> tuple[Path, float]:
    run_dir = out / f"{case}-{runner}"
    overrides = [*CASES[case], f"stop.total_env_steps={steps}", "stop.target_return=null", f"io.run_dir={run_dir}",
                 "io.log_seconds=600", "io.tensorboard=false", f"launch.runner={runner}", *extra]
    if runner == "sim":
        overrides.append(f"launch.profile={profile}")
    cmd = [sys.executable, "-m", "hpcrl", "-q", "run", *[a for o in overrides for a in ("-o", o)]]
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{case} ({runner}): hpcrl run failed ({res.returncode}):\n{res.stdout[-1500:]}"
                           f"{res.stderr[-1500:]}")
    return run_dir, time.perf_counter() - start


def measures(run_dir: Path, skip: float) -> dict:
    """The steady part of a run's record: rates and staleness (``skip``: the share of its time left out)."""
    from hpcrl.io import read_table

    h5 = run_dir / "run.h5"
    actors = read_table(h5, "actors", ["time", "steps"])
    grads = read_table(h5, "gradients", ["time", "staleness", "admitted"])
    updates = read_table(h5, "updates", ["time"])
    t_end = float(max(actors["time"].max(), grads["time"].max()))
    t_start = float(min(actors["time"].min(), grads["time"].min()))
    cut = t_start + skip * (t_end - t_start)
    span = t_end - cut
    a = actors["time"] >= cut
    g = grads["time"] >= cut
    admitted = grads["admitted"][g] == 1
    staleness = grads["staleness"][g][admitted].astype(float)
    u = updates["time"] >= cut
    return {"env_steps_per_s": float(actors["steps"][a].sum() / span), "pushes_per_s": float(g.sum() / span),
            "staleness_mean": float(staleness.mean()), "staleness_p50": float(np.percentile(staleness, 50)),
            "staleness_p95": float(np.percentile(staleness, 95)), "admitted_share": float(admitted.mean()),
            "versions_per_fragment": float(u.sum() / max(a.sum(), 1)), "staleness": staleness.tolist()}


ROWS = (("env steps/s", "env_steps_per_s", "rel"), ("pushes/s", "pushes_per_s", "rel"),
        ("staleness mean", "staleness_mean", "abs"), ("staleness p50", "staleness_p50", "abs"),
        ("staleness p95", "staleness_p95", "abs"), ("admitted share", "admitted_share", "abs"),
        ("versions per fragment", "versions_per_fragment", "rel"))


def compare(real: dict, sim: dict) -> dict:
    from scipy.stats import wasserstein_distance

    out = {}
    for _, key, kind in ROWS:
        r, s = real[key], sim[key]
        out[key] = (s - r) / r if kind == "rel" and r else s - r
    out["staleness_w1"] = float(wasserstein_distance(real["staleness"], sim["staleness"]))
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench sim-vs-real", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30_000, help="env steps per run (default 30000)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--profile", default="this-machine", help="the sim's cluster profile (default this-machine)")
    p.add_argument("--skip", type=float, default=0.2, help="share of each run's time left out as start-up (0.2)")
    p.add_argument("--json", help="write every measure (and the staleness samples) here")
    p.add_argument("--out", help="keep the run directories here (default: a temporary directory)")
    p.add_argument("-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",")]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {', '.join(unknown)}; allowed: {', '.join(CASES)}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="hpcrl-sim-vs-real-"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for case in cases:
        got = {}
        for runner in ("mpi", "sim"):
            run_dir, seconds = run_case(case, runner, args.steps, args.profile, out, args.overrides)
            got[runner] = {**measures(run_dir, args.skip), "real_seconds": seconds}
            print(f"sim-vs-real: {case} {runner}: {seconds:.1f} s", flush=True)
        results.append({"case": case, "real": got["mpi"], "sim": got["sim"], "error": compare(got["mpi"], got["sim"])})
    print(f"\nsim ({args.profile}) against real MPI jobs on this machine, {args.steps:,} env steps each, "
          f"steady part (after the first {args.skip:.0%} of each run's time)")
    print(f"{'case':12s} {'measure':22s} {'real':>10s} {'sim':>10s} {'error':>9s}")
    for r in results:
        for label, key, kind in ROWS:
            err = r["error"][key]
            shown = f"{err:+.0%}" if kind == "rel" else f"{err:+.2f}"
            print(f"{r['case']:12s} {label:22s} {r['real'][key]:10.3g} {r['sim'][key]:10.3g} {shown:>9s}")
        print(f"{r['case']:12s} {'staleness W1 distance':22s} {'':10s} {'':10s} {r['error']['staleness_w1']:9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": args.steps, "profile": args.profile, "skip": args.skip,
                                               "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
