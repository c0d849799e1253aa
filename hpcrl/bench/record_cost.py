"""Rank 0's record of a node's fragment reports, per report: this checkout against a git revision, in turns.

``RunRecord.fragments`` of node messages' columns (``actors.reports: node``), one finished episode per report, with
the record's flushes to run.h5, for each ``--blocks`` size (reports per node message): the marginal CPU seconds per
report, a run of ``--reports`` reports less one of a twentieth as many (so opening the file and the first flush do
not count). The revision's side runs in a ``git worktree`` of it (its own ``hpcrl`` first on the path) in a child
process, this checkout's in another, alternating for ``--rounds`` rounds; the best of each side is kept. Prints the
table of microseconds per report and the ratio old / new. The large job's ask of rank 0 and why the rows must leave
it: docs/results/scaling.md.

    hpcrl bench record-cost --against REV [--blocks 8,64,512] [--reports 409600] [--rounds 2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def marginal_seconds(feed, per_feed: int, reports: int, io, stop) -> float:
    """CPU seconds per report of ``feed(record)`` (which records ``per_feed`` reports) on a fresh ``RunRecord``,
    marginal: the best of three runs of ``reports`` reports less the best of three of a twentieth as many, so opening
    run.h5 and its first flush do not count (its half-second flushes do). ``io``, ``stop``: a config's sections."""
    from hpcrl.runtime.record.run_record import RunRecord
    from hpcrl.runtime.record.stop_rule import StopRule
    from hpcrl.runtime.topology import one_process_rank_map

    def cpu(n: int) -> float:
        with tempfile.TemporaryDirectory(prefix="hpcrl-record-cost-") as tmp:
            record = RunRecord.create(Path(tmp), io.model_copy(update={"loggers": []}), "", one_process_rank_map(),
                                      StopRule(stop), {})
            feed(record)
            record.flush()
            start = time.process_time()
            for _ in range(n // per_feed):
                feed(record)
                record.maybe_flush()
            record.flush()
            took = time.process_time() - start
            record.close()
        return took

    # the best of three of each: a half-second flush that lands in one run and not another (a loaded machine, a
    # slow first run) is noise of about 10 ms, more than a small run's reports cost
    small = reports // 20
    return (min(cpu(reports) for _ in range(3)) - min(cpu(small) for _ in range(3))) / (reports - small)


def measure(blocks: list[int], reports: int) -> dict[int, float]:
    """Marginal CPU microseconds per report of ``RunRecord.fragments`` for each block size (in this process, with
    whichever ``hpcrl`` comes first on the path)."""
    from hpcrl.bench.scale_measure import _report_message
    from hpcrl.config import load_config
    from hpcrl.runtime.messages import FragmentColumns

    cfg = load_config(str(ROOT / "hpcrl" / "configs" / "cartpole.yaml"))

    def us(block: int) -> float:
        columns = FragmentColumns.of([_report_message(i, i, 256) for i in range(block)])
        return 1e6 * marginal_seconds(lambda record: record.fragments(columns.actors, columns.episodes, 0), block,
                                      reports, cfg.io, cfg.stop)

    return {b: us(b) for b in blocks}


def _side(path: Path, blocks: list[int], reports: int) -> dict[int, float]:
    """One measurement in a child process whose ``hpcrl`` is the one under ``path``."""
    # this file's measure(), run with the other tree's hpcrl (an older revision has no such bench)
    code = (f"import json, runpy; measure = runpy.run_path({str(Path(__file__).resolve())!r})['measure']; "
            f"print(json.dumps(measure({blocks!r}, {reports})))")
    env = dict(os.environ, PYTHONPATH=str(path))
    out = subprocess.run([sys.executable, "-c", code], cwd=path, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"hpcrl bench record-cost: the side at {path} failed:\n{out.stderr[-2000:]}")
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hpcrl bench record-cost", description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="git revision to compare with (the old side)")
    parser.add_argument("--blocks", default="8,64,512", help="reports per node message, comma-separated")
    parser.add_argument("--reports", type=int, default=409_600, help="reports per block size and run")
    parser.add_argument("--rounds", type=int, default=2, help="old-new turns; the best of each side is kept")
    parser.add_argument("--json", help="append the result as one JSON line to this file")
    args = parser.parse_args(argv)
    try:
        blocks = [int(b) for b in args.blocks.split(",")]
    except ValueError:
        raise SystemExit(f"hpcrl bench record-cost: --blocks {args.blocks!r}: give whole numbers, e.g. 8,64,512")
    if min(blocks) < 1 or args.reports < 20 * max(blocks) or args.rounds < 1:
        raise SystemExit("hpcrl bench record-cost: blocks >= 1, --reports >= 20 x the largest block, --rounds >= 1")
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.against], capture_output=True,
                         text=True)
    if rev.returncode != 0:
        raise SystemExit(f"hpcrl bench record-cost: --against {args.against!r} is not a revision of this checkout")
    with tempfile.TemporaryDirectory(prefix="hpcrl-record-cost-old-") as tmp:
        old_tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(old_tree), args.against],
                       check=True, capture_output=True)
        try:
            old, new = {b: float("inf") for b in blocks}, {b: float("inf") for b in blocks}
            for r in range(args.rounds):
                for side, path in ((old, old_tree), (new, ROOT)) if r % 2 == 0 else ((new, ROOT), (old, old_tree)):
                    for b, us in _side(path, blocks, args.reports).items():
                        side[b] = min(side[b], us)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)],
                           capture_output=True)
    print(f"{'reports per message':>20s} {'old us':>8s} {'new us':>8s} {'old/new':>8s}   (old: {rev.stdout.strip()})")
    for b in blocks:
        print(f"{b:20d} {old[b]:8.2f} {new[b]:8.2f} {old[b] / new[b]:8.2f}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"against": rev.stdout.strip(), "old_us": old, "new_us": new}) + "\n")
    return 0
