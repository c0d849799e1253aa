"""Soak: runs killed, signalled and resumed at random for N minutes, then a full consistency check of the record.

One run directory; a tiny CartPole job on more ranks than cores (oversubscribed). Each cycle starts
the run (or resumes it), waits for its first progress line, then a random 1-8 s (``--fault-after``), and injects one fault:
SIGKILL of the whole job (launcher and ranks), SIGKILL of one rank (MPI runner), SIGTERM or SIGUSR1 (a
clean stop with a checkpoint), or SIGSTOP of one actor rank (the watchdog ends the job). The fault of a
cycle is one of the kinds that has taken least so far, so every kind is drawn. A fault counts as taken
only when the run's end shows it (killed by SIGKILL; exit 3 after a stop signal; the killed or silent
rank named in the last line); the soak goes on past N minutes until each kind that applies to the
runner has taken ``--min-each`` times (at most a cycle budget more), and fails if one has not. Then
``hpcrl run --resume`` goes on, a third of the time with one actor more or fewer. At the end the record must hold every key once (update versions 1..n, (group, seq) per
group 0..k, rounds 0..r, (actor, fragment) per actor 0..f) and its counters must match the files;
each resume's ``resumed`` note says what was cut back to the checkpoint (the flush window).

    hpcrl bench soak [--minutes 20] [--runner mpi|serial|both] [--actors 6] [--seed 0] [--min-each 2]
                     [--fault-after 1 8] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import yaml

from hpcrl.runtime.record.checkpoint import has_checkpoint
from hpcrl.runtime.runners.mpiexec import local_rank_pids

FAULTS = ("kill_job", "kill_rank", "sigterm", "sigusr1", "stop_actor")
SERIAL_FAULTS = ("kill_job", "sigterm", "sigusr1")
"""The serial runner is one process: no rank to kill or stop on its own."""
PROGRESS = re.compile(r"^\[\s*[\d.]+ s\] steps (\d+)")
"""hpcrl run's plain progress line (runtime/record/progress.py): the job runs."""


def config(run_dir: Path, runner: str, actors: int) -> dict:
    return {"name": "soak", "env": {"id": "CartPole-v1", "num_envs": 2},
            "actors": {"count": actors, "fragment_length": 16}, "learners": {"groups": 2, "min_active": 1},
            "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 32, "num_sgd_iter": 1},
            "stop": {"total_env_steps": 10**9}, "io": {"run_dir": str(run_dir), "flush_seconds": 0.5,
                                                      "checkpoint_every": 25, "log_seconds": 1},
            "launch": {"runner": runner, "watchdog_warn_seconds": 2, "watchdog_seconds": 5, "startup_seconds": 45,
                       "ranks_per_core": 64}}


def check_record(run_dir: Path) -> list[str]:
    """Every key once, in order; counters that match the files. Returns the problems found."""
    from hpcrl.io import read_attrs, read_table, read_trajectory
    from hpcrl.runtime.record.checkpoint import load_checkpoint

    h5, problems = run_dir / "run.h5", []
    versions = read_table(h5, "updates")["version"]
    if not np.array_equal(versions, np.arange(1, len(versions) + 1)):
        problems.append(f"updates: versions not 1..{len(versions)}")
    grads = read_table(h5, "gradients")
    for g in np.unique(grads["group"]):
        seqs = np.sort(grads["seq"][grads["group"] == g])
        if not np.array_equal(seqs, np.arange(len(seqs))):
            problems.append(f"gradients: group {g} sequence numbers not 0..{len(seqs) - 1}")
    rounds = read_table(h5, "rounds")["round"]
    if not np.array_equal(rounds, np.arange(len(rounds))):
        problems.append("rounds: not 0..n")
    actors = read_table(h5, "actors")
    for a in np.unique(actors["actor"]):
        frags = np.sort(actors["fragment"][actors["actor"] == a])
        if not np.array_equal(frags, np.arange(len(frags))):
            problems.append(f"actors: actor {a} fragment numbers not 0..{len(frags) - 1}")
    ranks = read_table(h5, "rank_map")
    listed = set(ranks["index"][ranks["role"] == 2].tolist())
    if not set(np.unique(actors["actor"]).tolist()) <= listed:
        problems.append(f"rank_map: actors {sorted(set(np.unique(actors['actor']).tolist()) - listed)} missing")
    with h5py.File(h5, "r", swmr=True) as f:
        if "trajectories" in f and f["trajectories"].attrs["num_actors"] < len(listed):
            problems.append(f"trajectories view covers {f['trajectories'].attrs['num_actors']} of {len(listed)} actors")
    ckpt = load_checkpoint(run_dir)
    if ckpt is not None and len(versions) and ckpt["version"] != versions[-1]:
        problems.append(f"checkpoint version {ckpt['version']} != last update {versions[-1]}")
    steps = sum(len(read_trajectory(p)["rewards"]) for p in sorted((run_dir / "traj").glob("actor-*.h5")))
    if ckpt is not None and steps < sum(ckpt["record"]["traj_steps"].values()):
        problems.append("trajectory files hold fewer steps than the last checkpoint recorded")
    if len(read_attrs(h5).get("resumed", [])) != len(read_attrs(h5)["resumed_unix"]):
        problems.append("resumed notes and resume times differ in number")
    return problems


