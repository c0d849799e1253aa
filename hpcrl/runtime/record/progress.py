"""Progress of a run: a rich progress bar on a terminal, plain periodic lines otherwise.

The parameter rank knows the numbers; the terminal belongs to the ``hpcrl run`` parent,
which reads the mpiexec's stdout through a pipe. So the parameter rank has three modes:

- ``pipe``: one machine-readable line per second, ``@@hpcrl {json}``, that the parent
  renders with :class:`ProgressView` (its other output passes through unchanged);
- ``plain``: a readable line every ``io.log_seconds`` (batch jobs: srun, PBS mpiexec);
- ``tty``: a rich progress bar in the rank itself (an interactive ``srun --pty``).

Each stats dict holds: env_steps, total_steps, episodes, mean_return, version, staleness,
active_groups, groups, round, elapsed, and the stop rule's target_return, max_wall_seconds and
max_rounds (None where unset). The summary dict adds run_dir, stop_reason, files.

Every line ends with what the stop rule heads to and when it gets there at the rate so far, e.g.
``-> 475 return or 300,000 steps  ETA 04:48``: the step budget's (or wall limit's, or round
limit's) ETA, whichever comes first; a target return has none. ``hpcrl -q`` shows no progress at all
(the summary only), ``hpcrl -v`` a line for every record with the numbers the line leaves out
(:func:`format_detail`; :mod:`hpcrl.verbosity`).
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

PREFIX = "@@hpcrl "


def parse_line(line: str) -> dict[str, Any] | None:
    """The record carried by a pipe-mode line, or None for ordinary output."""
    if not line.startswith(PREFIX):
        return None
    try:
        return json.loads(line[len(PREFIX):])
    except json.JSONDecodeError:
        return None


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else format(x, fmt)


def heading(s: dict[str, Any]) -> str:
    """What the stop rule heads to: ``-> 475 return or 300,000 steps`` (and wall seconds, rounds where set)."""
    goals = []
    if s.get("target_return") is not None:
        goals.append(f"{s['target_return']:g} return")
    if s.get("total_steps"):
        goals.append(f"{s['total_steps']:,} steps")
    if s.get("max_wall_seconds") is not None:
        goals.append(f"{s['max_wall_seconds']:g} s")
    if s.get("max_rounds") is not None:
        goals.append(f"{s['max_rounds']:,} rounds")
    return "-> " + " or ".join(goals) if goals else ""


def eta_seconds(s: dict[str, Any]) -> float | None:
    """Seconds until the first limit (steps, wall seconds, rounds) is reached at the rate so far; None unknown."""
    elapsed = s.get("elapsed") or 0.0
    if elapsed <= 0:
        return None
    left = []
    steps, total = s.get("env_steps", 0), s.get("total_steps")
    if total and steps > 0:
        left.append(max(total - steps, 0) * elapsed / steps)
    if s.get("max_wall_seconds") is not None:
        left.append(max(s["max_wall_seconds"] - elapsed, 0.0))
    rounds = s.get("round", 0)
    if s.get("max_rounds") is not None and rounds > 0:
        left.append(max(s["max_rounds"] - rounds, 0) * elapsed / rounds)
    return min(left) if left else None


def format_eta(seconds: float | None) -> str:
    """``ETA mm:ss`` (``h:mm:ss`` past an hour), ``ETA -`` when not known."""
    if seconds is None or seconds != seconds:
        return "ETA -"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"ETA {h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"ETA {rest // 60:02d}:{rest % 60:02d}"


LINE_KEYS = {"env_steps", "total_steps", "episodes", "mean_return", "version", "staleness", "active_groups", "groups",
             "round", "elapsed", "kind", "target_return", "max_wall_seconds", "max_rounds"}
"""What :func:`format_line` shows; the rest of a stats record is the verbose line's detail."""


def format_detail(s: dict[str, Any]) -> str:
    """The numbers of a stats record the plain line leaves out (``hpcrl -v``): the algorithm's loss terms and
    the like, ``name value`` each."""
    return "  ".join(f"{k} {v:.4g}" for k, v in s.items()
                     if k not in LINE_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool))


def format_line(s: dict[str, Any]) -> str:
    """One plain progress line."""
    total = s.get("total_steps") or 0
    pct = f" ({100.0 * s.get('env_steps', 0) / total:.0f}%)" if total else ""
    rate = s.get("env_steps", 0) / s["elapsed"] if s.get("elapsed") else 0.0
    return (
        f"[{_num(s.get('elapsed'), '7.1f')} s] steps {s.get('env_steps', 0)}{pct} ({rate:.0f}/s)  "
        f"episodes {s.get('episodes', 0)}  return {_num(s.get('mean_return'), '.1f')}  "
        f"version {s.get('version', 0)}  staleness {_num(s.get('staleness'), '.2f')}  "
        f"learners {s.get('active_groups', 0)}/{s.get('groups', 0)}  round {s.get('round', 0)}  "
        f"{heading(s)}  {format_eta(eta_seconds(s))}"
    )


