"""`hpcrl sweep SPEC [--out DIR] [--parallel N] [--retry-failed] [--list]`.

Runs a sweep spec's grid (configs x arms x seeds: hpcrl/sweep/spec.py) on this machine, N runs at a time, and
keeps its state in ``DIR/sweep.json``; the same command again goes on where it stopped (finished runs are kept,
unfinished ones resume from their checkpoints). ``--list`` prints the runs and their status and runs nothing.
Every run's config is checked before any starts: a bad spec or config is one line, exit 2, nothing run.
``hpcrl analyze DIR`` compares the arms.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpcrl.sweep.spec import load_spec
from hpcrl.sweep.state import SweepState, counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="sweep spec (YAML: config(s), overrides, arms and/or grid, seeds, parallel)")
    parser.add_argument("--out", help="the sweep's directory (default: sweeps/NAME under the current directory)")
    parser.add_argument("--parallel", type=int, help="runs at a time (default: the spec's parallel, else 1)")
    parser.add_argument("--retry-failed", action="store_true", help="run failed runs again (default: keep them)")
    parser.add_argument("--list", action="store_true", help="print the runs and their status; run nothing")


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
    from hpcrl.sweep.local import run_local

    return run_local(spec, out, args.parallel, args.retry_failed, say=lambda line: print(f"hpcrl sweep: {line}",
                                                                                         file=sys.stderr, flush=True))
