"""Soak: runs killed, signalled and resumed at random for N minutes, then a full consistency check of the record.

One run directory; a tiny CartPole job on more ranks than cores (oversubscribed). Each cycle starts
the run (or resumes it), waits a random 2-15 s, and injects one fault: SIGKILL of the whole job
(launcher and ranks), SIGKILL of one rank (MPI runner), SIGTERM or SIGUSR1 (a clean stop with a
checkpoint), or SIGSTOP of one actor rank (the watchdog ends the job). Then ``hpcrl run --resume``
goes on, a third of the time with one actor more or fewer. At the end the record must hold every key once (update versions 1..n, (group, seq) per
group 0..k, rounds 0..r, (actor, fragment) per actor 0..f) and its counters must match the files;
each resume's ``resumed`` note says what was cut back to the checkpoint (the flush window).

    hpcrl bench soak [--minutes 20] [--runner mpi|serial|both] [--actors 6] [--seed 0] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import yaml

from hpcrl.runtime.record.checkpoint import has_checkpoint
from hpcrl.runtime.runners.mpiexec import local_rank_pids

FAULTS = ("kill_job", "kill_rank", "sigterm", "sigusr1", "stop_actor")


def config(run_dir: Path, runner: str, actors: int) -> dict:
    return {"name": "soak", "env": {"id": "CartPole-v1", "num_envs": 2},
            "actors": {"count": actors, "fragment_length": 16}, "learners": {"groups": 2, "min_active": 1},
            "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 32, "num_sgd_iter": 1},
            "stop": {"total_env_steps": 10**9}, "io": {"run_dir": str(run_dir), "flush_seconds": 0.5,
                                                      "checkpoint_every": 25},
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


def inject(fault: str, proc: subprocess.Popen, run_dir: Path, runner: str, rng: random.Random) -> str:
    if fault == "kill_job":
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in local_rank_pids(run_dir).values():  # Hydra gives each rank a session of its own
            os.kill(pid, signal.SIGKILL)
        return "SIGKILL of the job"
    if fault in ("sigterm", "sigusr1"):
        proc.send_signal(signal.SIGTERM if fault == "sigterm" else signal.SIGUSR1)
        return fault.upper()
    ranks = local_rank_pids(run_dir)
    if runner == "serial" or not ranks:
        os.killpg(proc.pid, signal.SIGKILL)
        return "SIGKILL of the job" + (" (serial: one process)" if runner == "serial" else " (ranks not started)")
    rank = rng.choice(sorted(ranks))
    if fault == "kill_rank":
        os.kill(ranks[rank], signal.SIGKILL)
        return f"SIGKILL of rank {rank}"
    actor = max(ranks)  # the last ranks are actors
    os.kill(ranks[actor], signal.SIGSTOP)
    return f"SIGSTOP of rank {actor} (watchdog)"


def cleanup(run_dir: Path) -> None:
    for pid in local_rank_pids(run_dir).values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def soak(runner: str, minutes: float, actors: int, root: Path, rng: random.Random) -> dict:
    run_dir = root / f"soak-{runner}"
    cfg_path = root / f"soak-{runner}.yaml"
    cfg_path.write_text(yaml.safe_dump(config(run_dir, runner, actors)))
    end, cycles, log = time.monotonic() + 60 * minutes, 0, []
    while time.monotonic() < end:
        resume = has_checkpoint(run_dir)
        if not resume and run_dir.exists():  # killed before its first checkpoint: start again, as a batch job does
            shutil.rmtree(run_dir)
        args = ["--resume", str(run_dir)] if resume else [str(cfg_path)]
        if resume and rng.random() < 0.3:  # a resume with one actor more or fewer joins the record too
            args += ["-o", f"actors.count={rng.choice([actors - 1, actors, actors + 1])}"]
        fault = rng.choice(FAULTS)
        # ranks forked by the prestart server (the default) or started by mpiexec; with prestart a rank's
        # PID is its stand-in, which passes SIGKILL's effect on but cannot pass SIGSTOP on
        prestart = fault != "stop_actor" and rng.random() < 0.5
        args += ["-o", f"launch.prestart={str(prestart).lower()}"]
        proc = subprocess.Popen([sys.executable, "-m", "hpcrl", "run", *args, "--oversubscribe"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        time.sleep(rng.uniform(2.0, 15.0))
        what = inject(fault, proc, run_dir, runner, rng) if proc.poll() is None else "none (the run had ended)"
        what += " [prestart]" if prestart and runner == "mpi" else ""
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            what += "; hung, killed after 90 s"
        cleanup(run_dir)
        cycles += 1
        log.append((what, proc.returncode))
        print(f"  {runner} cycle {cycles:3d}: {what:40s} exit {proc.returncode}", flush=True)
        if proc.returncode == 2:
            print(out[-2000:])
            break
    if not has_checkpoint(run_dir):
        return {"runner": runner, "cycles": cycles, "faults": log, "final_exit": -1, "resumes": 0, "updates_cut": 0,
                "problems": ["no checkpoint was ever written (every run was killed too early): run longer"]}
    final = subprocess.run([sys.executable, "-m", "hpcrl", "run", "--resume", str(run_dir), "--oversubscribe", "-o",
                            "stop.total_env_steps=1"], capture_output=True, text=True, timeout=180)
    from hpcrl.io import read_attrs

    notes = [json.loads(str(n)) for n in read_attrs(run_dir / "run.h5").get("resumed", []) if str(n)]
    cut = [sum(((n.get("discarded") or {}).get("tables") or {}).get("updates", 0) for n in notes)]
    return {"runner": runner, "cycles": cycles, "faults": log, "final_exit": final.returncode,
            "problems": check_record(run_dir), "resumes": len(notes), "updates_cut": cut[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hpcrl bench soak", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--runner", choices=("mpi", "serial", "both"), default="both")
    p.add_argument("--actors", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", help="folder for the run directories (default: a temporary one)")
    args = p.parse_args(argv)
    if not args.minutes > 0:  # argparse: exit 2 with the usage line
        p.error(f"--minutes {args.minutes:g}: the soak needs a positive time (e.g. --minutes 20)")
    if args.actors < 1:
        p.error(f"--actors {args.actors}: at least 1")
    rng = random.Random(args.seed)
    runners = ("mpi", "serial") if args.runner == "both" else (args.runner,)
    root = Path(args.keep or tempfile.mkdtemp(prefix="hpcrl-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"# soak: {args.minutes} min in all ({args.minutes / len(runners):g} per runner), {args.actors} actors + 2 learner groups + 1 parameter rank "
          f"on {os.cpu_count()} cores; run directories under {root}")
    results = [soak(r, args.minutes / len(runners), args.actors, root, rng) for r in runners]
    print(f"\n{'runner':8s} {'cycles':>6s} {'resumes':>7s} {'updates cut':>11s} {'final exit':>10s}  problems")
    ok = True
    for r in results:
        ok &= not r["problems"] and r["final_exit"] == 0
        print(f"{r['runner']:8s} {r['cycles']:6d} {r['resumes']:7d} {r['updates_cut']:11d} {r['final_exit']:10d}  "
              f"{'; '.join(r['problems']) or 'none: every key once, counters match the files'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
