"""The figures, one function each, written as PNG; runs with the same label are one curve (mean, spread)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from . import marl as MA  # noqa: E402
from . import metrics as M  # noqa: E402
from .h5read import Run  # noqa: E402

DPI = 110
PHASES = (("sample", "sampling (actor)"), ("transport", "transport wait (actor)"),
          ("compute", "gradient compute (learner)"), ("mailbox", "mailbox wait (learner)"),
          ("queue", "admission queue (parameter)"), ("aggregate", "aggregation (parameter)"),
          ("publish", "weight publication (parameter)"))


def _groups(runs: list[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for r in runs:
        out.setdefault(r.label, []).append(r)
    return out


def names(runs: list[Run]) -> list[str]:
    """Run labels, made unique with the directory name where labels repeat."""
    count = {}
    for r in runs:
        count[r.label] = count.get(r.label, 0) + 1
    return [r.label if count[r.label] == 1 else f"{r.label} [{r.path.name}]" for r in runs]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} recorded", ha="center", va="center", transform=ax.transAxes, color="0.4")


def learning_curve(runs: list[Run], x: str, path: Path, window: int = 20) -> Path:
    """Smoothed episodic return vs wall-clock or env steps; band = min..max over runs of a label."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    drawn = False
    for label, group in _groups(runs).items():
        c = M.curves_on_grid(group, x, window=window)
        if not len(c["x"]):
            continue
        n = len(group)
        line, = ax.plot(c["x"], c["mean"], lw=1.8, label=f"{label} (mean of {n} runs)" if n > 1 else label)
        if n > 1:
            ax.fill_between(c["x"], c["min"], c["max"], color=line.get_color(), alpha=0.2, lw=0)
        if x == "time":  # evaluation episodes (greedy policy), where the runs have them
            for i, run in enumerate(group):
                ev = M.evaluations(run)
                if len(ev["mean"]):
                    ax.errorbar(ev["time"], ev["mean"], yerr=ev["std"], fmt="s", ms=3, capsize=2, lw=0.8,
                                color=line.get_color(), label=f"{label} evaluation (greedy)" if i == 0 else None)
        drawn = True
    if not drawn:
        _empty(ax, "episodes")
    ax.set_xlabel("wall-clock time since start (s)" if x == "time" else "environment steps")
    ax.set_ylabel(f"episodic return (mean of last {window})")
    ax.set_title("Learning curve vs " + ("wall-clock time" if x == "time" else "environment steps")
                 + (" (band: min-max across runs)" if any(len(g) > 1 for g in _groups(runs).values()) else ""))
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    if x == "env_steps":  # 150k, 1.2M: readable without an offset label in the corner
        ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
    return _save(fig, path)


