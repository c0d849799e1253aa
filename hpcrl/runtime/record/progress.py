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

A plain line fits 80 columns (:data:`WIDTH`): the elapsed seconds, the steps (and the share of the
budget), the mean return and, with a target return, ``-> 475 in 12:30``: when the return trend of the
last records (:class:`ReturnTrend`) reaches it; it ends with the ETA of the first limit the stop rule
sets (step budget, or ``wall`` seconds, or ``rounds``) at the rate so far. Where the line would be
wider, the least needed numbers (round, episodes, learners, staleness, version, rate) are left out, in
that order; the learners are shown only with more than one group, the round only with a round limit. ``hpcrl -q`` shows no progress at all (the summary only), ``hpcrl -v`` a line for every
record with the numbers the line leaves out (:func:`format_detail`; :mod:`hpcrl.verbosity`).
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


def eta_limit(s: dict[str, Any]) -> tuple[float | None, str]:
    """Seconds until the first limit (steps, wall seconds, rounds) is reached at the rate so far, and which one
    (``steps``, ``wall``, ``rounds``); (None, "") when unknown."""
    elapsed = s.get("elapsed") or 0.0
    if elapsed <= 0:
        return None, ""
    left = []
    steps, total = s.get("env_steps", 0), s.get("total_steps")
    if total and steps > 0:
        left.append((max(total - steps, 0) * elapsed / steps, "steps"))
    if s.get("max_wall_seconds") is not None:
        left.append((max(s["max_wall_seconds"] - elapsed, 0.0), "wall"))
    rounds = s.get("round", 0)
    if s.get("max_rounds") is not None and rounds > 0:
        left.append((max(s["max_rounds"] - rounds, 0) * elapsed / rounds, "rounds"))
    return min(left) if left else (None, "")


def eta_seconds(s: dict[str, Any]) -> float | None:
    """Seconds until the first limit of the stop rule at the rate so far; None unknown."""
    return eta_limit(s)[0]


class ReturnTrend:
    """When the mean return reaches the target at its recent trend: the least-squares slope of (elapsed, mean
    return) over the records of the last half of the run so far (the start's climb says little about the end's),
    at least ``MIN_POINTS`` of them; None while the return does not rise."""

    MIN_POINTS = 3

    def __init__(self) -> None:
        self._points: list[tuple[float, float]] = []

    def add(self, s: dict[str, Any]) -> None:
        t, r = s.get("elapsed"), s.get("mean_return")
        if t is None or r is None or r != r or (self._points and t <= self._points[-1][0]):
            return
        self._points.append((float(t), float(r)))
        keep_from = t / 2
        while len(self._points) > self.MIN_POINTS and self._points[0][0] < keep_from:
            self._points.pop(0)

    def seconds_to(self, target: float | None) -> float | None:
        if target is None or len(self._points) < self.MIN_POINTS:
            return None
        last = self._points[-1][1]
        if last >= target:
            return 0.0
        n = len(self._points)
        mt = sum(t for t, _ in self._points) / n
        mr = sum(r for _, r in self._points) / n
        var = sum((t - mt) ** 2 for t, _ in self._points)
        slope = sum((t - mt) * (r - mr) for t, r in self._points) / var if var > 0 else 0.0
        return (target - last) / slope if slope > 0 else None


def _clock(seconds: float | None) -> str:
    """``mm:ss`` (``h:mm:ss`` past an hour), ``-`` when not known."""
    if seconds is None or seconds != seconds:
        return "-"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    if h >= 100:
        return f"{seconds / 86400:.1f}d"
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


def _count(n: int) -> str:
    """``n`` in digits up to 10 million, then ``12.3M`` / ``4.5G``: a step count that keeps the line short."""
    if n < 10_000_000:
        return str(n)
    return f"{n / 1e6:.1f}M" if n < 10_000_000_000 else f"{n / 1e9:.1f}G"


def format_eta(seconds: float | None) -> str:
    """``ETA mm:ss`` (``h:mm:ss`` past an hour), ``ETA -`` when not known."""
    return f"ETA {_clock(seconds)}"


LINE_KEYS = {"env_steps", "total_steps", "episodes", "mean_return", "version", "staleness", "active_groups", "groups",
             "round", "elapsed", "kind", "target_return", "max_wall_seconds", "max_rounds"}
"""What :func:`format_line` shows; the rest of a stats record is the verbose line's detail."""


def format_detail(s: dict[str, Any]) -> str:
    """The numbers of a stats record the plain line leaves out (``hpcrl -v``): the algorithm's loss terms and
    the like, ``name value`` each."""
    return "  ".join(f"{k} {v:.4g}" for k, v in s.items()
                     if k not in LINE_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool))


