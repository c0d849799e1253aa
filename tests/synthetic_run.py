"""A realistic small run directory written through hpcrl.io (for the analysis tests; no MPI, no training).

The timeline imitates the parameter rank: rounds of a few fragments per actor, episodes whose
return improves, gradients with staleness under a decaying threshold (some rejected), updates,
learner activity and an elastic number of active groups.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcrl.io import RunFile, TrajectoryWriter, TrajLayout, traj_filename

LAYOUT = TrajLayout(obs_shape=(4,), action_shape=(), action_dtype="i8", num_envs=2)


def write_synthetic_run(run_dir: Path, policy: str = "stellaris", seed: int = 0, rounds: int = 8, actors: int = 3,
                        groups: int = 2, close: bool = True) -> RunFile:
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = f"name: synth\naggregation: {{policy: {policy}, d: 0.9}}\nactors: {{count: {actors}}}\n"
    (run_dir / "config.yaml").write_text(config)
    n = 1 + groups + actors
    rank_map = {"rank": np.arange(n), "role": [0] + [1] * groups + [2] * actors,
                "group": [-1] + list(range(groups)) + [-1] * actors,
                "index": [0] + [0] * groups + list(range(actors)), "node": ["node0"] * n}
    run = RunFile.create(run_dir / "run.h5", config, rank_map, traj_layout=LAYOUT, flush_seconds=1.0)
    writers = [TrajectoryWriter(run_dir / traj_filename(a), LAYOUT, actor=a) for a in range(actors)]
    t, version, steps_total, seq = 0.0, 0, 0, [0] * groups
    delta_max = 3.0
    for k in range(rounds):
        start = t
        active = 1 + (k % groups)
        threshold = np.nan if (k == 0 or policy == "pure_async") else delta_max * 0.9 ** k
        round_steps, n_ep, ret_all, stale_all, loss_all, learner_s, actor_s = 0, 0, [], [], [], 0.0, 0.0
        for frag in range(2):
            for a in range(actors):
                sample = 0.2 + 0.05 * rng.random()
                t += 0.05
                T, N = 8, LAYOUT.num_envs
                writers[a].append_fragment(rng.normal(size=(T, N, 4)), rng.integers(0, 2, (T, N)), np.ones((T, N)),
                                           np.zeros((T, N)), np.zeros((T, N)), np.full((T, N), -0.69),
                                           np.zeros((T, N)), version)
                run.append("actors", {"time": t, "actor": a, "fragment": 2 * k + frag, "steps": T * N,
                                      "sample_seconds": sample, "transport_wait_seconds": 0.01 * rng.random(),
                                      "weight_sync_seconds": 0.002, "policy_version": version, "group": a % active})
                actor_s += sample
                round_steps += T * N
                steps_total += T * N
                for _ in range(int(rng.integers(0, 3))):
                    ret = 20 + 40 * k + (policy == "stellaris") * 10 * k + rng.normal(0, 5)
                    run.append("episodes", {"time": t, "actor": a, "env_index": int(rng.integers(0, N)),
                                            "return": ret, "length": int(ret), "policy_version": version,
                                            "env_steps": steps_total})
                    n_ep += 1
                    ret_all.append(ret)
            for g in range(active):
                t += 0.1
                compute = 0.08 + 0.02 * rng.random()
                run.append("learner_activity", {"time_start": t - compute, "time_end": t, "group": g,
                                                "compute_seconds": compute, "samples": 64})
                learner_s += compute
                staleness = int(rng.integers(0, 4))
                admitted = not (np.isfinite(threshold) and staleness > threshold + 1)
                loss = 1.0 / (1 + k) + 0.01 * rng.random()
                run.append("gradients", {"time": t, "group": g, "seq": seq[g], "base_version": max(0, version - staleness),
                                         "staleness": staleness, "round": k, "lr_scale": 1.0 if admitted else np.nan,
                                         "samples": 64, "loss": loss, "admitted": int(admitted),
                                         "reason": 0 if admitted else 1, "queue_seconds": 0.02,
                                         "compute_seconds": compute, "mailbox_wait_seconds": 0.005})
                phases = {"receive_seconds": 0.002, "weights_seconds": 0.001, "gradient_seconds": compute,
                          "push_seconds": 0.003}
                run.append("learner_cycles", {"time": t, "group": g, "seq": seq[g], "base_version": version,
                                              "cycle_seconds": sum(phases.values()), **phases})
                seq[g] += 1
                if admitted:
                    version += 1
                    stale_all.append(staleness)
                    loss_all.append(loss)
                    run.append("updates", {"time": t + 0.02, "version": version, "round": k, "num_gradients": 1,
                                           "staleness_mean": staleness, "staleness_max": staleness,
                                           "threshold": threshold, "lr": 3e-4, "loss_mean": loss, "loss_min": loss,
                                           "loss_max": loss, "active_groups": active, "aggregate_seconds": 0.003,
                                           "publish_seconds": 0.001})
        t += 0.05
        run.append("parameter_load", {"time": t, "interval_seconds": 0.1 * active + 0.05, "gradients": active,
                                      "applied": active, "updates": active, "receive_seconds": 0.001 * active,
                                      "admit_seconds": 0.0005, "apply_seconds": 0.002 * active,
                                      "publish_seconds": 0.001 * active, "record_seconds": 0.001, "idle_seconds": 0.05,
                                      "other_seconds": 0.001, "absorption_rate": 1 / 0.0045, "arrival_rate": 10.0})
        st, rt = np.asarray(stale_all, float), np.asarray(ret_all, float)

        def agg(a, fn):
            return float(fn(a)) if a.size else np.nan
        run.append("rounds", {"round": k, "start": start, "duration": t - start, "env_steps": round_steps,
                              "env_steps_total": steps_total, "episodes": n_ep, "updates": len(stale_all),
                              "threshold": threshold, "staleness_mean": agg(st, np.mean), "staleness_max": agg(st, np.max),
                              "staleness_min": agg(st, np.min), "staleness_std": agg(st, np.std),
                              "learner_seconds": learner_s, "actor_seconds": actor_s, "active_actors": actors,
                              "active_groups": active, "loss": float(np.mean(loss_all)) if loss_all else np.nan,
                              "reward_mean": agg(rt, np.mean), "reward_max": agg(rt, np.max),
                              "reward_min": agg(rt, np.min), "reward_std": agg(rt, np.std)})
        t += 0.01  # next round starts after this one ends
    for w in writers:
        w.close()
    if close:
        run.close()
    else:
        run.flush()
    return run
