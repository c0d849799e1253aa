"""`hpcrl sweep SPEC [--out DIR] [--parallel N] [--retry-failed] [--list] [--only PATTERN]`, or as a Slurm job array:
`hpcrl sweep SPEC --site NAME [--time T --queue Q --account A --dry-run]`.

Runs a sweep spec's grid (configs x arms x seeds: hpcrl/sweep/spec.py) on this machine, N runs at a time, and
keeps its state in ``DIR/sweep.json``; the same command again goes on where it stopped (finished runs are kept,
unfinished ones resume from their checkpoints). ``--list`` prints the runs and their status and runs nothing.
Every run's config is checked before any starts: a bad spec or config is one line, exit 2, nothing run.
``hpcrl analyze DIR`` compares the arms. With ``--site`` the runs go to the site's Slurm as one job array
(hpcrl/sweep/array.py), ``--parallel`` tasks at a time; each task runs ``hpcrl sweep SPEC --out DIR --task I``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpcrl.commands.submit import add_batch_arguments
from hpcrl.sweep.spec import load_spec
from hpcrl.sweep.state import SweepState, counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="sweep spec (YAML: config(s), overrides, arms and/or grid, seeds, parallel)")
    parser.add_argument("--out", help="the sweep's directory (default: sweeps/NAME under the current directory)")
    parser.add_argument("--parallel", type=int, help="runs at a time (default: the spec's parallel, else 1)")
    parser.add_argument("--retry-failed", action="store_true", help="run failed runs again (default: keep them)")
    parser.add_argument("--list", action="store_true", help="print the runs and their status; run nothing")
    parser.add_argument("--only", action="append", metavar="PATTERN",
                        help="run only the runs whose names match this shell pattern, e.g. 'mappo-*-s1' "
                             "(repeatable; on this machine, not with --site)")
    parser.add_argument("--site", help="submit the runs as a Slurm job array on this site (hpcrl submit's sites); "
                                       "the flags below are for it")
    add_batch_arguments(parser, each=" of each task")
    parser.add_argument("--task", type=int, help=argparse.SUPPRESS)  # an array task: run I of the sweep


def main(args: argparse.Namespace) -> int:
    from hpcrl.errors import ConfigError

    if args.parallel is not None and args.parallel < 1:
        raise ConfigError(f"--parallel {args.parallel}: give 1 or more runs at a time")
    spec = load_spec(args.spec)
    out = Path(args.out or Path("sweeps") / spec.name).resolve()
    if args.list:
        state = SweepState(out)
        known = state.read()["runs"] if state.path.exists() else {}
        for r in spec.runs:
            entry = known.get(r.name, {"status": "pending"})
            print(f"{r.name:40s} {entry['status']:8s} {' '.join(r.overrides)}")
        if known:
            c = counts({"runs": {r.name: known.get(r.name, {"status": "pending"}) for r in spec.runs}})
            print(", ".join(f"{n} {s}" for s, n in c.items() if n), file=sys.stderr)
        return 0
    def say(line: str) -> None:
        print(f"hpcrl sweep: {line}", file=sys.stderr, flush=True)

    if args.site:
        if args.only:
            raise ConfigError("--only runs a part of the sweep on this machine; a job array (--site) runs all of it")
        return submit_array(args, spec, out)
    from hpcrl.sweep.local import run_local, run_task

    if args.task is not None:
        return run_task(spec, out, args.task, say)
    return run_local(spec, out, args.parallel, args.retry_failed, say, args.only)


def submit_array(args: argparse.Namespace, spec, out: Path) -> int:
    from hpcrl.sites import load_site
    from hpcrl.sweep.array import plan_array, render_array, submit_array as sbatch

    site = load_site(args.site)
    array = plan_array(spec, out, site, parallel=args.parallel or spec.parallel, time=args.time, queue=args.queue,
                       account=args.account, warning_seconds=args.warning_seconds, max_restarts=args.max_restarts,
                       python=args.python, env_script=args.env_script)
    script = render_array(array, site)
    if args.dry_run:
        sys.stdout.write(script)
        print(f"# dry run: would write {array.script_path} and run: sbatch --parsable {array.script_path}",
              file=sys.stderr)
        return 0
    data = SweepState(out).open(spec)
    (out / "logs").mkdir(exist_ok=True)
    job_id = sbatch(array, script)
    c = counts(data)
    print(f"hpcrl sweep: submitted array {job_id} ({array.tasks} tasks, {array.parallel} at a time; {c['done']} runs "
          f"done already): {array.script_path}", file=sys.stderr)
    print(job_id)
    return 0