def arms(groups: dict[str, list[Run]], x: str, path: Path, window: int = 20) -> Path:
    """A sweep's arms: mean +- std over each arm's seeds of the smoothed return against ``x`` ('env_steps' or
    'time')."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for arm, runs in groups.items():
        c = M.curves_on_grid(runs, x, window=window)
        if not runs or not len(c["x"]):
            continue
        line, = ax.plot(c["x"], c["mean"], lw=1.8, label=f"{arm} ({len(runs)} seeds)")
        if len(runs) > 1:
            ax.fill_between(c["x"], c["mean"] - c["std"], c["mean"] + c["std"], color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel("environment steps" if x == "env_steps" else "time since start (s; virtual for a simulated run)")
    ax.set_ylabel(f"episodic return (mean of last {window})")
    ax.set_title("Arms: mean +- std over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _pmf_bars(ax, series: list[tuple[str, np.ndarray]]) -> None:
    """Side-by-side bars of the fraction of each integer staleness value, one colour per series."""
    top = max(int(s.max()) for _, s in series)
    values = np.arange(0, top + 1)
    width = 0.8 / len(series)
    for i, (name, s) in enumerate(series):
        pmf = np.bincount(s.clip(min=0), minlength=len(values))[: len(values)] / len(s)
        ax.bar(values - 0.4 + width * (i + 0.5), pmf, width=width, label=name)
    ax.set_xticks(values)
    ax.legend(fontsize=8)


def staleness(runs: list[Run], path: Path) -> Path:
    """Left: distribution of admitted staleness per label. Right: per number of active learner groups."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = []
    for label, group in _groups(runs).items():
        s = np.concatenate([M.admitted_staleness(r)["staleness"] for r in group])
        if len(s):
            series.append((f"{label} ({len(s)} gradients)", s))
    if series:
        _pmf_bars(a1, series)
    else:
        _empty(a1, "admitted gradients")
    a1.set_title("Admitted staleness distribution")
    per = {}
    for r in runs:
        d = M.admitted_staleness(r)
        for k in np.unique(d["active_groups"]):
            per.setdefault(int(k), []).append(d["staleness"][d["active_groups"] == k])
    if per:
        series = []
        for k in sorted(per):
            s = np.concatenate(per[k])
            series.append((f"{k} active group{'s' if k != 1 else ''} ({len(s)})" if k >= 0 else f"unknown ({len(s)})", s))
        _pmf_bars(a2, series)
    else:
        _empty(a2, "admitted gradients")
    a2.set_title("Admitted staleness by active learner groups (all runs)")
    for ax in (a1, a2):
        ax.set_xlabel("staleness (policy versions)")
        ax.set_ylabel("fraction of admitted gradients")
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def threshold(runs: list[Run], path: Path, prices: dict) -> Path:
    """beta_k per round (Stellaris Eq. 3) per label, with the mean admitted staleness of each round."""
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    drawn = False
    for label, group in _groups(runs).items():
        prs = [M.per_round(r, prices) for r in group]
        prs = [p for p in prs if len(p["round_id"])]
        if not prs:
            continue
        drawn = True
        p0 = prs[0]
        x = np.append(p0["round_id"], p0["round_id"][-1] + 1)
        line, = ax.step(x, np.append(p0["threshold"], p0["threshold"][-1]), where="post", lw=2,
                        label=rf"{label}: threshold $\beta_k$")
        for i, p in enumerate(prs):
            ax.plot(p["round_id"] + 0.5, p["staleness_mean"], "o", ms=4, color=line.get_color(), alpha=0.8,
                    label=f"{label}: mean admitted staleness" if i == 0 else None)
    if drawn:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        _empty(ax, "rounds")
    ax.set_xlabel("round k")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("staleness (policy versions)")
    ax.set_title(r"Staleness threshold $\beta_k$ and mean admitted staleness per round" "\n"
                 "(no line: no threshold, e.g. round 0 or pure async;\n"
                 "points above the line: the queue was applied once every active group was in it)", fontsize=9)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def gradients(runs: list[Run], path: Path) -> Path:
    """Per run: gradients per round by outcome (admitted or why not), and the admission queue wait."""
    shown = runs[:6]
    fig, axes = plt.subplots(len(shown), 2, figsize=(11, 2.8 * len(shown) + 0.6), squeeze=False,
                             gridspec_kw={"width_ratios": [1.6, 1]})
    for (ax, aq), r, title in zip(axes, shown, names(shown)):
        d = M.gradient_reasons_per_round(r)
        if not len(d["round"]):
            _empty(ax, "gradients")
        bottom = np.zeros(len(d["round"]))
        for reason in M.GRADIENT_REASONS:
            if reason in d and d[reason].sum():
                ax.bar(d["round"], d[reason], bottom=bottom, label=reason.replace("_", " "), width=0.8)
                bottom += d[reason]
        ax.set_ylabel("gradients")
        ax.set_xlabel("round k")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"{title}: gradients received per round, by outcome", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        if bottom.any():
            ax.legend(fontsize=8)
        g = r.table("gradients")
        q = M.finite(g["queue_seconds"]) if g else np.zeros(0)
        if len(q):
            aq.hist(q * 1e3, bins=30, color="tab:purple")
            aq.axvline(np.median(q) * 1e3, color="k", ls="--", lw=1, label=f"median {np.median(q) * 1e3:.3g} ms")
            aq.legend(fontsize=8)
        else:
            _empty(aq, "queue waits")
        aq.set_xlabel("time in the admission queue (ms)")
        aq.set_ylabel("gradients")
        aq.set_title("admission queue wait", fontsize=10)
        aq.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def elasticity(runs: list[Run], path: Path) -> Path:
    """Active learner groups (at each update) with every activation (^) and park (v) the parameter rank
    decided, labelled with the load that triggered it (MARL policy learners: with the policy change);
    active actors (per round) below."""
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9.5, 5.5), sharex=True)
    marked = set()
    for i, (r, name) in enumerate(zip(runs, names(runs))):
        e = M.elasticity(r)
        color = f"C{i % 10}"
        if len(e["time"]):
            a1.step(e["time"], e["active_groups"], where="post", label=name, color=color)
        ev = M.elastic_events(r)
        for action, marker, edge in (("activate", "^", "tab:green"), ("park", "v", "tab:red")):
            sel = ev["action"] == action
            if sel.any():
                a1.scatter(ev["time"][sel], ev["active_groups"][sel], marker=marker, s=60, color=color, edgecolors=edge,
                           linewidths=1.5, zorder=3, label=f"{action} (load = supply / capacity, or why)" if action not in marked else None)
                marked.add(action)
                for t, y, load, why in zip(ev["time"][sel], ev["active_groups"][sel], ev["load"][sel], ev["reason"][sel]):
                    label = f"{load:.2g}" if np.isfinite(load) else str(why).replace("_", " ")
                    a1.annotate(label, (t, y), textcoords="offset points", xytext=(4, 6 if action == "activate" else -12),
                                fontsize=7, color=edge)
        if len(e["actor_time"]):  # per round: jumpy when a round is shorter than a fragment
            a2.step(e["actor_time"], e["active_actors"], where="post", color=color, lw=0.8, alpha=0.8)
    for ax, what in ((a1, "active learner groups"), (a2, "active actors")):
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
        ax.yaxis.get_major_locator().set_params(integer=True)
        top = max((float(np.nanmax(line.get_ydata())) for line in ax.get_lines() if len(line.get_ydata())), default=1.0)
        ax.set_ylim(0, top + 0.5)
        if not ax.get_lines():
            _empty(ax, what)
    if a1.get_lines():  # one legend for both panels, outside the data
        a1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    a1.set_title("Elasticity: active learner groups and actors over time")
    a2.set_xlabel("wall-clock time since start (s)")
    return _save(fig, path)