class ProgressView:
    """Renders stats records: rich bar on a TTY, plain lines every ``log_seconds`` otherwise."""

    def __init__(self, tty: bool | None = None, log_seconds: float = 10.0, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_seconds = log_seconds
        self._last_print = -1e18
        self._bar = None
        self._task = None

    def _start_bar(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("[bold]hpcrl"), BarColumn(bar_width=24), MofNCompleteColumn(), TextColumn("steps"),
            TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
            console=Console(file=self.stream), transient=False, refresh_per_second=4,
        )
        self._task = self._bar.add_task("train", total=total or None, info="")
        self._bar.start()

    def update(self, s: dict[str, Any]) -> None:
        """Show a stats record: nothing with ``-q``; with ``-v`` a line for every record, its detail added
        (above the bar on a terminal)."""
        from hpcrl import verbosity

        level = verbosity.level()
        if level == verbosity.QUIET:
            return
        if level == verbosity.VERBOSE:
            line = format_line(s)
            detail = format_detail(s)
            if not self.tty:
                print(f"{line}  {detail}" if detail else line, file=self.stream, flush=True)
                return
            self.echo(f"{line}  {detail}" if detail else line)
        if self.tty:
            if self._bar is None:
                self._start_bar(int(s.get("total_steps") or 0))
            info = (f"ep {s.get('episodes', 0)}  ret {_num(s.get('mean_return'), '.1f')}  "
                    f"v{s.get('version', 0)}  stale {_num(s.get('staleness'), '.2f')}  "
                    f"learners {s.get('active_groups', 0)}/{s.get('groups', 0)}  {heading(s)}  "
                    f"{format_eta(eta_seconds(s))}")
            self._bar.update(self._task, completed=s.get("env_steps", 0), info=info)
            return
        now = time.monotonic()
        if now - self._last_print >= self.log_seconds:
            self._last_print = now
            print(format_line(s), file=self.stream, flush=True)

    def echo(self, text: str) -> None:
        """Pass an ordinary output line through without breaking the bar."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def finish(self, summary: dict[str, Any] | None) -> None:
        if self._bar is not None:
            if summary:
                self._bar.update(self._task, completed=summary.get("env_steps", 0))
            self._bar.stop()
            self._bar = None
        if summary:
            print_summary(summary, self.stream, rich_table=self.tty)


PUSHES = {"gradient": "gradients, one per minibatch (learners.push=gradient)",
          "update": "updates, one per batch: the group's whole update (learners.push=update)"}


def print_summary(s: dict[str, Any], stream: TextIO, rich_table: bool = False) -> None:
    """The end-of-run table: what happened and where the files are."""
    rows = [
        ("stopped because", str(s.get("stop_reason", "?"))),
        ("wall time", f"{_num(s.get('elapsed'), '.1f')} s"),
        ("environment steps", str(s.get("env_steps", 0))),
        ("episodes", str(s.get("episodes", 0))),
        (f"mean return (last {s.get('return_window', '?')})", _num(s.get("mean_return"), ".2f")),
        ("policy version", str(s.get("version", 0))),
        ("rounds", str(s.get("round", 0))),
        (f"{'updates' if s.get('push') == 'update' else 'gradients'} received / admitted",
         f"{s.get('gradients', 0)} / {s.get('admitted', 0)}"),
        ("mean staleness", _num(s.get("staleness"), ".2f")),
        ("run directory", str(s.get("run_dir", "?"))),
    ]
    if "push" in s:  # the roles' runs: what the learners pushed and how old the sampling weights could be
        rows[-1:-1] = [("learners push", PUSHES[s["push"]]), ("batches sampled with", s["sampled_with"])]
    rows += [(name, str(path)) for name, path in s.get("files", {}).items()]
    if rich_table:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="hpcrl run summary", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for k, v in rows:
            table.add_row(k, v)
        Console(file=stream).print(table)
        return
    width = max(len(k) for k, _ in rows)
    print("hpcrl run summary", file=stream)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}", file=stream)
    stream.flush()


class ProgressEmitter:
    """Used by the parameter rank: emits stats in the chosen mode (pipe, plain, tty)."""

    def __init__(self, mode: str, log_seconds: float, stream: TextIO | None = None):
        if mode not in ("pipe", "plain", "tty"):
            raise ValueError(f"progress mode must be pipe, plain or tty, got {mode!r}")
        self.mode = mode
        self.stream = stream or sys.stdout
        self._view = None if mode == "pipe" else ProgressView(mode == "tty", log_seconds, self.stream)
        self._interval = 1.0 if mode == "pipe" else 0.5
        self._last = -1e18

    def update(self, stats: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        if self._view is None:
            print(PREFIX + json.dumps({"kind": "progress", **stats}), file=self.stream, flush=True)
        else:
            self._view.update(stats)

    def finish(self, summary: dict[str, Any]) -> None:
        if self._view is None:
            print(PREFIX + json.dumps({"kind": "summary", **summary}), file=self.stream, flush=True)
        else:
            self._view.finish(summary)
