"""Files a reader opens: the per-round CSV, the Markdown summary, one self-contained HTML report."""
from __future__ import annotations

import base64
import csv
import html
import math
import re
from pathlib import Path

import numpy as np

from . import billing as B
from . import marl as MA
from . import metrics as M
from .h5read import Run


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def write_rounds_csv(run: Run, path: Path, prices: dict) -> Path:
    """The Stellaris artifact's per-round columns (metrics.CSV_COLUMNS), one row per round."""
    pr = M.per_round(run, prices)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(M.CSV_COLUMNS)
        for i in range(len(pr["round_id"])):
            w.writerow([_csv_value(pr[c][i]) for c in M.CSV_COLUMNS])
    return path


def _csv_value(v) -> str:
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    v = float(v)
    return "" if not math.isfinite(v) else f"{v:.6g}"


def _fmt(v) -> str:
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(v):
            return "-"
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v)


def summary_rows(runs: list[Run], prices: dict) -> tuple[list[str], list[list[str]]]:
    """Side-by-side table: metrics as rows, one column per run."""
    sums = [M.summary(r, prices) for r in runs]
    header = ["metric"] + [s["run"] for s in sums]
    keys = [k for k in sums[0] if k != "run"]
    return header, [[k] + [_fmt(s[k]) for s in sums] for k in keys]


def markdown(runs: list[Run], prices: dict) -> str:
    header, rows = summary_rows(runs, prices)
    esc = [[c.replace("|", "\\|") for c in row] for row in [header] + rows]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    p = prices
    notes = [
        "",
        f"Prices ({p['currency']}): learner {p['learner']['instance']} {p['learner']['instance_per_hour']}/h per "
        f"{p['learner']['units_per_instance']} {p['learner']['unit']}, {p['learner']['functions_per_unit']} functions per unit; "
        f"actor {p['actor']['instance']} {p['actor']['instance_per_hour']}/h per {p['actor']['units_per_instance']} "
        f"{p['actor']['unit']}. Source: {p['source']}.",
        "Serverless = active rank-seconds at the per-function price; serverful = wall-clock x every allocated rank "
        "(both the cost model's views). Billed = the batch jobs' node-seconds from sacct x the site's charge factor: "
        "what the allocation is charged (only for runs started inside a batch job).",
    ]
    bills = [B.billed(r) for r in runs]
    jobs = B.markdown(runs, bills) if any(b["jobs"] for b in bills) else ""
    return "# hpcrl run summary\n\n" + "\n".join(lines + notes) + "\n" + jobs + MA.markdown(runs, prices)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee;margin:6px 0}
.note{color:#555;font-size:13px}"""


def html_report(runs: list[Run], figures: dict[str, Path], prices: dict, csv_files: list[Path]) -> str:
    """One HTML page with the summary table and every figure embedded as base64 PNG."""
    header, rows = summary_rows(runs, prices)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>hpcrl analysis</title><style>{_CSS}</style></head><body>",
             "<h1>hpcrl run analysis</h1>",
             "<p class='note'>" + html.escape(", ".join(str(r.path) for r in runs)) + "</p>",
             "<h2>Summary</h2><table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    parts.append("<p class='note'>Per-round CSV (Stellaris artifact columns): "
                 + html.escape(", ".join(p.name for p in csv_files)) + "</p>")
    for name, path in figures.items():
        data = base64.b64encode(Path(path).read_bytes()).decode()
        parts.append(f"<h2>{html.escape(name)}</h2><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)