WIDTH = 80
"""The widest a plain progress line gets."""


def format_line(s: dict[str, Any], target_eta: float | None = None, width: int = WIDTH) -> str:
    """One plain progress line of at most ``width`` columns; ``target_eta``: seconds until the target return
    (:class:`ReturnTrend`), shown where the stop rule has one."""
    total = s.get("total_steps") or 0
    steps = s.get("env_steps", 0)
    pct = f" ({100.0 * steps / total:.0f}%)" if total else ""
    rate = steps / s["elapsed"] if s.get("elapsed") else 0.0
    ret = f"return {_num(s.get('mean_return'), '.1f')}"
    if s.get("target_return") is not None:
        ret += f" -> {s['target_return']:g} in {_clock(target_eta)}"
    eta, limit = eta_limit(s)
    end = format_eta(eta) + ("" if limit in ("", "steps") else f" {limit}")
    # (text, priority): the lowest priority goes first when the line is too wide; None: always shown
    fields = [(f"[{_num(s.get('elapsed'), '.1f')} s] steps {_count(steps)}{pct}", None), (f"{rate:.0f}/s", 1),
              (f"ep {s.get('episodes', 0)}", 5), (ret, None), (f"v{s.get('version', 0)}", 2),
              (f"stale {_num(s.get('staleness'), '.2f')}", 3),
              (f"learners {s.get('active_groups', 0)}/{s.get('groups', 0)}", 4), (f"round {s.get('round', 0)}", 6),
              (end, None)]
    # one learner group has nothing to say about activity, and rounds matter where the stop rule counts them
    fields = [f for f in fields if not ((f[1] == 4 and (s.get("groups") or 0) <= 1)
                                        or (f[1] == 6 and s.get("max_rounds") is None))]
    while True:
        line = "  ".join(text for text, _ in fields)
        droppable = [f for f in fields if f[1] is not None]
        if len(line) <= width or not droppable:
            return line
        fields.remove(max(droppable, key=lambda f: f[1]))


class ProgressView:
    """Renders stats records: rich bar on a TTY, plain lines every ``log_seconds`` otherwise."""

    def __init__(self, tty: bool | None = None, log_seconds: float = 10.0, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_seconds = log_seconds
        self._last_print = -1e18
        self._bar = None
        self._task = None
        self._trend = ReturnTrend()

    def line(self, s: dict[str, Any]) -> str:
        """The plain line of ``s`` with the target return's ETA from the records seen so far."""
        return format_line(s, self._trend.seconds_to(s.get("target_return")))

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
        self._trend.add(s)
        if level == verbosity.VERBOSE:
            line = self.line(s)
            detail = format_detail(s)
            if not self.tty:
                print(f"{line}  {detail}" if detail else line, file=self.stream, flush=True)
                return
            self.echo(f"{line}  {detail}" if detail else line)
        if self.tty:
            if self._bar is None:
                self._start_bar(int(s.get("total_steps") or 0))
            target = s.get("target_return")
            info = (f"ep {s.get('episodes', 0)}  ret {_num(s.get('mean_return'), '.1f')}"
                    + (f" -> {target:g} in {_clock(self._trend.seconds_to(target))}" if target is not None else "")
                    + f"  v{s.get('version', 0)}  stale {_num(s.get('staleness'), '.2f')}  "
                    f"learners {s.get('active_groups', 0)}/{s.get('groups', 0)}  {heading(s)}  "
                    f"{format_eta(eta_seconds(s))}")
            self._bar.update(self._task, completed=s.get("env_steps", 0), info=info)
            return
        now = time.monotonic()
        if now - self._last_print >= self.log_seconds:
            self._last_print = now
            print(self.line(s), file=self.stream, flush=True)

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
          "update": "updates, one per batch: the group's whole update (learners.push=update)",
          "allreduce": "weights, one push per batch of all groups: the groups average every minibatch among "
                       "themselves (learners.topology=allreduce)"}


def print_summary(s: dict[str, Any], stream: TextIO, rich_table: bool = False) -> None:
    """The end-of-run table: what happened and where the files are."""
    rows = [
        ("stopped because", str(s.get("stop_reason", "?"))),
        ("wall time", f"{_num(s.get('elapsed'), '.1f')} s"),
        ("environment steps", str(s.get("env_steps", 0))),
        ("episodes", str(s.get("episodes", 0))),
        (f"mean return (last {s.get('return_window', '?')})", _num(s.get("mean_return"), ".2f")),
        *([(f"evaluation return (v{s['eval_version']}, {s['eval_episodes']} greedy episodes)",
            f"{s['eval_return']:.2f} +- {s['eval_return_std']:.2f}")] if "eval_return" in s else []),
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
