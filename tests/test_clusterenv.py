"""hpcrl.ClusterEnv: Gymnasium-equal stepping on MPI workers, both launch modes, and failures.

Each MPI test runs a small head program in a subprocess with a hard timeout (the head starts
its workers with mpiexec itself, or is rank 0 of an mpiexec job).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hpcrl.clusterenv.infos import InfoDecoder, InfoEncoder, merge
from hpcrl.errors import ConfigError
from slurm_fixture import slurm  # noqa: F401 - the session fixture

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def run_head(tmp_path: Path, code: str, timeout: float = 90, mpiexec_n: int | None = None,
             env: dict[str, str] | None = None) -> subprocess.Popen:
    script = tmp_path / "head.py"
    script.write_text(textwrap.dedent(code))
    cmd = [sys.executable, str(script)]
    if mpiexec_n:
        cmd = [MPIEXEC, "-n", str(mpiexec_n)] + cmd
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 90) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"head program hung (> {timeout} s):\n{out[-3000:]}") from None
    assert proc.returncode == 0, out[-3000:]
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# ---- no MPI -----------------------------------------------------------------------------------
def test_infos_round_trip_like_gymnasium_including_empty_dicts_and_pickled_leftovers():
    k = 3
    final = np.full(k, None, dtype=object)
    final[1] = np.arange(4, dtype=np.float32)
    info = {"final_obs": final, "_final_obs": np.array([False, True, False]),
            "final_info": {}, "_final_info": np.array([False, True, False]),
            "x": np.array([1.5, 2.5, 3.5]), "_x": np.ones(k, bool)}
    enc, dec = InfoEncoder(k), InfoDecoder(k)
    sid, schema, data = enc.encode(info)
    dec.add_schema(schema)
    sid2, again, _ = enc.encode(info)
    assert sid2 == sid and again is None  # a schema travels once
    out = merge([(2, 5, dec.decode(sid, data))], 6)  # this worker holds envs 2..4 of 6
    assert out["final_info"] == {} and out["final_obs"][3].tolist() == [0, 1, 2, 3]
    assert out["final_obs"][0] is None and out["final_obs"][2] is None
    assert out["_final_obs"].tolist() == [False, False, False, True, False, False]
    assert out["x"].tolist() == [0, 0, 1.5, 2.5, 3.5, 0]
    odd = {"name": np.array(["a", "b", "c"], dtype=object)}
    sid, schema, data = enc.encode(odd)
    assert sid == InfoEncoder.PICKLED and schema is None
    assert merge([(0, 3, dec.decode(sid, data))], 3)["name"].tolist() == ["a", "b", "c"]


def test_bad_options_are_one_line_config_errors_before_any_process_starts():
    import hpcrl

    with pytest.raises(ConfigError, match="env.id: unknown environment"):
        hpcrl.ClusterEnv("NoSuchEnv-v9", 4, workers=2)
    with pytest.raises(ConfigError, match="workers: 5 must be between 1 and num_envs"):
        hpcrl.ClusterEnv("CartPole-v1", 4, workers=5)
    with pytest.raises(ConfigError, match="unknown option 'kl'"):
        hpcrl.ClusterEnv("CartPole-v1", 4, workers=2, kl=0.1)
    with pytest.raises(ConfigError, match="autoreset_mode"):
        hpcrl.ClusterEnv("CartPole-v1", 4, workers=2, autoreset_mode="sometimes")
    with pytest.raises(ConfigError, match="step_timeout: 0 must be > 0 seconds or None"):
        hpcrl.ClusterEnv("CartPole-v1", 4, workers=2, step_timeout=0)


def test_import_hpcrl_stays_cheap():
    code = "import sys, hpcrl; assert 'mpi4py' not in sys.modules and 'gymnasium' not in sys.modules; hpcrl.ClusterEnv"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)


# ---- MPI --------------------------------------------------------------------------------------
SAME_AS_SYNC = """
import numpy as np, gymnasium as gym
from gymnasium.vector import AutoresetMode
import hpcrl
env = hpcrl.ClusterEnv("CartPole-v1", 5, workers=2, launch="{launch}", wait="{wait}")
ref = gym.make_vec("CartPole-v1", 5, vectorization_mode="sync",
                   vector_kwargs={{"autoreset_mode": AutoresetMode.SAME_STEP}})
