"""The Stellaris artifact's two log files per run, so its plot script reads hpcrl runs unchanged.

The published artifact (IntelliSys-Lab/Stellaris-SC24, evaluation/experiment) writes, per
scheduler, environment and algorithm, ``SCHEDULER~ENV~ALGO~info.csv`` (one row per round) and
``SCHEDULER~ENV~ALGO~timeline.csv`` (wall-clock time and episodic reward); its ``plot.py`` reads
``df["cost"].iloc[-1]`` from the first and plots "Episodic reward" over "Wall clock time (s)"
from the second. Here SCHEDULER is "stellaris" (or the run's aggregation.policy), ENV the
config's env.id after its last "/" (Hopper-v5, Qbert-v5), ALGO its algo.name.

Values follow the artifact's writer where it fixes them: round_id counts from 1; cost is the
running total of the per-round Stellaris cost (metrics.compute_per_round); a round without
episodes has eval_reward_* 0 and one timeline row with reward 0; staleness_* and learner_loss
are 0 when nothing was admitted; the timeline starts with a (0, 0) row and gives every episode
of a round the cumulative duration at the round's end. serverless_bound is the threshold in
force at the round's end (beta_k of Eq. 3), empty where there is none (round 0; the artifact
writes 114514). eval_reward_* are the evaluation episodes' returns (``eval.episodes`` > 0: the
greedy policy on its own env copies, table eval_episodes) of the evaluation that followed the
round, carried forward to the rounds between evaluations (0 before the first), as an RLlib
evaluation interval leaves them; a run without evaluations gives its training episodes' returns
of the round instead.

The timeline holds the evaluation episodes when the run has them, as the artifact's does (its
``env.py`` takes ``train_results['evaluation']['hist_stats']['episode_reward']``): each evaluation's
returns at the cumulative duration of the rounds it followed. A run without evaluation episodes
gives its training episodes, and :func:`write_stellaris_csv` says so in one line on stderr.

``artifact_names``: file names as the artifact's ``plot.py`` iterates them, so it runs unedited on a
folder of hpcrl runs: ENV with the artifact's MuJoCo ids (Hopper-v3, Humanoid-v3, Walker2d-v3 for
any version of those envs) and SCHEDULER ``stellaris`` for the Stellaris policies; other policies keep their
names, sync included: the artifact's ``rllib`` is RLlib's synchronous PPO, which hpcrl's sync admission is not,
so an ``rllib`` file is only ever one an RLlib run wrote.
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import numpy as np

from . import metrics as M
from .h5read import AnalysisError, Run

INFO_COLUMNS = ("round_id", "duration", "num_rollout_workers", "num_envs_per_worker", "episodes_this_iter",
                "learner_time", "actor_time", "eval_reward_max", "eval_reward_mean", "eval_reward_min",
                "eval_reward_std", "staleness_max", "staleness_mean", "staleness_min", "staleness_std",
                "learner_loss", "cost", "serverless_bound")
TIMELINE_COLUMNS = ("Wall clock time (s)", "Episodic reward")
ARTIFACT_ENVS = {"Hopper": "Hopper-v3", "Humanoid": "Humanoid-v3", "Walker2d": "Walker2d-v3"}
"""The artifact's env ids (its config.envs, which plot.py iterates), by the env's name without version."""
ARTIFACT_SCHEDULERS = {"stellaris": "stellaris", "stellaris_code": "stellaris"}
"""aggregation.policy -> the artifact's scheduler name (plot.py iterates stellaris and rllib; rllib is RLlib's)."""


def config_value(run: Run, section: str, key: str, default: str = "") -> str:
    """``section.key`` of the run's resolved config (run.h5 attribute config_yaml), as text.

    The file is PyYAML's block style (``section:`` then ``  key: value``); read line by line so
    this folder needs no YAML package."""
    inside = False
    for line in str(run.attrs.get("config_yaml", "")).splitlines():
        if not line.startswith(" "):
            inside = line.rstrip() == f"{section}:"
            continue
        if inside and line.startswith(f"  {key}:") and not line.startswith("   "):
            value = line.split(":", 1)[1].strip()
            return value.strip("'\"") if value else default
    return default


def names(run: Run, scheduler: str = "stellaris", artifact_names: bool = False) -> tuple[str, str, str]:
    """(SCHEDULER, ENV, ALGO) of a run's file names; scheduler "policy" means the run's aggregation.policy;
    ``artifact_names`` maps both to the artifact's (ARTIFACT_ENVS, ARTIFACT_SCHEDULERS), but a scheduler other than
    "stellaris" and "policy" (a sweep's arm name) is kept as it is."""
    env = config_value(run, "env", "id", "env").rsplit("/", 1)[-1]
    algo = config_value(run, "algo", "name", "ppo")
    policy = config_value(run, "aggregation", "policy", "stellaris")
    if artifact_names:
        named = scheduler if scheduler not in ("stellaris", "policy") else ARTIFACT_SCHEDULERS.get(policy, policy)
        return named, ARTIFACT_ENVS.get(env.split("-v")[0], env), algo
    return (policy if scheduler == "policy" else scheduler), env, algo


def _zero_if_nan(v) -> float:
    v = float(v)
    return 0.0 if not math.isfinite(v) else v


def info_rows(run: Run, prices: dict) -> list[list]:
    """One row per round, columns INFO_COLUMNS."""
    pr = M.per_round(run, prices)
    workers = M.ranks(run)["actor"]
    envs = int(config_value(run, "env", "num_envs", "1") or 1)
    ev = M.evaluations(run)
    by_round = {int(k): i for i, k in enumerate(ev["round"])}
    rows, total, last_eval = [], 0.0, [0.0] * 4
    for i in range(len(pr["round_id"])):
        total += _zero_if_nan(pr["cost"][i])
        bound = float(pr["threshold"][i])
        round_id = int(pr["round_id"][i]) + 1
        if not by_round:
            reward = [_zero_if_nan(pr[f"reward_{s}"][i]) for s in ("max", "mean", "min", "std")]
        else:
            if round_id in by_round:
                j = by_round[round_id]
                last_eval = [float(ev[s][j]) for s in ("max", "mean", "min", "std")]
            reward = last_eval
        rows.append([round_id, float(pr["duration"][i]), workers, envs, int(pr["episodes"][i]),
                     float(pr["learner_time"][i]), float(pr["actor_time"][i]), *reward,
                     *(_zero_if_nan(pr[f"staleness_{s}"][i]) for s in ("max", "mean", "min", "std")),
                     _zero_if_nan(pr["loss"][i]), total, bound if math.isfinite(bound) else ""])
    return rows


def timeline_rows(run: Run) -> list[list[float]]:
    """(wall-clock s, episodic reward): a (0, 0) row, then each evaluation's episodes at the cumulative duration
    of the rounds it followed; without evaluations, each round's training episodes at the round's end."""
    ids, starts, ends = M.round_windows(run)
    ev = run.table("eval_episodes")
    if ev and len(ev["round"]):
        ended = np.concatenate([[0.0], np.cumsum(np.asarray(ends, np.float64) - np.asarray(starts, np.float64))])
        rows = [[0.0, 0.0]]
        for k in np.unique(ev["round"]):  # k rounds had ended when this evaluation was asked for
            clock = float(ended[min(int(k), len(ended) - 1)])
            rows += [[clock, float(r)] for r in ev["return"][ev["round"] == k]]
        return rows
    ep = run.table("episodes")
    times = ep["time"].astype(np.float64) if ep else np.zeros(0)
    which = M.assign_rounds(times, starts, ends)
    rows: list[list[float]] = [[0.0, 0.0]]
    clock = 0.0
    for i in range(len(ids)):
        clock += float(ends[i] - starts[i])
        returns = ep["return"][which == i] if ep else np.zeros(0)
        rows += [[clock, float(r)] for r in returns] if len(returns) else [[clock, 0.0]]
    return rows


def _write(path: Path, header, rows) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_stellaris_csv(runs: list[Run], out_dir: Path, prices: dict, scheduler: str = "stellaris",
                        artifact_names: bool = False) -> list[Path]:
    """Both files for every run into ``out_dir``; two runs that would share a file name are refused."""
    seen: dict[str, Path] = {}
    for run in runs:
        stem = "~".join(names(run, scheduler, artifact_names))
        if stem in seen:
            raise AnalysisError(f"--stellaris-csv: {run.path} and {seen[stem]} would both write {stem}~info.csv; "
                                "use --stellaris-scheduler policy or analyse them with separate --out folders")
        seen[stem] = run.path
    written = []
    for run in runs:
        stem = "~".join(names(run, scheduler, artifact_names))
        if not run.rows("eval_episodes"):
            print(f"--stellaris-csv: {run.path} has no evaluation episodes: {stem}~timeline.csv holds its training "
                  "episodes (the artifact's holds evaluation episodes; run with eval.episodes > 0)", file=sys.stderr)
        written.append(_write(out_dir / f"{stem}~info.csv", INFO_COLUMNS, info_rows(run, prices)))
        written.append(_write(out_dir / f"{stem}~timeline.csv", TIMELINE_COLUMNS, timeline_rows(run)))
    return written
