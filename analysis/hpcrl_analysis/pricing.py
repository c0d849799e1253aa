"""MARLess (SoCC'25) pricing: serverless functions at AWS Lambda's prices against one serverful EC2 instance.

The paper's cost model (section 6.1): a serverless function costs its resources x invocation seconds at
AWS Lambda's dollar-per-resource-second price, pre-warm included and keep-alive not; a serverful baseline
costs "the smallest AWS EC2 instance that can accommodate the workload", a c6a.16xlarge in its
experiments, for the whole run. Here, per role (learner, actor, parameter rank as one function each):

- active seconds: the ones :func:`metrics.cost` charges serverless (learner compute x ranks per group,
  actor sampling, parameter aggregate + publish);
- pre-warm: every function once for the run's ``startup_seconds`` (run.h5: command to the first env
  step, the job's own cold start; 0 when the run has none), plus one request;
- requests: one per learner stretch (learner_activity rows), actor fragment (actors rows) and update
  (updates rows), each an invocation;
- serverless = (active + pre-warm seconds) x memory GB x price per GB-second + requests x price per
  request;
- serverful = wall-clock x the instance's hourly price / 3600 x instances, where instances = the fewest
  that hold every rank's vCPUs (a function's vCPUs = its memory / Lambda's 1.769 GB per vCPU).

The table is :data:`MARLESS_PRICES` (analysis/prices-marless.json is the same, to copy and edit).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from . import metrics as M
from .h5read import AnalysisError, Run

GB_PER_VCPU = 1.769
"""AWS Lambda gives a function one vCPU per 1,769 MB of memory."""

MARLESS_PRICES = {
    "currency": "USD",
    "source": "AWS Lambda list prices (us-east-1, x86): 0.0000166667 USD per GB-second, 0.20 USD per 1M requests; "
              "EC2 c6a.16xlarge on-demand (us-east-1, Linux) 2.448 USD/h; MARLess SoCC'25 section 6.1 "
              "(pre-warm charged, keep-alive not; functions of 1-2 CPUs)",
    "gb_second": 0.0000166667,
    "request": 0.0000002,
    "memory_gb": {"learner": 2 * GB_PER_VCPU, "actor": GB_PER_VCPU, "parameter": GB_PER_VCPU},
    "serverful": {"instance": "c6a.16xlarge", "instance_per_hour": 2.448, "vcpus": 64},
}
ROLES = ("learner", "actor", "parameter")


def load_marless_prices(path: str | Path | None) -> dict:
    """The MARLess table: defaults, overridden key by key (memory_gb and serverful entry by entry) by a JSON file."""
    prices = json.loads(json.dumps(MARLESS_PRICES))
    if path is None:
        return prices
    data = json.loads(Path(path).read_text())
    unknown = sorted(set(data) - set(prices))
    if unknown:
        raise AnalysisError(f"{path}: unknown key {unknown[0]!r} in a MARLess price table; allowed: {', '.join(prices)}")
    for key, value in data.items():
        if isinstance(prices[key], dict):
            prices[key].update(value)
        else:
            prices[key] = value
    return prices


def requests(run: Run) -> dict[str, int]:
    """Invocations per role: learner stretches, actor fragments, parameter updates."""
    return {"learner": run.rows("learner_activity"), "actor": run.rows("actors"), "parameter": run.rows("updates")}


def marless_cost(run: Run, prices: dict) -> dict[str, float]:
    """Serverless cost per role (with its pre-warm and request parts), the serverful instance's, and both ratios."""
    seconds = M.cost(run, M.DEFAULT_PRICES)
    layout = M.ranks(run)
    functions = {role: layout[role] for role in ROLES}
    prewarm = float(run.attrs.get("startup_seconds", 0.0) or 0.0)
    if not math.isfinite(prewarm):
        prewarm = 0.0
    calls = requests(run)
    out: dict[str, float] = {"prewarm_seconds": prewarm}
    for role in ROLES:
        gb = float(prices["memory_gb"][role])
        active = seconds[f"{role}_seconds"] * gb * prices["gb_second"]
        warm = functions[role] * (prewarm * gb * prices["gb_second"] + prices["request"])
        out[f"serverless_{role}"] = active + warm + calls[role] * prices["request"]
        out[f"prewarm_{role}"] = warm
        out[f"requests_{role}"] = calls[role] + functions[role]
    out["serverless"] = sum(out[f"serverless_{role}"] for role in ROLES)
    sf = prices["serverful"]
    vcpus = sum(functions[role] * float(prices["memory_gb"][role]) / GB_PER_VCPU for role in ROLES)
    out["instances"] = float(max(1, math.ceil(vcpus / float(sf["vcpus"]) - 1e-9)))
    out["serverful"] = seconds["wall_seconds"] * float(sf["instance_per_hour"]) / 3600.0 * out["instances"]
    out["serverless_over_serverful"] = out["serverless"] / out["serverful"] if out["serverful"] > 0 else math.nan
    out["serverful_over_serverless"] = out["serverful"] / out["serverless"] if out["serverless"] > 0 else math.nan
    return out


def markdown(runs: list[tuple[Run, str]], prices: dict) -> str:
    """summary.md's MARLess pricing section: one row per (run, name)."""
    sf = prices["serverful"]
    cur = prices["currency"]
    lines = ["", f"## MARLess pricing: AWS Lambda functions vs {sf['instance']} ({cur})", "",
             f"Lambda {prices['gb_second']:.10g} {cur}/GB-s and {prices['request']:.3g} {cur}/request; function memory "
             + ", ".join(f"{r} {float(prices['memory_gb'][r]):.3g} GB" for r in ROLES)
             + f"; pre-warm = each function once for the run's startup seconds; serverful = {sf['instance']} at "
             f"{sf['instance_per_hour']} {cur}/h for the wall-clock (analysis/hpcrl_analysis/pricing.py).", "",
             "| run | learner | actor | parameter | of it pre-warm | serverless | serverful | instances | "
             "serverless / serverful | serverful / serverless |", "|---|---|---|---|---|---|---|---|---|---|"]
    for run, name in runs:
        c = marless_cost(run, prices)
        warm = sum(c[f"prewarm_{r}"] for r in ROLES)
        lines.append(f"| {name} | {c['serverless_learner']:.4g} | {c['serverless_actor']:.4g} | "
                     f"{c['serverless_parameter']:.4g} | {warm:.4g} | {c['serverless']:.4g} | {c['serverful']:.4g} | "
                     f"{c['instances']:.0f} | {c['serverless_over_serverful']:.3f} | {c['serverful_over_serverless']:.3f} |")
    return "\n".join(lines) + "\n"