def cost(runs: list[Run], path: Path, prices: dict) -> Path:
    """Left: total cost serverless vs serverful, stacked by role. Right: cumulative Stellaris per-round cost."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 1.2 + 0.9 * len(runs) + 2.4), gridspec_kw={"width_ratios": [1.3, 1]})
    cur = prices["currency"]
    colors = {"learner": "0.55", "parameter": "tab:orange", "actor": "tab:blue"}
    ticks, y = [], 0
    for r, name in zip(runs, names(runs)):
        c = M.cost(r, prices)
        for mode in ("serverless", "serverful"):
            left = 0.0
            for role in ("learner", "parameter", "actor"):
                v = c[f"{mode}_{role}"]
                a1.barh(y, v, left=left, color=colors[role], label=f"{role} ranks" if y == 0 else None, height=0.7)
                left += v
            a1.text(left, y, f" {left:.3g}", va="center", fontsize=7)
            ticks.append((y, f"{name}\n{mode}"))
            y += 1
        y += 0.5
    a1.set_yticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=7)
    a1.invert_yaxis()
    a1.set_xlabel(f"cost ({cur})")
    a1.set_title("Training cost: active seconds (serverless)\nvs whole allocation (serverful)", fontsize=10)
    a1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    a1.grid(alpha=0.3, axis="x")
    a1.margins(x=0.15)
    for r, name in zip(runs, names(runs)):
        pr = M.per_round(r, prices)
        if len(pr["cost"]):
            a2.plot(pr["round_id"], np.nancumsum(pr["cost"]), marker=".", label=name)
    if a2.get_lines():
        a2.legend(fontsize=8)
    else:
        _empty(a2, "rounds")
    a2.set_xlabel("round k")
    a2.xaxis.get_major_locator().set_params(integer=True)
    a2.set_ylabel(f"cumulative cost ({cur})")
    a2.set_title("Stellaris per-round cost (cumulative):\nround duration x (learner + actor price)", fontsize=10)
    a2.grid(alpha=0.3)
    return _save(fig, path)


def latency(runs: list[Run], path: Path, prices: dict) -> Path:
    """Per round, stacked mean seconds per event: left the whole loop (actor, learner, parameter), right the
    learner group's cycle per gradient by phase (learner_cycles); one row of panels per run."""
    shown = runs[:6]
    fig, axes = plt.subplots(len(shown), 2, figsize=(15, 2.8 * len(shown) + 0.8), squeeze=False)
    for (ax, ac), r, name in zip(axes, shown, names(shown)):
        pr = M.per_round(r, prices)
        for a, phases, scale in ((ax, PHASES, 1.0), (ac, [(f"cycle_{p}", p) for p in M.LEARNER_PHASES], 1e3)):
            bottom = np.zeros(len(pr["round_id"]))
            for i, (key, phase) in enumerate(phases):
                v = np.nan_to_num(pr[key]) * scale
                a.bar(pr["round_id"], v, bottom=bottom, label=phase, width=0.8, color=_phase_color(i))
                bottom += v
            a.grid(alpha=0.3, axis="y")
            a.xaxis.get_major_locator().set_params(integer=True)
        if not len(pr["round_id"]):
            _empty(ax, "rounds")
        if not r.rows("learner_cycles"):
            _empty(ac, "learner cycles")
        ax.set_ylabel("seconds per event")
        ax.set_title(f"{name}: latency breakdown per round (mean per fragment / gradient / update)", fontsize=10)
        ac.set_ylabel("ms per gradient")
        ac.set_title(f"{name}: learner cycle per gradient, by phase", fontsize=10)
    axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[0, 1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for a in axes[-1]:
        a.set_xlabel("round k")
    return _save(fig, path)


def _phase_color(i: int):
    return plt.get_cmap("tab20")(i % 20)


def multi_agent(runs: list[Run], path: Path, prices: dict) -> Path:
    """MARL runs. Left (MARLess Fig. 12 shape): policies in use, active learner groups and active actors per
    round, map changes marked. Right (Fig. 9 shape): learner vs actor cost, serverless and serverful."""
    marl = [(r, n) for r, n in zip(runs, names(runs)) if MA.is_marl(r)]
    fig = plt.figure(figsize=(12.5, 5.2))
    grid = fig.add_gridspec(2, 2, width_ratios=[1.5, 1])
    a1, a2, a3 = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[:, 1])
    for i, (r, name) in enumerate(marl):
        p, color = MA.policy_rounds(r), f"C{i % 10}"
        if not len(p["round"]):
            continue
        a1.step(p["round"], p["policies"], where="post", color=color, label=name)
        switch = p["changes"] > 0
        a1.plot(p["round"][switch] + 1, p["policies"][np.minimum(np.flatnonzero(switch) + 1, len(switch) - 1)],
                "v", color=color, ms=6)
        a2.step(p["round"], p["active_groups"], where="post", color=color, ls="--")
        a2.step(p["round"], p["active_actors"], where="post", color=color)
    a1.set_ylabel("policies in use")
    a1.set_title("Policies (v: a sharing switch takes effect), active learner groups (--) and actors (-)",
                 fontsize=10)
    a2.set_ylabel("active ranks")
    a2.set_xlabel("round k")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if not ax.get_lines():
            _empty(ax, "multi-agent rounds")
    if a1.get_lines():
        a1.legend(fontsize=8)
    ticks = []
    for j, (r, name) in enumerate(marl):
        c = MA.cost_split(r, prices)
        for m, mode in enumerate(("serverless", "serverful")):
            y = 2.5 * j + m
            a3.barh(y, c[f"{mode}_learner"], color="0.55", height=0.7, label="learner ranks" if y == 0 else None)
            a3.barh(y, c[f"{mode}_actor"], left=c[f"{mode}_learner"], color="tab:blue", height=0.7,
                    label="actor ranks" if y == 0 else None)
            a3.text(c[f"{mode}_learner_actor"], y, f" {c[f'{mode}_learner_actor']:.3g}", va="center", fontsize=7)
            ticks.append((y, f"{name}\n{mode}"))
    a3.set_yticks([t for t, _ in ticks], [n for _, n in ticks], fontsize=7)
    a3.invert_yaxis()
    a3.set_xlabel(f"cost ({prices['currency']})")
    a3.set_title("Learner vs actor cost: active rank-seconds\n(serverless) vs allocation (serverful)", fontsize=10)
    a3.grid(alpha=0.3, axis="x")
    a3.margins(x=0.2)
    if ticks:
        a3.legend(fontsize=8, loc="lower right")
    else:
        _empty(a3, "multi-agent runs")
    return _save(fig, path)


def all_figures(runs: list[Run], out: Path, prices: dict) -> dict[str, Path]:
    """Every figure into out/; returns name -> path in report order."""
    out.mkdir(parents=True, exist_ok=True)
    marl = {"multi-agent: policies, active roles and cost split": multi_agent(runs, out / "marl.png", prices)} \
        if any(MA.is_marl(r) for r in runs) else {}
    return {
        "learning curve (wall-clock)": learning_curve(runs, "time", out / "learning_wallclock.png"),
        "learning curve (env steps)": learning_curve(runs, "env_steps", out / "learning_envsteps.png"),
        "staleness": staleness(runs, out / "staleness.png"),
        "threshold": threshold(runs, out / "threshold.png", prices),
        "gradients": gradients(runs, out / "gradients.png"),
        "elasticity": elasticity(runs, out / "elasticity.png"),
        "cost": cost(runs, out / "cost.png", prices),
        "latency": latency(runs, out / "latency.png", prices),
        **marl,
    }
