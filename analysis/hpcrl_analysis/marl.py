"""Multi-agent runs (ippo, mappo, iql, vdn; MARLess, seed 001): policies per round, map changes, cost split.

MARLess Fig. 12 shape: per round, the policies in use (learner sharing), the map changes, the
active learner groups and active actors. Fig. 9 shape: learner vs actor cost, serverless (active
rank-seconds, per-function price) and serverful (allocated ranks x wall-clock); the numbers are
:func:`metrics.cost`'s, this module only regroups them.

The policies in use during round k follow from the config's starting map (``algo.policies``:
per_agent = agent j on slot j, shared = all on slot 0) and the ``policy_map`` rows of the rounds
before k: a row written at the end of round r takes effect in round r + 1. The same holds for actor
scaling (``algo.actor_scaling``): the active actors of round k are the ``actor_scaling`` row of round
k - 1 (all actor ranks in round 0); without that table they are the actors that delivered a fragment.
"""
from __future__ import annotations

import math

import numpy as np

from . import metrics as M
from .h5read import Run

MARL_ALGOS = ("ippo", "mappo", "iql", "vdn")


def algo_config(run: Run) -> dict:
    """The run's ``algo`` section (needs PyYAML; {} without it or without a config)."""
    try:
        import yaml
    except ImportError:
        return {}
    try:
        cfg = yaml.safe_load(run.attrs.get("config_yaml", "")) or {}
    except yaml.YAMLError:
        return {}
    return cfg.get("algo") or {}


def is_marl(run: Run) -> bool:
    return algo_config(run).get("name") in MARL_ALGOS or bool(run.rows("policy_map"))


def starting_map(run: Run) -> list[int]:
    algo = algo_config(run)
    pm = run.table("policy_map")
    agents = int(algo.get("agents") or (int(pm["agent"].max()) + 1 if run.rows("policy_map") else 0))
    return [0] * agents if algo.get("policies") == "shared" else list(range(agents))


def policy_rounds(run: Run) -> dict[str, np.ndarray]:
    """Per round of the ``rounds`` table: policies in use, agents remapped at its end, the switch's reason,
    active learner groups, active actors, learner and actor active seconds, mean episodic return."""
    r = run.table("rounds")
    keys = ("round", "policies", "changes", "reason", "active_groups", "active_actors", "learner_seconds",
            "actor_seconds", "reward_mean")
    if not r or not len(r["round"]):
        return {k: np.zeros(0) for k in keys}
    order = np.argsort(r["round"], kind="stable")
    rounds = r["round"][order].astype(np.int64)
    pm = run.table("policy_map")
    pm_round = pm["round"].astype(np.int64) if pm else np.zeros(0, np.int64)
    mapping = starting_map(run)
    out = {k: [] for k in keys}
    for k in rounds:
        out["policies"].append(len(set(mapping)) if mapping else -1)
        here = np.flatnonzero(pm_round == k)
        for i in here:  # in force from round k + 1
            if int(pm["agent"][i]) < len(mapping):
                mapping[int(pm["agent"][i])] = int(pm["new_policy"][i])
        out["changes"].append(len(here))
        reason = pm["reason"][here[0]] if len(here) else b""
        out["reason"].append(reason.decode() if isinstance(reason, bytes) else str(reason))
    out["round"] = rounds
    for k in ("active_groups", "active_actors", "learner_seconds", "actor_seconds", "reward_mean"):
        out[k] = r[k][order]
    scaled = scaled_actors(run, rounds)
    if scaled is not None:
        out["active_actors"] = scaled
    return {k: np.asarray(v) for k, v in out.items()}


def scaled_actors(run: Run, rounds: np.ndarray) -> np.ndarray | None:
    """Active actor ranks in force during each of ``rounds`` under actor scaling (None without actor_scaling rows):
    the count decided at the end of the round before, all actor ranks before the first decision."""
    sc = run.table("actor_scaling")
    if not run.rows("actor_scaling"):
        return None
    decided = dict(zip(sc["round"].astype(np.int64).tolist(), sc["active"].astype(np.int64).tolist()))
    count, out = M.ranks(run)["actor"], []
    for k in rounds.tolist():
        count = decided.get(k - 1, count)
        out.append(count)
    return np.asarray(out, dtype=np.int64)


def cost_split(run: Run, prices: dict) -> dict[str, float]:
    """Learner and actor cost, serverless and serverful (parameter rank apart), and learner/actor shares."""
    c = M.cost(run, prices)
    out = {f"{mode}_{role}": c[f"{mode}_{role}"] for mode in ("serverless", "serverful")
           for role in ("learner", "actor", "parameter")}
    for mode in ("serverless", "serverful"):
        total = out[f"{mode}_learner"] + out[f"{mode}_actor"]
        out[f"{mode}_learner_actor"] = total
        out[f"{mode}_learner_share"] = out[f"{mode}_learner"] / total if total > 0 else math.nan
    out["learner_seconds"], out["actor_seconds"] = c["learner_seconds"], c["actor_seconds"]
    out["learner_alloc_seconds"], out["actor_alloc_seconds"] = c["learner_alloc_seconds"], c["actor_alloc_seconds"]
    return out