def inject(fault: str, proc: subprocess.Popen, run_dir: Path, runner: str,
           rng: random.Random) -> tuple[str, int | None]:
    """Inject ``fault`` into the running job: what was done, and the rank it hit (None: the whole job)."""
    if fault == "kill_job":
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in local_rank_pids(run_dir).values():  # Hydra gives each rank a session of its own
            os.kill(pid, signal.SIGKILL)
        return "SIGKILL of the job", None
    if fault in ("sigterm", "sigusr1"):
        proc.send_signal(signal.SIGTERM if fault == "sigterm" else signal.SIGUSR1)
        return fault.upper(), None
    ranks = local_rank_pids(run_dir)
    if runner == "serial" or not ranks:
        os.killpg(proc.pid, signal.SIGKILL)
        return "SIGKILL of the job" + (" (serial: one process)" if runner == "serial" else " (ranks not started)"), None
    rank = rng.choice(sorted(ranks))
    if fault == "kill_rank":
        os.kill(ranks[rank], signal.SIGKILL)
        return f"SIGKILL of rank {rank}", rank
    actor = max(ranks)  # the last ranks are actors
    os.kill(ranks[actor], signal.SIGSTOP)
    return f"SIGSTOP of rank {actor} (watchdog)", actor


def took(fault: str, rank: int | None, what: str, returncode: int, out: str) -> bool:
    """True when the run's end shows ``fault`` hit it: killed by SIGKILL; exit 3 with a checkpoint after SIGTERM or
    SIGUSR1; exit 1 with the killed (or silent) rank named in the last line."""
    last = out.strip().splitlines()[-1] if out.strip() else ""
    if fault == "kill_job" or what.startswith("SIGKILL of the job"):
        return fault == "kill_job" and returncode == -signal.SIGKILL
    if fault in ("sigterm", "sigusr1"):
        return returncode == 3 and f"stopped by {fault.upper()} with a checkpoint" in last
    named = rank is not None and returncode == 1 and f"rank {rank} (" in last
    return named and ("made no progress" in last if fault == "stop_actor" else "SIGKILL" in last)


def start_reader(proc: subprocess.Popen) -> tuple[list[str], threading.Event]:
    """Collect the run's output lines in a thread; the event is set at its first progress line."""
    lines, running = [], threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if PROGRESS.match(line):
                running.set()

    threading.Thread(target=read, daemon=True).start()
    return lines, running


