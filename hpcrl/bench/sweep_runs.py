"""A bench's ``hpcrl run``s as a sweep in its results folder (what ``hpcrl bench marless`` and ``hopper-vs-cleanrl``
share): ``hpcrl sweep``'s local runner, state in ``OUT/sweep.json``, runs in ``OUT/runs/NAME``, their output in
``OUT/logs/NAME.log``. A run stopped or killed goes on from its checkpoint when the bench runs again with the same
``--out``; a run the folder holds with other overrides is refused (one line: use another ``--out``)."""
from __future__ import annotations

from pathlib import Path


def run_sweep(name: str, out: Path, runs: list, jobs: int) -> dict[str, dict]:
    """Run what is not done of ``runs`` (:class:`hpcrl.sweep.spec.SweepRun`), ``jobs`` at a time, the runner's lines
    printed indented; every run's entry of ``OUT/sweep.json`` after (``status``, ``seconds``, ``message``...), empty
    when the folder holds no sweep."""
    from hpcrl.sweep.local import run_local
    from hpcrl.sweep.spec import SweepSpec
    from hpcrl.sweep.state import STATE_FILE, SweepState

    if runs:
        spec = SweepSpec(name, str(out / "results.jsonl"), tuple(runs), jobs)
        run_local(spec, out, jobs, say=lambda line: print(f"  {line}", flush=True))
    return SweepState(out).read()["runs"] if (out / STATE_FILE).exists() else {}