assert env.single_observation_space == ref.single_observation_space
assert env.action_space == ref.action_space and env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
o1, _ = env.reset(seed=7); o2, _ = ref.reset(seed=7)
assert np.array_equal(o1, o2)
rng, ends = np.random.default_rng(0), 0
for t in range(150):
    a = rng.integers(0, 2, 5)
    r1, r2 = env.step(a), ref.step(a)
    for x, y in zip(r1[:4], r2[:4]):
        assert x.dtype == y.dtype and np.array_equal(x, y), (t, x, y)
    assert sorted(r1[4]) == sorted(r2[4]), (t, r1[4].keys(), r2[4].keys())
    if "final_obs" in r2[4]:
        ends += int(r2[4]["_final_obs"].sum())
        for i in range(5):
            f1, f2 = r1[4]["final_obs"][i], r2[4]["final_obs"][i]
            assert (f1 is None and f2 is None) or np.array_equal(f1, f2)
assert ends > 5, ends
env.close(); env.close()
print("SAME", ends)
"""


@pytest.mark.mpi
@pytest.mark.slow
def test_local_workers_step_exactly_like_sync_vector_env(tmp_path):
    out = finish(run_head(tmp_path, SAME_AS_SYNC.format(launch="local", wait="socket")))
    assert "SAME" in out


@pytest.mark.mpi
def test_head_inside_an_mpi_job_uses_the_other_ranks_as_workers(tmp_path):
    out = finish(run_head(tmp_path, SAME_AS_SYNC.format(launch="auto", wait="poll"), mpiexec_n=3))
    assert out.count("SAME") == 1  # only rank 0 ran the loop; ranks 1 and 2 served and left


@pytest.mark.mpi
@pytest.mark.slow
def test_worker_errors_and_a_killed_worker_end_step_with_its_name_and_close_still_works(tmp_path):
    code = """
    import os, signal, time, numpy as np
    import hpcrl
    from hpcrl.clusterenv import WorkerLost
    env = hpcrl.ClusterEnv("CartPole-v1", 4, workers=2)
    from hpcrl.clusterenv import WorkerError
    env.reset(seed=0)
    try:  # an exception inside a worker's env: named, and the env stays usable
        env.step(np.array([0, 0, 1, 7]))
        raise SystemExit("no error")
    except WorkerError as exc:
        assert str(exc).startswith("ClusterEnv: worker 1 (rank 2") and "Traceback" in str(exc), exc
    assert env.step(np.zeros(4, dtype=np.int64))[0].shape == (4, 4)
    pids = [r["pid"] for r in env.pool.reports]
    os.kill(pids[1], signal.SIGKILL)
    t = time.time()
    try:
        for _ in range(10000):
            env.step(np.zeros(4, dtype=np.int64))
        raise SystemExit("no error")
    except WorkerLost as exc:
        print("ERROR", str(exc).splitlines()[0], round(time.time() - t, 2))
    t = time.time()
    env.close()
    print("CLOSED", round(time.time() - t, 2), "PIDS", pids[0])
    """
    out = finish(run_head(tmp_path, code))
    err = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert "worker 1 (" in err and "host" in err and "died" in err and "worker 0" not in err
    assert float(err.split()[-1]) < 5
    closed = next(line for line in out.splitlines() if line.startswith("CLOSED")).split()
    assert float(closed[1]) < 15
    survivor = int(closed[-1])
    deadline = time.time() + 10
    while alive(survivor) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(survivor)


@pytest.mark.mpi
@pytest.mark.parametrize("wait", ["socket", pytest.param("poll", marks=pytest.mark.slow)])
@pytest.mark.alone
def test_a_stopped_worker_ends_step_after_step_timeout_naming_it_and_close_ends_it(tmp_path, wait):
    code = f"""
    import os, signal, time, numpy as np
    import hpcrl
    from hpcrl.clusterenv import WorkerStalled
    env = hpcrl.ClusterEnv("CartPole-v1", 4, workers=2, wait="{wait}", step_timeout=1.5)
    env.reset(seed=0)
    env.step(np.zeros(4, dtype=np.int64))
    pids = [r["pid"] for r in env.pool.reports]
    print("PIDS", *pids, flush=True)
    os.kill(pids[1], signal.SIGSTOP)  # alive, its lifeline open: only a bounded wait ends step()
    t = time.time()
    try:
        for _ in range(10000):
            env.step(np.zeros(4, dtype=np.int64))
        raise SystemExit("no error")
    except WorkerStalled as exc:
        print("ERROR", str(exc).splitlines()[0], "|", round(time.time() - t, 2), flush=True)
    t = time.time()
    env.close()
    print("CLOSED", round(time.time() - t, 2), flush=True)
    """
    proc = run_head(tmp_path, code)
    pids: list[int] = []
    try:
        out = ""
        for line in proc.stdout:  # the pids first, so that teardown can always free the stopped worker
            out += line
            if line.startswith("PIDS"):
                pids = [int(p) for p in line.split()[1:]]
                break
        out += finish(proc, timeout=60)
    finally:
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
    err = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert f"worker 1 (rank 2 of the head's communicator, host" in err and f"pid {pids[1]}" in err, err
    assert "worker 0" not in err and "stopped (SIGSTOP" in err and "step_timeout=1.5 s" in err, err
    assert 1.4 < float(err.split()[-1]) < 10, err
    closed = next(line for line in out.splitlines() if line.startswith("CLOSED")).split()
    assert float(closed[1]) < 8, closed  # close() ended the stopped worker: no 10 s wait for mpiexec
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


@pytest.mark.mpi
@pytest.mark.alone
def test_workers_leave_within_seconds_when_the_head_is_killed(tmp_path):
    code = """
    import time, hpcrl
    env = hpcrl.ClusterEnv("CartPole-v1", 4, workers=2)
    env.reset(seed=0)
    print("PIDS", *[r["pid"] for r in env.pool.reports], flush=True)
    time.sleep(120)
    """
    proc = run_head(tmp_path, code)
    line = ""
    deadline = time.time() + 60
    while not line.startswith("PIDS") and time.time() < deadline:
        line = proc.stdout.readline()
    assert line.startswith("PIDS"), line
    pids = [int(p) for p in line.split()[1:]]
    assert all(alive(p) for p in pids)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    t = time.time()
    while any(alive(p) for p in pids) and time.time() - t < 10:
        time.sleep(0.1)
    gone_after = time.time() - t
    os.killpg(proc.pid, signal.SIGKILL)  # nothing of the group may linger, whatever happened
    assert gone_after < 5, f"workers still running {gone_after:.1f} s after the head died"


# ---- AAPS ---------------------------------------------------------------------------------------
def test_visited_state_aaps_kl_matches_closed_forms_and_direction():
    from hpcrl.runtime.roles.aaps import VisitedStateAAPS

    p, q = np.log([[0.5, 0.5]]), np.log([[0.9, 0.1]])
    a = VisitedStateAAPS(delta=0.3, window=4, width=2, obs_shape=(1,), discrete=True)
    a.observe(np.zeros((3, 1)), np.repeat(p, 3, 0), version=0)
    kl = a.estimate(lambda s: np.repeat(q, len(s), 0))
    assert kl == pytest.approx(0.5 * np.log(0.5 / 0.9) + 0.5 * np.log(0.5 / 0.1))  # KL(cached || head)
    assert a.drifted() and not VisitedStateAAPS(0.6, 4, 2, (1,), True).drifted(kl)
    a.observe(np.zeros((1, 1)), q, version=1)  # a sync: older entries no longer describe the cached policy
    assert a.count == 1 and a.estimate(lambda s: np.repeat(q, len(s), 0)) == pytest.approx(0.0, abs=1e-6)
    g = VisitedStateAAPS(delta=0.1, window=8, width=2, obs_shape=(2,), discrete=False)
    g.observe(np.zeros((10, 2)), np.zeros((10, 2)), version=0)  # N(0, 1): mean 0, log-std 0
    assert g.count == 8  # the ring keeps the most recent window states
    assert g.estimate(lambda s: np.tile([1.0, 0.0], (len(s), 1))) == pytest.approx(0.5)  # KL(N(0,1)||N(1,1))


AAPS_PROGRAM = """
import numpy as np, torch, h5py
from torch.distributions import Categorical
import hpcrl

