"""ClusterEnv AAPS records (the file ``hpcrl.ClusterEnv(record=...)`` writes): the seed's Figs. 2 and 3.

Fig. 2 shape: episodic return (smoothed) vs environment steps, one curve per KL threshold.
Fig. 3 shape: cumulative weight syncs per worker vs environment steps, one line per worker,
coloured by KL threshold. Plus ``summary.csv``: syncs per worker and final return per record.
Reads the files with h5py alone (tables ``aaps`` and ``episodes``, attribute ``kind``).
"""
from __future__ import annotations

import csv
from pathlib import Path

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .h5read import AnalysisError  # noqa: E402

KIND = "hpcrl.clusterenv"
RECORD_NAME = "clusterenv.h5"
COLUMNS = ("kl_threshold", "workers", "publishes", "syncs_per_worker", "syncs_min", "syncs_max", "episodes",
           "env_steps", "final_return", "record")


def record_path(path: str | Path) -> Path | None:
    """The record file for ``path`` (the file itself, or DIR/clusterenv.h5), or None when it is not one."""
    p = Path(path)
    p = p / RECORD_NAME if p.is_dir() else p
    if not p.is_file() or p.suffix not in (".h5", ".hdf5"):
        return None
    try:
        with h5py.File(p, "r", locking=False) as f:
            return p if f.attrs.get("kind") == KIND else None
    except OSError:
        return None


def load(path: str | Path) -> dict:
    p = record_path(path)
    if p is None:
        raise AnalysisError(f"{path}: not a ClusterEnv record (no HDF5 file with kind={KIND!r})")
    with h5py.File(p, "r", locking=False) as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        tables = {}
        for name in ("aaps", "episodes"):
            g = f[name]
            n = min(g[c].shape[0] for c in g)
            tables[name] = {c: g[c][:n] for c in g}
    return {"path": p, "attrs": attrs, "label": str(attrs.get("label", p.stem)), **tables}


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    if len(y) < window:
        return np.cumsum(y) / np.arange(1, len(y) + 1)
    return np.convolve(y, np.ones(window) / window, mode="valid")


def summary_row(rec: dict, window: int = 20) -> dict:
    a, e = rec["aaps"], rec["episodes"]
    workers = int(rec["attrs"]["workers"])
    final = np.zeros(workers, dtype=np.int64)
    for w in range(workers):
        sel = a["worker"] == w
        final[w] = a["syncs"][sel].max() if sel.any() else 0
    returns = e["return"].astype(float)
    return {"kl_threshold": float(rec["attrs"]["kl_threshold"]), "workers": workers,
            "publishes": int(a["version"].max() + 1) if len(a["version"]) else 0,
            "syncs_per_worker": float(final.mean()), "syncs_min": int(final.min()), "syncs_max": int(final.max()),
            "episodes": int(len(returns)), "env_steps": int(a["env_steps"].max()) if len(a["env_steps"]) else 0,
            "final_return": float(returns[-window:].mean()) if len(returns) else float("nan"),
            "record": str(rec["path"])}


def returns_figure(recs: list[dict], path: Path, window: int = 20) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    cmap = plt.get_cmap("viridis")
    for i, rec in enumerate(recs):
        e = rec["episodes"]
        if not len(e["return"]):
            continue
        y = smooth(e["return"].astype(float), window)
        x = e["env_steps"][len(e["return"]) - len(y):]
        ax.plot(x, y, lw=1.6, color=cmap(i / max(len(recs) - 1, 1)), label=rec["label"])
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"episodic return (mean of {window})")
    ax.set_title(f"{recs[0]['attrs'].get('env_id', '')}: return per KL threshold (AAPS)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def syncs_figure(recs: list[dict], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    cmap = plt.get_cmap("viridis")
    for i, rec in enumerate(recs):
        a, color = rec["aaps"], cmap(i / max(len(recs) - 1, 1))
        for w in np.unique(a["worker"]):
            sel = a["worker"] == w
            ax.step(a["env_steps"][sel], a["syncs"][sel], where="post", color=color, lw=1.2, alpha=0.85,
                    label=rec["label"] if w == 0 else None)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("cumulative weight syncs per worker")
    ax.set_title("AAPS: weight pulls per worker (one line per worker)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def analyze(paths: list[str | Path], out_dir: str | Path) -> dict:
    """Figures and summary.csv for ClusterEnv records, sorted by KL threshold; returns paths and rows."""
    recs = sorted((load(p) for p in paths), key=lambda r: float(r["attrs"]["kl_threshold"]))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [summary_row(r) for r in recs]
    with open(out / "summary.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    figs = {"returns": returns_figure(recs, out / "aaps_returns.png"),
            "syncs": syncs_figure(recs, out / "aaps_syncs.png")}
    return {"figures": figs, "rows": rows, "csv": out / "summary.csv"}