MAX_ROWS = 30
"""Per-round rows summary.md shows in full; longer runs show the first, the last and those around a switch."""

CSV_COLUMNS = ("round", "policies", "changes", "active_groups", "active_actors", "learner_seconds", "actor_seconds",
               "reward_mean", "reason")


def shown_rounds(changes: np.ndarray) -> list[int]:
    """Row indices for summary.md: all of them up to MAX_ROWS, else the first, the last, each switch and the next."""
    n = len(changes)
    if n <= MAX_ROWS:
        return list(range(n))
    keep = {0, n - 1}
    for i in np.flatnonzero(changes > 0):
        keep.update((int(i), min(int(i) + 1, n - 1)))
    return sorted(keep)


def write_csv(run: Run, path) -> None:
    """Every round's policy_rounds row (CSV_COLUMNS)."""
    import csv

    p = policy_rounds(run)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for i in range(len(p["round"])):
            w.writerow([p[c][i] if c == "reason" else (int(p[c][i]) if p[c].dtype.kind in "iu" else
                        (f"{float(p[c][i]):.6g}" if math.isfinite(float(p[c][i])) else "")) for c in CSV_COLUMNS])


def _f(v: float) -> str:
    return "-" if not math.isfinite(v) else (f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}")


def markdown(runs: list[Run], prices: dict) -> str:
    """The MARL section of summary.md: cost split per run, then the per-round view per run ('' if no MARL run)."""
    labels = [r.label for r in runs]
    names = [r.label if labels.count(r.label) == 1 else f"{r.label} [{r.path.name}]" for r in runs]
    marl = [(r, n) for r, n in zip(runs, names) if is_marl(r)]
    if not marl:
        return ""
    cur = prices["currency"]
    lines = ["", "## Multi-agent runs: learner vs actor cost (MARLess Fig. 9 shape)", "",
             f"| run | learner serverless ({cur}) | actor serverless ({cur}) | learner serverful ({cur}) | "
             f"actor serverful ({cur}) | serverless / serverful | learner rank-s active / allocated | "
             "actor rank-s active / allocated |", "|---|---|---|---|---|---|---|---|"]
    for r, name in marl:
        s = cost_split(r, prices)
        ratio = s["serverless_learner_actor"] / s["serverful_learner_actor"] if s["serverful_learner_actor"] > 0 else math.nan
        lines.append(f"| {name} | {_f(s['serverless_learner'])} | {_f(s['serverless_actor'])} | "
                     f"{_f(s['serverful_learner'])} | {_f(s['serverful_actor'])} | {_f(ratio)} | "
                     f"{_f(s['learner_seconds'])} / {_f(s['learner_alloc_seconds'])} | "
                     f"{_f(s['actor_seconds'])} / {_f(s['actor_alloc_seconds'])} |")
    for r, name in marl:
        p = policy_rounds(r)
        switches = int((p["changes"] > 0).sum()) if len(p["changes"]) else 0
        lines += ["", f"### {name}: policies, map changes and active roles per round (MARLess Fig. 12 shape)", "",
                  f"{switches} sharing switches, {int(p['changes'].sum()) if len(p['changes']) else 0} agent "
                  "remappings (run.h5 policy_map); a switch at the end of round k holds from round k + 1."
                  + (f" Rounds shown: the first, the last, and those around a switch; all {len(p['round'])} are in "
                     "marl-rounds-*.csv." if len(p["round"]) > MAX_ROWS else "")
                  + (" Active actors: the actor_scaling decision of the round before." if r.rows("actor_scaling")
                     else " Active actors: those that delivered a fragment."), "",
                  "| round | policies | remapped at end | active learner groups | active actors | learner s | actor s | "
                  "mean return | switch |", "|---|---|---|---|---|---|---|---|---|"]
        actors_changed = np.r_[0, (np.diff(p["active_actors"]) != 0).astype(int)] if len(p["round"]) else p["changes"]
        for i in shown_rounds(p["changes"] + actors_changed):  # sharing switches and actor count changes
            lines.append(f"| {int(p['round'][i])} | {int(p['policies'][i])} | {int(p['changes'][i])} | "
                         f"{int(p['active_groups'][i])} | {int(p['active_actors'][i])} | "
                         f"{_f(float(p['learner_seconds'][i]))} | {_f(float(p['actor_seconds'][i]))} | "
                         f"{_f(float(p['reward_mean'][i]))} | {p['reason'][i]} |")
    return "\n".join(lines) + "\n"