class Fixed(torch.nn.Module):  # a state-independent policy: KL between two of them is known in closed form
    def __init__(self, obs_space, act_space):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(act_space.n))
    def dist(self, obs):
        return Categorical(logits=self.logits.expand(obs.shape[0], -1))

def policy(a):
    m = Fixed(None, type("S", (), {"n": 2})())
    m.logits.data[:] = torch.tensor([a, -a])
    return m

def kl_from_uniform(a):
    q = torch.softmax(torch.tensor([a, -a]), 0)
    return float((0.5 * (torch.log(0.5 / q))).sum())

env = hpcrl.ClusterEnv("CartPole-v1", 4, workers=2, policy=Fixed, kl_threshold=0.05, record="{record}")
env.reset(seed=0)
env.publish(policy(0.0))  # v0: uniform; every worker pulls it before its first step
for _ in range(40):
    obs, r, term, trunc, info = env.step()
assert (info["policy_version"] == 0).all() and env.syncs.tolist() == [1, 1], env.syncs
small = 0.2
assert 0.01 < kl_from_uniform(small) < 0.05
env.publish(policy(small))  # v1: KL(v0 || v1) below delta: nobody pulls
assert np.allclose(env.kl, kl_from_uniform(small), rtol=1e-4), env.kl
acts = []
for _ in range(40):
    obs, r, term, trunc, info = env.step()
    acts.append(info["actions"])
