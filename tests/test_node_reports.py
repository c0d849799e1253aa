"""Per-node reports (``actors.reports: node`` and ``summary``, hpcrl/runtime/transport/node_reports.py).

- the relay under real concurrency (tests/mpi_programs/node_reports.py): every report reaches rank 0 once, in
  its actor's order, batched, within a short bound, and a relay waiting on a late member beats its heartbeat;
- a whole MPI job on 2 "nodes" (MPICH's ``MPIR_CVAR_NUM_CLIQUES``: ranks of one clique share memory, as on one
  node) records the same fragments and episodes with per-node reports and with per-node summaries (the rows in the
  nodes' own files, joined by ``read_table``) as with per-fragment ones, and every fragment in the actors' trajectory
  files has one row; the same in virtual time (a profile of 2 actor nodes);
- a node's reports as columns make the rows the reports make one by one;
- a relay stopped mid-job (SIGSTOP) ends the job within seconds, the watchdog naming it, not the actors waiting on it;
- bad input: one line, exit 2; ``hpcrl bench node-reports`` measures both modes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from mpi_programs.launcher import run_mpi
from test_parameter_watchdog import Job, kill_left

from hpcrl.cli import main as cli_main
from hpcrl.io import read_table, read_trajectory
from hpcrl.io.node_file import node_files
from hpcrl.io.readers import read_row_counts
from hpcrl.io.schema import traj_filename
from hpcrl.runtime.messages import PARK_REASON, ActorParked, Episode, FragmentReport, NodeReports
from hpcrl.runtime.record.rows import RowBuffer

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = str(ROOT / "hpcrl" / "configs" / "cartpole.yaml")
ACTORS, T, N = 4, 16, 2
JOB = [f"actors.count={ACTORS}", f"env.num_envs={N}", f"actors.fragment_length={T}", "actors.on_policy=true",
       "aggregation.policy=sync", "algo.train_batch_size=128", "algo.minibatch_size=64", "algo.num_sgd_iter=2",
       "stop.max_rounds=4", "io.log_seconds=60", "launch.timeout_seconds=100", "learners.push=gradient"]
"""One fragment of each actor per batch, 4 versions a batch: on-policy sync makes every fragment before the last
version the same whatever the timing."""
LAST_VERSION = 16
TWO_NODES = {"MPIR_CVAR_NUM_CLIQUES": "2", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo"}
"""6 ranks in 2 cliques, round-robin: actors 0 and 2 (ranks 2, 4) on one node, 1 and 3 on the other; between the
cliques OFI over TCP, as between the local cluster's nodes (UCX there stalled a job for a minute or more about one
run in eight on the 2-core VM, with either report mode)."""


@pytest.mark.mpi
def test_a_node_relay_passes_every_report_to_rank_0_once_in_order():
    said = run_mpi(7, "node_reports", 2, 150, timeout=60)  # 6 actors on 2 nodes
    line = next(l for l in said.splitlines() if l.startswith("OK node_reports"))
    fields = dict(kv.split("=") for kv in line.split()[2:])
    assert int(fields["messages"]) < int(fields["reports"]) / 2, line
    assert int(fields["max_delay_ms"]) < 5000, line  # a relay parked for 0.3 s still polls every 50 ms (~100 ms)


class _Tables:
    """A run file that keeps what each table was given, as its rows."""

    def __init__(self):
        self.rows: dict[str, list[dict]] = {}

    def append(self, table, rows):
        if isinstance(rows, dict):  # columns
            rows = [dict(zip(rows, values)) for values in zip(*(np.asarray(v).tolist() for v in rows.values()))]
        self.rows.setdefault(table, []).extend({k: np.asarray(v).item() for k, v in r.items()} for r in rows)


def test_a_nodes_reports_as_columns_make_the_rows_of_the_reports():
    def report(actor, i, ended, normalizer):
        episodes = tuple(Episode(time=10.0 + i, actor=actor, env_index=e, episode_return=1.5 * e, length=3 + e,
                                 policy_version=i) for e in range(ended))
        return FragmentReport(time=float(i), actor=actor, fragment=i, steps=8, sample_seconds=0.1 * i,
                              transport_wait_seconds=0.0, weight_sync_seconds=0.01, policy_version=i, group=i % 2,
                              episodes=episodes, normalizer=normalizer)

    parked = ActorParked(time=5.0, actor=1, parked_seconds=1.0, cpu_seconds=0.0, active_actors=2,
                         reason=PARK_REASON["woken"])
    batch = [report(0, 0, 2, {"n": 0}), parked, report(1, 0, 0, {"n": 0}), report(0, 1, 1, {"n": 1}),
             report(0, 2, 0, None)]
    message = NodeReports.of(7, batch)
    assert message.reports == (parked,) and len(message.fragments) == 4
    assert message.fragments.normalizers == {0: {"n": 1}, 1: {"n": 0}}  # only an actor's newest travels
    one, block = RowBuffer(_Tables()), RowBuffer(_Tables())
    for r in batch:
        if type(r) is FragmentReport:
            one.add("actors", r.row())
            for e in r.episodes:
                one.add("episodes", e.row())
    block.add_columns("actors", message.fragments.actors)
    block.add_columns("episodes", message.fragments.episodes)
    one.flush()
    block.flush()
    assert block.run_file.rows == one.run_file.rows and len(one.run_file.rows["episodes"]) == 3


def _job(tmp_path: Path, reports: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hpcrl", "run", CARTPOLE, *[a for o in [
        *JOB, f"actors.reports={reports}", f"io.run_dir={tmp_path / reports}"] for a in ("-o", o)]]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, **TWO_NODES, UCX_LOG_LEVEL="error"))


def _rows(run_dir: Path) -> tuple[list, list]:
    """The fragments and episodes sampled before the last version (those after it depend on when STOP came)."""
    a = read_table(run_dir / "run.h5", "actors")
    e = read_table(run_dir / "run.h5", "episodes")
    frags = sorted((int(x), int(f), int(s), int(v)) for x, f, s, v in
                   zip(a["actor"], a["fragment"], a["steps"], a["policy_version"]) if v < LAST_VERSION)
    episodes = sorted((int(x), int(i), float(r), int(n), int(v)) for x, i, r, n, v in
                      zip(e["actor"], e["env_index"], e["return"], e["length"], e["policy_version"])
                      if v < LAST_VERSION)
    return frags, episodes


@pytest.mark.mpi
@pytest.mark.slow
def test_per_node_reports_record_the_rows_of_per_fragment_reports(tmp_path):
    modes = ("fragment", "node", "summary")
    for pair in (modes[:2], modes[2:]):  # two side by side at most (mostly start-up): a test may run beside this one
        jobs = {mode: _job(tmp_path, mode) for mode in pair}
        for mode, proc in jobs.items():
            out, _ = proc.communicate(timeout=150)
            assert proc.returncode == 0, f"actors.reports={mode}:\n{out[-3000:]}"
    (frags, episodes), *others = (_rows(tmp_path / m) for m in modes)
    assert len(frags) == ACTORS * LAST_VERSION // 4 and episodes
    for mode, (node_frags, node_episodes) in zip(modes[1:], others):
        assert node_frags == frags and node_episodes == episodes, mode
        _every_fragment_once(tmp_path / mode)
    assert sorted(node_files(tmp_path / "summary")) == [2, 3]  # each node's relay: its first actor rank
    assert read_row_counts(tmp_path / "summary" / "run.h5")["actors"] == 0  # rank 0 wrote none of them


def _every_fragment_once(run_dir: Path) -> None:
    """Every fragment and episode of the trajectory files once in the record, after the last version too."""
    a, e = read_table(run_dir / "run.h5", "actors"), read_table(run_dir / "run.h5", "episodes")
    for actor in range(ACTORS):
        traj = read_trajectory(run_dir / traj_filename(actor))
        mine = np.asarray(a["actor"]) == actor
        assert sorted(np.asarray(a["fragment"])[mine]) == list(range(len(traj["rewards"]) // (T * N))), actor
        ended = int(((np.asarray(traj["terminated"]) + np.asarray(traj["truncated"])) > 0).sum())
        assert int((np.asarray(e["actor"]) == actor).sum()) == ended, actor


def _holder(path: Path) -> int | None:
    """PID of the process that holds ``path`` open (an actor's trajectory file: the actor rank itself)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and any(os.readlink(fd) == str(path) for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:  # another user's process, or one that just ended
            continue
    return None


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.alone  # the watchdog's bound: a test beside it could starve another rank past it
def test_a_stopped_relay_ends_the_job_naming_it(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({
        "name": "relay", "env": {"id": "CartPole-v1", "num_envs": N},
        "actors": {"count": ACTORS, "fragment_length": T, "reports": "node"},
        "algo": {"name": "ppo", "train_batch_size": 128, "minibatch_size": 64, "num_sgd_iter": 1},
        "stop": {"total_env_steps": 10_000_000}, "io": {"run_dir": str(run_dir), "log_seconds": 0.2},
        "launch": {"watchdog_warn_seconds": 2.0, "watchdog_seconds": 4.0, "timeout_seconds": 120}}))
    for k, v in TWO_NODES.items():
        monkeypatch.setenv(k, v)
    job, pid = Job(config), None
    try:
        job.wait_for(job.progressing, "a progress line")
        pid = job.wait_for(lambda: _holder(run_dir / traj_filename(0)), "actor 0")  # rank 2: its node's relay
        os.kill(pid, signal.SIGSTOP)
        job.end_within(20.0)
    finally:
        kill_left(pid)
    out = job.output()
    ended = [line for line in out.splitlines() if "ending the job" in line]
    assert job.proc.returncode != 0 and ended and "rank 2 (actor on" in ended[0], out[-3000:]


def _two_actor_nodes(tmp_path: Path) -> Path:
    """this-machine's costs on 3 nodes of 2 cores: rank 0 and the learner on the first, 2 actors on each other."""
    profile = yaml.safe_load((ROOT / "hpcrl" / "cluster_profiles" / "this-machine.yaml").read_text())
    profile.update(name="three-small-nodes", oversubscribe=False,
                   nodes=[{"name": "small", "count": 3, "cores": 2, "gpus": 0, "cpu_speed": 1.0, "price_per_hour": 0.0}])
    path = tmp_path / "three-small-nodes.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


@pytest.mark.slow
def test_per_node_reports_in_virtual_time_record_the_rows_of_per_fragment_reports(tmp_path):
    profile = _two_actor_nodes(tmp_path)
    modes = ("fragment", "node", "summary")
    for mode in modes:
        overrides = [*JOB, f"actors.reports={mode}", f"io.run_dir={tmp_path / mode}", f"launch.profile={profile}"]
        assert cli_main(["run", CARTPOLE, "--runner", "sim", *[a for o in overrides for a in ("-o", o)]]) == 0
    (frags, episodes), *others = (_rows(tmp_path / m) for m in modes)
    assert len(frags) == ACTORS * LAST_VERSION // 4 and episodes
    for mode, (node_frags, node_episodes) in zip(modes[1:], others):
        assert node_frags == frags and node_episodes == episodes, mode
        _every_fragment_once(tmp_path / mode)
    assert len(node_files(tmp_path / "summary")) == 2


@pytest.mark.parametrize("args, says", [
    (["--runner", "serial", "-o", "actors.reports=node"], "actors.reports=node: launch.runner=serial runs every"),
    (["--runner", "serial", "-o", "actors.reports=summary"], "actors.reports=summary: launch.runner=serial runs"),
    (["-o", "actors.reports=rank"], "actors.reports"),
])
def test_reports_the_job_cannot_have_are_one_line(args, says, capsys):
    assert cli_main(["run", CARTPOLE, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


@pytest.mark.mpi
@pytest.mark.slow
def test_the_bench_measures_every_mode_on_the_same_reports(capsys):
    from hpcrl.bench.node_reports import main

    assert main(["--actors", "2", "--nodes", "1", "--reports", "20", "--pace-ms", "1"]) == 0
    rows = {r[0]: r for r in (line.split() for line in capsys.readouterr().out.splitlines()[1:])}
    assert int(rows["fragment"][3]) == 40 and float(rows["fragment"][4]) == 1.0  # a message per report
    assert int(rows["node"][3]) < 40 and float(rows["node"][4]) > 1.0  # the node's 2 actors' reports together
    assert int(rows["summary"][3]) < 40 and float(rows["summary"][4]) > 1.0  # one summary per flush
    assert all(float(rows[m][i]) > 0 for m in rows for i in (7, 10))  # rank 0's CPU per env step, with the record
    assert float(rows["summary"][12]) > 0 == float(rows["node"][12])  # the relay's CPU for the node file's rows


@pytest.mark.slow
def test_a_resumed_summary_job_cuts_its_node_files_to_the_checkpoint_and_records_every_fragment_once(tmp_path):
    """In virtual time: 2 rounds, then rows a crash would leave past the checkpoint (in a node file it counted, and a
    node file it never heard of), then --resume for 2 more: the node files are cut back, the relays append to
    them, and the joined record holds every fragment of the trajectory files once."""
    from hpcrl.io.node_file import NodeFile

    run_dir = tmp_path / "run"
    overrides = [*JOB, "actors.reports=summary", f"io.run_dir={run_dir}", f"launch.profile={_two_actor_nodes(tmp_path)}",
                 "stop.max_rounds=2"]
    assert cli_main(["run", CARTPOLE, "--runner", "sim", *[a for o in overrides for a in ("-o", o)]]) == 0
    files = node_files(run_dir)
    assert len(files) == 2
    before = {relay: read_row_counts_of(path) for relay, path in files.items()}
    relay = min(files)
    stray = {"time": 1.0, "actor": 0, "fragment": 99, "steps": T * N, "sample_seconds": 0.1,
             "transport_wait_seconds": 0.0, "weight_sync_seconds": 0.0, "policy_version": 99, "group": 0}
    for path in (files[relay], run_dir / "nodes" / "node-00099.h5"):
        node = NodeFile.open_append(path) if path.exists() else NodeFile.create(run_dir, 99)
        node.append("actors", stray)
        node.append("episodes", {"time": 1.0, "actor": 0, "env_index": 0, "return": 1.0, "length": 1,
                                 "policy_version": 99, "env_steps": 0})
        node.close()
    assert cli_main(["run", "--resume", str(run_dir), "-o", "stop.max_rounds=4"]) == 0
    after = {relay: read_row_counts_of(path) for relay, path in node_files(run_dir).items()}
    assert after[99] == {"actors": 0, "episodes": 0}  # written after the checkpoint: cut to nothing
    assert all(after[r]["actors"] > before[r]["actors"] for r in before)  # the relays went on in their files
    a = read_table(run_dir / "run.h5", "actors")
    assert 99 not in a["fragment"].tolist()
    _every_fragment_once(run_dir)


def read_row_counts_of(path: Path) -> dict[str, int]:
    import h5py

    with h5py.File(path, "r", swmr=True, locking=False) as f:
        return {t: int(f[t].attrs["committed_rows"]) for t in ("actors", "episodes")}