def cleanup(run_dir: Path) -> None:
    for pid in local_rank_pids(run_dir).values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def soak(runner: str, minutes: float, actors: int, root: Path, rng: random.Random, min_each: int = 2,
         fault_after: tuple[float, float] = (1.0, 8.0)) -> dict:
    run_dir = root / f"soak-{runner}"
    cfg_path = root / f"soak-{runner}.yaml"
    cfg_path.write_text(yaml.safe_dump(config(run_dir, runner, actors)))
    kinds = FAULTS if runner == "mpi" else SERIAL_FAULTS
    taken, tried = dict.fromkeys(kinds, 0), dict.fromkeys(kinds, 0)
    end, cycles, log = time.monotonic() + 60 * minutes, 0, []
    extra = 3 * len(kinds) * min_each  # cycles allowed past the time for the kinds still short of min_each

    def short() -> bool:
        return min(taken.values()) < min_each

    while time.monotonic() < end or (short() and extra > 0):
        if time.monotonic() >= end:
            extra -= 1
        resume = has_checkpoint(run_dir)
        if not resume and run_dir.exists():  # killed before its first checkpoint: start again, as a batch job does
            shutil.rmtree(run_dir)
        args = ["--resume", str(run_dir)] if resume else [str(cfg_path)]
        if resume and rng.random() < 0.3:  # a resume with one actor more or fewer joins the record too
            args += ["-o", f"actors.count={rng.choice([actors - 1, actors, actors + 1])}"]
        least = min(taken.values())
        fault = rng.choice([k for k in kinds if taken[k] == least])
        tried[fault] += 1
        # ranks forked by the prestart server (the default) or started by mpiexec; with prestart a rank's
        # PID is its stand-in, which passes SIGKILL's effect on but cannot pass SIGSTOP on
        prestart = fault != "stop_actor" and rng.random() < 0.5
        args += ["-o", f"launch.prestart={str(prestart).lower()}"]
        proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", *args, "--oversubscribe"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines, running = start_reader(proc)
        running.wait(90)  # the ranks run (a loaded machine takes seconds to start them); then a random moment
        time.sleep(rng.uniform(*fault_after))
        hit = None
        if proc.poll() is None:
            what, hit = inject(fault, proc, run_dir, runner, rng)
        else:
            what = "none (the run had ended)"
        what += " [prestart]" if prestart and runner == "mpi" else ""
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            what += "; hung, killed after 90 s"
        time.sleep(0.2)  # the reader's last lines
        out = "".join(lines)
        cleanup(run_dir)
        cycles += 1
        ok = "hung" not in what and took(fault, hit, what, proc.returncode, out)
        taken[fault] += ok
        log.append((what, proc.returncode, ok))
        print(f"  {runner} cycle {cycles:3d}: {what:40s} exit {proc.returncode:4d}  {'took' if ok else 'did not take'}",
              flush=True)
        if proc.returncode == 2:
            print(out[-2000:])
            break
    faults = {k: (taken[k], tried[k]) for k in kinds}
    problems = [f"fault {k} took {taken[k]} times of {tried[k]} (at least {min_each} wanted)"
                for k in kinds if taken[k] < min_each]
    if not has_checkpoint(run_dir):
        return {"runner": runner, "cycles": cycles, "faults": faults, "log": log, "final_exit": -1, "resumes": 0,
                "updates_cut": 0, "env_steps": 0,
                "problems": problems + ["no checkpoint was ever written (every run was killed too early): run longer"]}
    final = subprocess.run([sys.executable, "-m", "hpcrl", "run", "--resume", str(run_dir), "--oversubscribe", "-o",
                            "stop.total_env_steps=1"], capture_output=True, text=True, timeout=180)
    from hpcrl.io import read_attrs, read_table

    notes = [json.loads(str(n)) for n in read_attrs(run_dir / "run.h5").get("resumed", []) if str(n)]
    cut = [sum(((n.get("discarded") or {}).get("tables") or {}).get("updates", 0) for n in notes)]
    steps = int(np.maximum(read_table(run_dir / "run.h5", "actors")["steps"], 0).sum())
    return {"runner": runner, "cycles": cycles, "faults": faults, "log": log, "final_exit": final.returncode,
            "problems": problems + check_record(run_dir), "resumes": len(notes), "updates_cut": cut[0],
            "env_steps": steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench soak", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--runner", choices=("mpi", "serial", "both"), default="both")
    p.add_argument("--actors", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-each", type=int, default=2, help="each fault kind must take this often (default 2)")
    p.add_argument("--fault-after", type=float, nargs=2, default=(1.0, 8.0), metavar=("MIN", "MAX"),
                   help="a fault comes a random MIN..MAX seconds after the run's first progress line (default 1 8)")
    p.add_argument("--keep", help="folder for the run directories (default: a temporary one)")
    args = p.parse_args(argv)
    low, high = args.fault_after
    if not 0 <= low <= high:
        p.error(f"--fault-after {low:g} {high:g}: two seconds, 0 <= MIN <= MAX")
    if not args.minutes > 0:  # argparse: exit 2 with the usage line
        p.error(f"--minutes {args.minutes:g}: the soak needs a positive time (e.g. --minutes 20)")
    if args.actors < 2:
        p.error(f"--actors {args.actors}: at least 2 (a resume may run with one fewer)")
    if args.min_each < 1:
        p.error(f"--min-each {args.min_each}: at least 1 (the soak must show each fault kind took)")
    rng = random.Random(args.seed)
    runners = ("mpi", "serial") if args.runner == "both" else (args.runner,)
    root = Path(args.keep or tempfile.mkdtemp(prefix="hpcrl-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"# soak: {args.minutes} min in all ({args.minutes / len(runners):g} per runner), {args.actors} actors + 2 learner groups + 1 parameter rank "
          f"on {os.cpu_count()} cores; each fault kind at least {args.min_each} times; run directories under {root}")
    results = [soak(r, args.minutes / len(runners), args.actors, root, rng, args.min_each, (low, high))
               for r in runners]
    print(f"\n{'runner':8s} {'cycles':>6s} {'env steps':>9s} {'resumes':>7s} {'updates cut':>11s} {'final exit':>10s}  "
          "faults that took / tried")
    ok = True
    for r in results:
        ok &= not r["problems"] and r["final_exit"] == 0
        faults = ", ".join(f"{k} {t}/{n}" for k, (t, n) in r["faults"].items())
        print(f"{r['runner']:8s} {r['cycles']:6d} {r['env_steps']:9d} {r['resumes']:7d} {r['updates_cut']:11d} "
              f"{r['final_exit']:10d}  {faults}")
        print(f"{'':8s} problems: {'; '.join(r['problems']) or 'none: every fault kind took, every key once, counters match the files'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