assert (info["policy_version"] == 0).all() and env.syncs.tolist() == [1, 1]
assert 0.3 < np.mean(acts) < 0.7  # still acting with the uniform copy
env.publish(policy(4.0))  # v2: KL(v0 || v2) = {big:.3f} > delta: every worker pulls at its next step
acts = []
for _ in range(40):
    obs, r, term, trunc, info = env.step()
    acts.append(info["actions"])
assert (info["policy_version"] == 2).all() and env.syncs.tolist() == [2, 2], env.syncs
assert np.mean(acts) < 0.05  # logits [4, -4]: action 0 almost always
lp = torch.log_softmax(torch.tensor([4.0, -4.0]), 0).numpy()
assert np.allclose(info["logprob"], lp[info["actions"]], atol=1e-5)
env.close()
with h5py.File("{record}", "r") as f:
    assert f.attrs["kind"] == "hpcrl.clusterenv"
    syncs = f["aaps/syncs"][:]
    assert f["aaps/worker"].shape[0] == 8 and syncs[-2:].tolist() == [2, 2], syncs
    assert f["episodes/return"].shape[0] > 0
print("AAPS OK")
"""


@pytest.mark.mpi
@pytest.mark.slow
def test_aaps_workers_pull_only_when_the_kl_to_the_head_exceeds_delta(tmp_path):
    import torch

    q = torch.softmax(torch.tensor([4.0, -4.0]), 0)
    big = float((0.5 * torch.log(0.5 / q)).sum())
    code = AAPS_PROGRAM.replace("{record}", str(tmp_path / "aaps.h5")).replace("{big:.3f}", f"{big:.3f}")
    out = finish(run_head(tmp_path, code))
    assert "AAPS OK" in out


# ---- batch systems ------------------------------------------------------------------------------
@pytest.mark.slow
def test_attach_without_a_worker_job_times_out_with_one_line(tmp_path):
    import hpcrl
    from hpcrl.clusterenv.connect import ConnectError

    t = time.time()
    with pytest.raises(ConnectError) as info:
        hpcrl.ClusterEnv("CartPole-v1", 2, workers=2, launch="batch", rendezvous=str(tmp_path / "head.json"),
                         timeout=1.5)
    msg = str(info.value)
    assert "\n" not in msg and "0 of 2 workers connected within 2 s" in msg and "head.json" in msg
    assert time.time() - t < 10 and not (tmp_path / "head.json.tmp").exists()


@pytest.mark.parametrize("site", ["local-slurm", "polaris", "perlmutter-cpu"])
def test_worker_job_script_renders_for_slurm_and_pbs_sites(tmp_path, site):
    from hpcrl.clusterenv.batch import plan_workers, render_workers
    from hpcrl.clusterenv.options import ClusterOptions

    opts = ClusterOptions("CartPole-v1", 8, workers=4, launch="batch", site=site,
                          batch={"job_dir": str(tmp_path / "job"), "account": "PROJ", "time": "00:20:00"})
    text = render_workers(plan_workers(opts, site))
    assert "-m hpcrl.clusterenv.worker --rendezvous " + str(tmp_path / "job" / "head.json") in text
    assert ("srun --ntasks=4" in text) == (site != "polaris") and ("#PBS -A PROJ" in text) == (site == "polaris")
    with pytest.raises(ConfigError, match="batch.time"):
        plan_workers(ClusterOptions("CartPole-v1", 8, workers=4, launch="batch", site=site,
                                    batch={"time": "20 minutes", "account": "PROJ"}), site)


@pytest.mark.mpi
@pytest.mark.slurm
@pytest.mark.slow
def test_head_submits_a_slurm_worker_job_and_its_workers_connect(tmp_path, slurm):
    code = f"""
    import numpy as np, hpcrl
    env = hpcrl.ClusterEnv("CartPole-v1", 4, workers=2, launch="batch", site="local-slurm", timeout=120,
                           batch={{"job_dir": "{tmp_path / 'job'}", "env": {{"PYTHONPATH": "{ROOT}"}}}})
    o, _ = env.reset(seed=1)
    total = 0.0
    for _ in range(50):
        o, r, te, tr, info = env.step(np.zeros(4, dtype=np.int64))
        total += r.sum()
    assert o.shape == (4, 4) and total == 200  # CartPole pays 1 per step, 4 envs x 50 steps
    env.close()
    print("BATCH OK")
    """
    # scripts/local_cluster.sh's nodes are network namespaces: its workers speak MPICH's OFI netmod over
    # TCP (the cluster's TaskProlog), so the head on this machine does too, on the bridge (docs/local-cluster.md)
    bridge = Path("/sys/class/net/hpcrl-br0").exists()
    env = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "hpcrl-br0"} if bridge else None
    out = finish(run_head(tmp_path, code, env=env), timeout=180)
    assert "BATCH OK" in out


def test_aaps_record_is_read_by_the_analysis_into_figures_and_a_summary(tmp_path):
    from hpcrl.clusterenv.options import ClusterOptions
    from hpcrl.clusterenv.record import AAPSRecorder

    for delta, pulls in ((0.01, 3), (0.5, 1)):  # a hand-made record per threshold: known syncs and returns
        opts = ClusterOptions("CartPole-v1", 4, workers=2, policy="actor_critic", kl_threshold=delta)
        rec = AAPSRecorder(tmp_path / f"kl-{delta}.h5", opts, [2, 2])
        for version in range(4):
            rec.publish(version, np.array([0.1, 0.2]), np.array([min(version, pulls), min(version, pulls)]),
                        np.array([version, version]))
            for _ in range(10):
                rec.step(np.ones(4), np.array([True, False, False, True]), np.full(4, version))
        rec.close()
    out = tmp_path / "figs"
    done = subprocess.run([sys.executable, str(ROOT / "analysis" / "analyze.py"), str(tmp_path / "kl-0.01.h5"),
                           str(tmp_path / "kl-0.5.h5"), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (out / "aaps_returns.png").stat().st_size > 1000 and (out / "aaps_syncs.png").stat().st_size > 1000
    import csv

    rows = list(csv.DictReader(open(out / "summary.csv")))
    assert [float(r["kl_threshold"]) for r in rows] == [0.01, 0.5]
    assert [float(r["syncs_per_worker"]) for r in rows] == [3.0, 1.0]
    assert all(float(r["final_return"]) == 1.0 and int(r["episodes"]) == 80 for r in rows)


@pytest.mark.mpi
@pytest.mark.slow
def test_the_cleanrl_example_runs_with_cluster_workers(tmp_path):
    for backend in ("cluster",):  # --env-backend gym differs only in make_envs (the full runs: hpcrl bench clusterenv)
        done = subprocess.run([sys.executable, str(ROOT / "examples" / "cleanrl_ppo_clusterenv.py"), "--env-backend",
                               backend, "--total-timesteps", "512", "--num-steps", "64", "--num-envs", "4"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert f"RESULT backend={backend} env=CartPole-v1 reached=False steps=512" in done.stdout, done.stderr[-2000:]
