"""Numbers derived from a run's tables: learning curves, staleness, elasticity, cost, per-round rows.

Every function takes a :class:`h5read.Run` (numpy arrays) and returns numpy arrays or dicts;
plots and files are made elsewhere. Round windows are [start, start + duration) from the
``rounds`` table; events (episodes, fragments, learner stretches) are assigned to a round by
their time, the first window open to the left. Gradients carry their round.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from . import billing
from .h5read import Run

GRADIENT_REASONS = ("admitted", "too_stale", "nonfinite", "shutdown", "inactive_group")
LEARNER_PHASES = ("idle", "receive", "prepare", "minibatch", "control", "weights", "window", "gradient",
                  "flatten", "allreduce", "push", "push_wait")
"""Phases of the learner_cycles table (hpcrl.runtime.record.cycle_profile; this folder never imports hpcrl)."""
ELASTIC_ACTIONS = ("activate", "park", "parked", "joined", "left", "join_given_up")
ELASTIC_REASONS = ("supply_above_capacity", "supply_below_capacity", "woken", "stopped", "policies_merged",
                   "policies_split", "job_step", "join_ended", "join_timeout", "scheduled")
"""Codes of the elastic_events table (hpcrl.io.schema)."""

# Stellaris (SC'24) Section VIII-A footnote: AWS us-east-2 hourly prices; 4 learner functions per V100.
DEFAULT_PRICES = {
    "currency": "USD",
    "source": "Stellaris SC'24, Sec. VIII-A footnote: AWS us-east-2 hourly prices; 4 learner functions per GPU",
    "learner": {"instance": "p3.2xlarge", "instance_per_hour": 3.06, "units_per_instance": 1,
                "unit": "V100 GPU", "functions_per_unit": 4},
    "parameter": {"instance": "p3.2xlarge", "instance_per_hour": 3.06, "units_per_instance": 1,
                  "unit": "V100 GPU", "functions_per_unit": 4},
    "actor": {"instance": "c6a.32xlarge", "instance_per_hour": 4.896, "units_per_instance": 128,
              "unit": "vCPU", "functions_per_unit": 1},
}
# the footnote's other instances (USD/h): p3.16xlarge 24.48 (8 V100), hpc7a.96xlarge 7.2 (192 cores)


def load_prices(path: str | Path | None) -> dict:
    """The price table: defaults, overridden key by key by a JSON file (see prices.json)."""
    prices = json.loads(json.dumps(DEFAULT_PRICES))
    if path is None:
        return prices
    data = json.loads(Path(path).read_text())
    for role in ("learner", "parameter", "actor"):
        prices[role].update(data.get(role, {}))
    for key in ("currency", "source"):
        if key in data:
            prices[key] = data[key]
    return prices


def unit_price_per_second(prices: dict, role: str, serverless: bool) -> float:
    """Price of one rank of a role for one second; serverless divides by functions per unit."""
    p = prices[role]
    per_unit = float(p["instance_per_hour"]) / float(p["units_per_instance"]) / 3600.0
    return per_unit / float(p.get("functions_per_unit", 1)) if serverless else per_unit


def finite(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a[np.isfinite(a)]


def stats(a) -> dict[str, float]:
    a = finite(a)
    if not a.size:
        return {"max": math.nan, "mean": math.nan, "min": math.nan, "std": math.nan}
    return {"max": float(a.max()), "mean": float(a.mean()), "min": float(a.min()), "std": float(a.std())}


# ---- layout of the job ----------------------------------------------------------------------

def ranks(run: Run) -> dict[str, int]:
    """Ranks per role and learner ranks per group, from the rank map."""
    rm = run.table("rank_map")
    role = rm.get("role", np.zeros(0, int))
    learners = int((role == 1).sum())
    groups = len(set(rm["group"][role == 1].tolist())) if learners else 0
    return {"parameter": int((role == 0).sum()), "learner": learners, "actor": int((role == 2).sum()),
            "groups": groups, "ranks_per_group": learners // groups if groups else 1}


def job_starts(run: Run) -> np.ndarray:
    """Seconds from the run's start at which each of its jobs began: 0, then each resume (run.h5's
    ``resumed_unix`` against ``start_unix``)."""
    resumed = np.atleast_1d(np.asarray(run.attrs.get("resumed_unix", []), dtype=np.float64))
    start = float(run.attrs.get("start_unix", math.nan))
    if not resumed.size or not math.isfinite(start):
        return np.zeros(1)
    return np.concatenate([[0.0], np.sort(resumed) - start])


def row_times(run: Run) -> np.ndarray:
    """Every time the record holds (seconds from the run's start): rows of the timed tables and round ends."""
    parts = [finite(run.table(name).get(col, [])) for name, col in (
        ("updates", "time"), ("gradients", "time"), ("episodes", "time"), ("learner_activity", "time_end"),
        ("actors", "time"))]
    r = run.table("rounds")
    if r.get("start") is not None and len(r["start"]):
        parts.append(finite(r["start"] + r["duration"]))
    return np.concatenate(parts) if parts else np.zeros(0)


def wall_seconds(run: Run) -> float:
    """Seconds the run's jobs ran: for each job (the first and every resume), from its start to the last row it
    recorded. The time between a job's end and the next resume does not count: the run summary's wall time
    (the jobs' training time, carried from checkpoint to checkpoint) counts the same."""
    times, starts = row_times(run), job_starts(run)
    ends = np.append(starts[1:], np.inf)
    total = 0.0
    for start, end in zip(starts, ends):
        mine = times[(times >= start) & (times < end)]
        if mine.size:
            total += float(mine.max()) - start
    return total


def env_steps(run: Run) -> int:
    """Env steps the run sampled, as the run summary counts them: the actors' fragments (``actors`` rows), or the
    fused loop's (``rounds`` env_steps_total, it has no actor rows); else the last episode's ``env_steps``."""
    steps = run.table("actors").get("steps")
    if steps is not None and len(steps):
        return int(np.sum(steps))
    total = finite(run.table("rounds").get("env_steps_total", []))
    if total.size:
        return int(total.max())
    ep = episode_axes(run)["env_steps"]
    return int(ep[-1]) if len(ep) else 0


# ---- learning curves -------------------------------------------------------------------------

def episode_axes(run: Run) -> dict[str, np.ndarray]:
    """Episodes sorted by time: time (s), env_steps (run total; cumulative lengths if unknown), return."""
    ep = run.table("episodes")
    order = np.argsort(ep["time"], kind="stable")
    steps = ep["env_steps"][order].astype(np.float64)
    if not len(steps) or (steps < 0).any():
        steps = np.cumsum(ep["length"][order]).astype(np.float64)  # steps of finished episodes: a lower bound
    return {"time": ep["time"][order].astype(np.float64), "env_steps": steps,
            "return": ep["return"][order].astype(np.float64)}


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` values (fewer at the start)."""
    if not len(y):
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    n = np.arange(1, len(y) + 1)
    lo = np.maximum(0, n - window)
    return (c[n] - c[lo]) / (n - lo)


def curves_on_grid(runs: list[Run], x: str, points: int = 200, window: int = 20) -> dict[str, np.ndarray]:
    """Smoothed return of each run on a common grid of x ('time' or 'env_steps'): mean, min, max, std.

    Each run contributes from its first to its last episode (no extrapolation); the mean at a
    grid point is over the runs that cover it (`count`).
    """
    series = []
    for run in runs:
        ax = episode_axes(run)
        if len(ax["return"]):
            series.append((ax[x], smooth(ax["return"], window)))
    if not series:
        return {"x": np.zeros(0), "mean": np.zeros(0), "min": np.zeros(0), "max": np.zeros(0),
                "std": np.zeros(0), "count": np.zeros(0, int)}
    hi = max(float(s[0][-1]) for s in series)
    lo = min(float(s[0][0]) for s in series)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    ys = np.full((len(series), len(grid)), np.nan)
    for i, (xs, y) in enumerate(series):
        idx = np.searchsorted(xs, grid, side="right") - 1  # last episode at or before the grid point
        ok = (idx >= 0) & (grid <= xs[-1])
        ys[i, ok] = y[idx[ok]]
    count = np.isfinite(ys).sum(axis=0)
    with np.errstate(all="ignore"):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return {"x": grid, "mean": np.nanmean(ys, axis=0), "min": np.nanmin(ys, axis=0),
                    "max": np.nanmax(ys, axis=0), "std": np.nanstd(ys, axis=0), "count": count}


# ---- staleness -------------------------------------------------------------------------------

def admitted_staleness(run: Run) -> dict[str, np.ndarray]:
    """Staleness of admitted gradients and the active learner groups when each was applied."""
    g, up = run.table("gradients"), run.table("updates")
    if not g or not len(g["time"]):
        return {"staleness": np.zeros(0, int), "active_groups": np.zeros(0, int)}
    ok = g["admitted"] == 1
    applied = g["time"][ok] + np.nan_to_num(g["queue_seconds"][ok].astype(np.float64))
    if up and len(up["time"]):
        order = np.argsort(up["time"], kind="stable")
        t, active = up["time"][order], up["active_groups"][order]
        idx = np.clip(np.searchsorted(t, applied - 1e-9, side="left"), 0, len(t) - 1)
        groups = active[idx]
    else:
        groups = np.full(int(ok.sum()), -1)
    return {"staleness": g["staleness"][ok].astype(int), "active_groups": groups.astype(int)}


def gradient_reasons_per_round(run: Run) -> dict[str, np.ndarray]:
    """Counts of gradients per round and reason code: {'round': [...], reason_name: [...]}."""
    g = run.table("gradients")
    if not g or not len(g["time"]):
        return {"round": np.zeros(0, int)}
    rounds = np.unique(g["round"])
    out = {"round": rounds}
    for code, name in enumerate(GRADIENT_REASONS):
        out[name] = np.array([int(((g["round"] == r) & (g["reason"] == code)).sum()) for r in rounds])
    return out


# ---- per-round rows (the Stellaris artifact CSV) ---------------------------------------------

CSV_COLUMNS = ("round_id", "duration", "actors", "episodes", "learner_time", "actor_time",
               "reward_max", "reward_mean", "reward_min", "reward_std",
               "staleness_max", "staleness_mean", "staleness_min", "staleness_std", "loss", "cost", "threshold")


def round_windows(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(round ids, starts, ends) sorted by start."""
    r = run.table("rounds")
    if not r or not len(r["round"]):
        return np.zeros(0, int), np.zeros(0), np.zeros(0)
    order = np.argsort(r["start"], kind="stable")
    start = r["start"][order].astype(np.float64)
    return r["round"][order], start, start + r["duration"][order].astype(np.float64)


def assign_rounds(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index of the round window each time falls in (first window open to the left); -1 after the last."""
    if not len(starts):
        return np.full(len(times), -1)
    idx = np.searchsorted(starts, times, side="right") - 1
    idx = np.maximum(idx, 0)
    idx[times >= ends[-1]] = -1
    return idx


def _last(values: np.ndarray) -> float:
    return float(values[-1]) if len(values) else math.nan


def per_round(run: Run, prices: dict) -> dict[str, np.ndarray]:
    """Cached :func:`compute_per_round` (figures and tables ask for it many times)."""
    key = ("per_round", json.dumps(prices, sort_keys=True))
    if key not in run.cache:
        run.cache[key] = compute_per_round(run, prices)
    return run.cache[key]


def compute_per_round(run: Run, prices: dict) -> dict[str, np.ndarray]:
    """The Stellaris artifact's per-round columns (CSV_COLUMNS), plus active_groups and latency parts.

    cost = duration x (active learner ranks x serverless learner price + active actors x actor price),
    the Stellaris cost model (DESIGN.md section 4), in the price table's currency.
    """
    ids, starts, ends = round_windows(run)
    n = len(ids)
    r = run.table("rounds")
    order = np.argsort(r["start"], kind="stable") if n else np.zeros(0, int)
    ep, la, ac, g, up = (run.table(k) for k in ("episodes", "learner_activity", "actors", "gradients", "updates"))
    ep_round = assign_rounds(ep["time"].astype(np.float64), starts, ends) if ep else np.zeros(0, int)
    la_round = assign_rounds(la["time_end"].astype(np.float64), starts, ends) if la else np.zeros(0, int)
    ac_round = assign_rounds(ac["time"].astype(np.float64), starts, ends) if ac else np.zeros(0, int)
    layout = ranks(run)
    out: dict[str, list] = {c: [] for c in CSV_COLUMNS}
    extra: dict[str, list] = {k: [] for k in ("active_groups", "start", "sample", "transport", "compute", "mailbox",
                                              "queue", "aggregate", "publish",
                                              *(f"cycle_{p}" for p in LEARNER_PHASES))}
    cy = run.table("learner_cycles")
    cy_round = assign_rounds(cy["time"].astype(np.float64), starts, ends) if cy else np.zeros(0, int)
    learner_fn = unit_price_per_second(prices, "learner", serverless=True)
    actor_unit = unit_price_per_second(prices, "actor", serverless=True)
    for i in range(n):
        k = int(ids[i])
        duration = float(ends[i] - starts[i])
        returns = ep["return"][ep_round == i] if ep else np.zeros(0)
        adm = (g["round"] == k) & (g["admitted"] == 1) if g else np.zeros(0, bool)
        st = stats(g["staleness"][adm]) if g else stats([])
        rst = stats(returns)
        in_ac = ac_round == i
        actors = int(r["active_actors"][order][i]) if r["active_actors"][order][i] >= 0 else (
            len(np.unique(ac["actor"][in_ac])) if ac else 0)
        groups = int(r["active_groups"][order][i]) if r["active_groups"][order][i] >= 0 else 1
        learner_time = float(np.nansum(la["compute_seconds"][la_round == i])) * layout["ranks_per_group"] if la else 0.0
        actor_time = float(np.nansum(ac["sample_seconds"][in_ac])) if ac and in_ac.any() else float(
            np.nan_to_num(r["actor_seconds"][order][i]))
        loss = float(r["loss"][order][i]) if math.isfinite(r["loss"][order][i]) else (
            float(np.nanmean(g["loss"][adm])) if g and adm.any() else math.nan)
        cost = duration * (groups * layout["ranks_per_group"] * learner_fn + actors * actor_unit)
        row = {"round_id": k, "duration": duration, "actors": actors, "episodes": int(len(returns)),
               "learner_time": learner_time, "actor_time": actor_time,
               "reward_max": rst["max"], "reward_mean": rst["mean"], "reward_min": rst["min"], "reward_std": rst["std"],
               "staleness_max": st["max"], "staleness_mean": st["mean"], "staleness_min": st["min"],
               "staleness_std": st["std"], "loss": loss, "cost": cost, "threshold": float(r["threshold"][order][i])}
        for c in CSV_COLUMNS:
            out[c].append(row[c])
        in_up = (up["round"] == k) if up else np.zeros(0, bool)
        gr = (g["round"] == k) if g else np.zeros(0, bool)

        def mean(table, mask, col):
            return float(np.nanmean(table[col][mask])) if table and mask.any() and np.isfinite(table[col][mask]).any() else 0.0
        extra["active_groups"].append(groups)
        extra["start"].append(float(starts[i]))
        extra["sample"].append(mean(ac, in_ac, "sample_seconds"))
        extra["transport"].append(mean(ac, in_ac, "transport_wait_seconds"))
        extra["compute"].append(mean(g, gr, "compute_seconds"))
        extra["mailbox"].append(mean(g, gr, "mailbox_wait_seconds"))
        extra["queue"].append(mean(g, gr, "queue_seconds"))
        extra["aggregate"].append(mean(up, in_up, "aggregate_seconds"))
        extra["publish"].append(mean(up, in_up, "publish_seconds"))
        in_cy = cy_round == i
        for p in LEARNER_PHASES:
            extra[f"cycle_{p}"].append(mean(cy, in_cy, f"{p}_seconds"))
    return {k: np.asarray(v) for k, v in {**out, **extra}.items()}


# ---- cost ------------------------------------------------------------------------------------

def cost(run: Run, prices: dict) -> dict[str, float]:
    """Rank-seconds and their price, serverless (active seconds only) and serverful (whole allocation).

    serverless: learner compute seconds x ranks per group, actor sampling seconds, parameter
    aggregate + publish seconds, each at the per-function price (instance price / units /
    functions per unit). serverful: wall time x every rank of each role at the per-unit price.
    """
    layout = ranks(run)
    wall = wall_seconds(run)
    la, ac, up = run.table("learner_activity"), run.table("actors"), run.table("updates")
    learner_s = float(np.nansum(la["compute_seconds"])) * layout["ranks_per_group"] if la else 0.0
    if ac and len(ac["time"]):
        actor_s = float(np.nansum(ac["sample_seconds"]))
    else:
        actor_s = float(np.nansum(run.table("rounds").get("actor_seconds", np.zeros(0))))
    param_s = float(np.nansum(up["aggregate_seconds"]) + np.nansum(up["publish_seconds"])) if up else 0.0
    sl = {role: unit_price_per_second(prices, role, True) for role in ("learner", "actor", "parameter")}
    sf = {role: unit_price_per_second(prices, role, False) for role in ("learner", "actor", "parameter")}
    return {
        "wall_seconds": wall,
        "learner_seconds": learner_s, "actor_seconds": actor_s, "parameter_seconds": param_s,
        "serverless_learner": learner_s * sl["learner"], "serverless_actor": actor_s * sl["actor"],
        "serverless_parameter": param_s * sl["parameter"],
        "serverful_learner": wall * layout["learner"] * sf["learner"], "serverful_actor": wall * layout["actor"] * sf["actor"],
        "serverful_parameter": wall * layout["parameter"] * sf["parameter"],
        "learner_alloc_seconds": wall * layout["learner"], "actor_alloc_seconds": wall * layout["actor"],
    }


def elasticity(run: Run) -> dict[str, np.ndarray]:
    """Active learner groups at every update, and active actors per round (or per 1-s bin of fragments).

    Values the writer did not record (-1) are left out; empty arrays when nothing was recorded.
    """
    up = run.table("updates")
    t, g = (up["time"], up["active_groups"]) if up else (np.zeros(0), np.zeros(0, int))
    out = {"time": t[g >= 0], "active_groups": g[g >= 0]}
    ids, starts, ends = round_windows(run)
    r = run.table("rounds")
    ac = run.table("actors")
    if len(ids) and (r["active_actors"] >= 0).any():
        order = np.argsort(r["start"], kind="stable")
        a = r["active_actors"][order]
        out["actor_time"], out["active_actors"] = starts[a >= 0], a[a >= 0]
    elif ac and len(ac["time"]):
        edges = np.arange(0.0, float(ac["time"].max()) + 1.0, 1.0)
        bins = np.digitize(ac["time"], edges) - 1
        out["actor_time"] = edges
        out["active_actors"] = np.array([len(np.unique(ac["actor"][bins == b])) for b in range(len(edges))])
    else:
        out["actor_time"], out["active_actors"] = np.zeros(0), np.zeros(0, int)
    return out


# ---- where the time goes: learner cycle, parameter rank load ------------------------------------

def learner_cycle(run: Run) -> dict[str, float]:
    """Mean seconds per gradient of the whole learner cycle (``cycle``) and of each phase; {} if not recorded."""
    cy = run.table("learner_cycles")
    if not cy or not len(cy["cycle_seconds"]):
        return {}
    out = {"gradients": float(len(cy["cycle_seconds"])), "cycle": float(np.nanmean(cy["cycle_seconds"]))}
    for p in LEARNER_PHASES:
        col = cy.get(f"{p}_seconds")
        out[p] = float(np.nanmean(col)) if col is not None and np.isfinite(col).any() else 0.0
    return out


def parameter_absorption(run: Run) -> dict[str, float]:
    """The parameter rank's capacity vs its load over the run: gradients per second of gradient work
    (absorption) and per wall second (arrival), the busy fraction, and the parameter count."""
    ld = run.table("parameter_load")
    out = {"absorption_rate": math.nan, "arrival_rate": math.nan, "busy_fraction": math.nan,
           "num_params": float(run.attrs.get("num_params", math.nan))}
    if not ld or not len(ld["time"]):
        return out
    n = float(np.nansum(ld["gradients"]))
    work = sum(float(np.nansum(ld[f"{p}_seconds"])) for p in ("receive", "admit", "apply", "publish"))
    wall = float(np.nansum(ld["interval_seconds"]))
    out["absorption_rate"] = n / work if n and work > 0 else math.nan
    out["arrival_rate"] = n / wall if wall > 0 else math.nan
    out["busy_fraction"] = 1.0 - float(np.nansum(ld["idle_seconds"])) / wall if wall > 0 else math.nan
    return out


def elastic_events(run: Run) -> dict[str, np.ndarray]:
    """The parameter rank's activations and parks (time, group, action name, reason name, load), time order,
    and the groups' parks (parked seconds, CPU seconds used while parked)."""
    ev = run.table("elastic_events")
    empty = {"time": np.zeros(0), "group": np.zeros(0, int), "action": np.zeros(0, "U8"), "reason": np.zeros(0, "U24"),
             "active_groups": np.zeros(0, int), "load": np.zeros(0)}
    if not ev or not len(ev["time"]):
        return {**empty, "parked_seconds": np.zeros(0), "cpu_seconds": np.zeros(0)}
    order = np.argsort(ev["time"], kind="stable")
    name = lambda codes, c: np.array([codes[i] if 0 <= i < len(codes) else str(i) for i in c])  # noqa: E731
    decided = ev["action"][order] != ELASTIC_ACTIONS.index("parked")
    parked = ~decided
    sel = order[decided]
    return {"time": ev["time"][sel], "group": ev["group"][sel], "action": name(ELASTIC_ACTIONS, ev["action"][sel]),
            "reason": name(ELASTIC_REASONS, ev["reason"][sel]), "active_groups": ev["active_groups"][sel],
            "load": ev["load"][sel], "parked_seconds": ev["parked_seconds"][order[parked]],
            "cpu_seconds": ev["cpu_seconds"][order[parked]]}


def evaluations(run: Run) -> dict[str, np.ndarray]:
    """One entry per evaluation (``eval_episodes`` grouped by the round it followed): round, time,
    policy_version and the return's mean, std, min, max over its episodes; empty without evaluations."""
    e = run.table("eval_episodes")
    keys = ("round", "time", "policy_version", "mean", "std", "min", "max")
    if not e or not len(e["round"]):
        return {k: np.zeros(0) for k in keys}
    rounds = np.unique(e["round"])
    out = {k: [] for k in keys}
    for k in rounds:
        sel = e["round"] == k
        r = e["return"][sel].astype(np.float64)
        for name, v in zip(keys, (k, e["time"][sel].max(), e["policy_version"][sel].max(), r.mean(), r.std(),
                                  r.min(), r.max())):
            out[name].append(v)
    return {k: np.asarray(v) for k, v in out.items()}


def summary(run: Run, prices: dict, window: int = 20) -> dict[str, object]:
    """One run's headline numbers (rows of the Markdown / HTML summary table)."""
    ax = episode_axes(run)
    g = run.table("gradients")
    c = cost(run, prices)
    st = admitted_staleness(run)["staleness"]
    pr = per_round(run, prices)
    rets = ax["return"]
    cyc, absorb, el = learner_cycle(run), parameter_absorption(run), elastic_events(run)
    bill = billing.billed(run)
    return {
        "run": run.label,
        "directory": str(run.path),
        "wall-clock (s)": c["wall_seconds"],
        "env steps": env_steps(run),
        "episodes": int(len(rets)),
        "rounds": int(len(pr["round_id"])),
        "updates": run.rows("updates"),
        f"final return (last {window} ep.)": float(rets[-window:].mean()) if len(rets) else math.nan,
        "best return": float(rets.max()) if len(rets) else math.nan,
        "last evaluation return (greedy)": _last(evaluations(run)["mean"]),
        "gradients admitted": int((g["admitted"] == 1).sum()) if g else 0,
        "gradients not admitted": int((g["admitted"] != 1).sum()) if g else 0,
        "mean admitted staleness": float(st.mean()) if len(st) else math.nan,
        "learner rank-seconds (active)": c["learner_seconds"],
        "actor rank-seconds (active)": c["actor_seconds"],
        f"cost serverless ({prices['currency']})": c["serverless_learner"] + c["serverless_actor"] + c["serverless_parameter"],
        f"cost serverful ({prices['currency']})": c["serverful_learner"] + c["serverful_actor"] + c["serverful_parameter"],
        f"cost Stellaris per-round sum ({prices['currency']})": float(np.nansum(pr["cost"])) if len(pr["cost"]) else 0.0,
        "billed node-seconds (sacct)": bill["node_seconds"] if bill["jobs"] else "-",
        "billed charge": (f"{bill['charge']:.4g} {bill['unit']}" if math.isfinite(bill["charge"]) else bill["note"]),
        "learner cycle (ms per gradient)": 1e3 * cyc.get("cycle", math.nan),
        "learner cycle, largest phases (ms)": ", ".join(
            f"{p} {1e3 * cyc[p]:.2g}" for p in sorted(LEARNER_PHASES, key=lambda q: -cyc[q])[:4]) if cyc else "-",
        "elastic activations / parks": f"{int((el['action'] == 'activate').sum())} / {int((el['action'] == 'park').sum())}",
        "parked learner CPU (% of parked time)": (100 * float(el["cpu_seconds"].sum() / el["parked_seconds"].sum())
                                                  if el["parked_seconds"].sum() > 0 else math.nan),
        "parameter absorption (gradients/s of work)": absorb["absorption_rate"],
        "gradient arrival (gradients/s)": absorb["arrival_rate"],
        # notes hold every table that was cut, had fill-value rows or was missing (h5read.load_run)
        "status": "; ".join(run.notes) or "complete tables",
    }
