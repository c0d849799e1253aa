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
                            [--repeats 3] [--json FILE] [--out DIR]

Run it on a quiet machine: the real jobs share the cores with whatever else runs. The profile's costs are those of
``--profile`` except, for each case, what ``hpcrl bench scale-model`` measures of its config right before its real
runs (an env step, a minibatch gradient, a batch's preparation and a trajectory write: written to
``OUT/<case>-profile.yaml``), so both sides see the machine as it is then; ``--no-measure`` keeps the profile's.
``--repeats N`` runs each real job N times (the sim is deterministic: once): the table compares the sim with the
real runs' median of each measure and shows their range, the real jobs' own spread on this machine.
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


def measured_profile(case: str, profile: str, out: Path, extra: list[str], seconds: float = 3.0) -> Path:
    """``profile`` with the CPU costs of the case's config measured now on this machine, as a file under ``out``."""
    import yaml

    from hpcrl.bench.scale_measure import workload
    from hpcrl.cluster_profiles import load_profile
    from hpcrl.config import load_config

    overrides = [*CASES[case], *extra]
    cfg = load_config(None, overrides)
    work, got = workload(str(default_config()), overrides, seconds)
    base = load_profile(profile)
    costs = base.costs.model_dump()
    costs["env_step"] = {**costs["env_step"], cfg.env.id: got["actor_step"]}
    costs["gradient"] = {"fixed": got["gradient"], "per_sample_float": 0.0}  # at this config's minibatch
    costs["prepare_per_step"], costs["record_per_step"] = got["prepare_per_step"], got["record_per_step"]
    data = {**base.model_dump(), "name": f"{base.name}-measured-{case}", "costs": costs,
            "sources": {**base.sources, "env_step, gradient, prepare_per_step, record_per_step":
                        f"hpcrl bench sim-vs-real: measured right before the case's real runs ({work})"}}
    data["nodes"] = [dict(k) for k in data["nodes"]]
    path = out / f"{case}-profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def default_config() -> Path:
    """The default job's config (hpcrl run without a CONFIG), every case's base."""
    import hpcrl

    return Path(hpcrl.__file__).parent / "configs" / "cartpole.yaml"


def run_case(case: str, runner: str, steps: int, profile: str, out: Path, extra: list[str], repeat: int = 0
             ) -> tuple[Path, float]:
    run_dir = out / f"{case}-{runner}-{repeat}"
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
    """The steady part of a run's record: rates (env steps sampled, and trained on: they differ where
    actors.sync_frac drops late fragments) and staleness (``skip``: the share of its time left out at the
    start). It ends with the actors' last fragment: after the stop the learners drain what they hold (in a large
    simulated job, for longer than the steady part), which is not the job's rate."""
    from hpcrl.io import read_table

    h5 = run_dir / "run.h5"
    actors = read_table(h5, "actors", ["time", "steps"])
    grads = read_table(h5, "gradients", ["time", "staleness", "admitted"])
    updates = read_table(h5, "updates", ["time"])
    rounds = read_table(h5, "rounds", ["start", "duration", "env_steps"])
    t_start = float(min(actors["time"].min(), grads["time"].min()))
    t_end = float(min(actors["time"].max(), grads["time"].max()))
    cut = t_start + skip * (t_end - t_start)

    def inside(times: np.ndarray) -> np.ndarray:
        return (times >= cut) & (times <= t_end)

    if not inside(grads["time"]).any():  # no gradient while the actors sampled: too short for a steady part
        t_end = float(max(actors["time"].max(), grads["time"].max()))  # the whole run
        cut = t_start + skip * (t_end - t_start)
    span = t_end - cut
    a, g, u = inside(actors["time"]), inside(grads["time"]), inside(updates["time"])
    r = inside(rounds["start"] + rounds["duration"])  # the rounds that ended inside: the env steps trained on
    admitted = grads["admitted"][g] == 1
    staleness = grads["staleness"][g][admitted].astype(float)
    return {"env_steps_per_s": float(actors["steps"][a].sum() / span), "pushes_per_s": float(g.sum() / span),
            "trained_steps_per_s": float(rounds["env_steps"][r].sum() / span),
            "staleness_mean": float(staleness.mean()), "staleness_p50": float(np.percentile(staleness, 50)),
            "staleness_p95": float(np.percentile(staleness, 95)), "admitted_share": float(admitted.mean()),
            "versions_per_fragment": float(u.sum() / max(a.sum(), 1)), "staleness": staleness.tolist()}


ROWS = (("env steps/s", "env_steps_per_s", "rel"), ("pushes/s", "pushes_per_s", "rel"),
        ("staleness mean", "staleness_mean", "abs"), ("staleness p50", "staleness_p50", "abs"),
        ("staleness p95", "staleness_p95", "abs"), ("admitted share", "admitted_share", "abs"),
        ("versions per fragment", "versions_per_fragment", "rel"))


def median_run(runs: list[dict]) -> dict:
    """Each measure's median over the real runs; the staleness samples of them all."""
    keys = [key for _, key, _ in ROWS]
    return {**{k: float(np.median([r[k] for r in runs])) for k in keys},
            "staleness": [x for r in runs for x in r["staleness"]],
            "real_seconds": float(np.median([r["real_seconds"] for r in runs]))}


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
    p.add_argument("--repeats", type=int, default=3, help="real runs per case (default 3)")
    p.add_argument("--measure-seconds", type=float, default=3.0,
                   help="timing of each measured cost (default 3.0; about ten costs a case)")
    p.add_argument("--no-measure", dest="measure", action="store_false",
                   help="use the profile's CPU costs as they are (default: measure each case's first)")
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
        profile = (str(measured_profile(case, args.profile, out, args.overrides, args.measure_seconds)) if args.measure
                   else args.profile)
        reals = []
        for repeat in range(args.repeats):
            run_dir, seconds = run_case(case, "mpi", args.steps, args.profile, out, args.overrides, repeat)
            reals.append({**measures(run_dir, args.skip), "real_seconds": seconds})
            print(f"sim-vs-real: {case} mpi {repeat + 1}/{args.repeats}: {seconds:.1f} s", flush=True)
        run_dir, seconds = run_case(case, "sim", args.steps, profile, out, args.overrides)
        sim = {**measures(run_dir, args.skip), "real_seconds": seconds}
        print(f"sim-vs-real: {case} sim: {seconds:.1f} s", flush=True)
        real = median_run(reals)
        results.append({"case": case, "real": real, "real_runs": reals, "sim": sim, "error": compare(real, sim)})
    print(f"\nsim ({args.profile}{', CPU costs measured per case' if args.measure else ''}) against real MPI jobs on this machine, {args.steps:,} env steps each, "
          f"steady part (after the first {args.skip:.0%} of each run's time)")
    print(f"{'case':12s} {'measure':22s} {'real':>10s} {'real range':>21s} {'sim':>10s} {'error':>9s}")
    for r in results:
        for label, key, kind in ROWS:
            err = r["error"][key]
            shown = f"{err:+.0%}" if kind == "rel" else f"{err:+.2f}"
            values = [x[key] for x in r["real_runs"]]
            spread = f"{min(values):.3g} .. {max(values):.3g}"
            print(f"{r['case']:12s} {label:22s} {r['real'][key]:10.3g} {spread:>21s} {r['sim'][key]:10.3g} {shown:>9s}")
        print(f"{r['case']:12s} {'staleness W1 distance':22s} {'':10s} {'':10s} {r['error']['staleness_w1']:9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": args.steps, "profile": args.profile, "skip": args.skip,
                                               "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
