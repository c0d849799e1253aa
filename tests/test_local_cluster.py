"""The default job across two nodes of the local cluster (scripts/local_cluster.sh), through hpcrl submit.

Each node of that cluster is a network and UTS namespace with its own hostname and address on a bridge,
so ranks on two nodes talk over TCP as on a real cluster, and slurmdbd keeps the accounting. The
cluster tests use the Slurm that answers ``sinfo`` if it is that cluster (as in CI, where .ci/run starts
it), start it as root if no Slurm runs (tests/slurm_fixture.py), and skip with the reason otherwise.
The bad-input tests need no cluster: they fail before anything is written or submitted.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
from slurm_fixture import slurm, wait_for  # noqa: F401 - slurm: the session fixture

from hpcrl.io import read_table, read_trajectories, read_trajectory, traj_filename
from hpcrl.io.readers import read_row_counts, read_trajectory_steps
from hpcrl.io.recovery import is_truncated, writer_has_open

ROOT = Path(__file__).resolve().parent.parent
STEPS = 2000  # a fixed budget: the job checks the plumbing across nodes, not the learning
BUDGET = ["-o", f"stop.total_env_steps={STEPS}", "-o", "stop.target_return=null", "-o", "io.log_seconds=1"]
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def hpcrl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=timeout)


def job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=20).stdout
    m = re.search(r"\bJobState=(\S+)", out)
    return m[1] if m and m[1] in DONE else ""


def sacct_rows(job_id: str) -> dict[str, dict[str, str]]:
    """sacct's rows for the job and its steps, keyed by JobID (ID, ID.batch, ID.0)."""
    fields = ["JobID", "NNodes", "ElapsedRaw", "State", "NodeList"]
    out = subprocess.run(["sacct", "-j", job_id, "-n", "-P", "-o", ",".join(fields)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    rows = [dict(zip(fields, line.split("|"))) for line in out.stdout.splitlines() if line]
    return {row["JobID"]: row for row in rows}


def link_bytes(node: str, direction: str) -> int:
    """Bytes the host's end of node K's veth pair (hpcrl-vK) has received from / sent to the node."""
    return int(Path(f"/sys/class/net/hpcrl-v{node.removeprefix('node')}/statistics/{direction}_bytes").read_text())


@pytest.fixture(scope="module")
def cluster(slurm):  # noqa: F811 - the session fixture
    """The local cluster with at least two idle-able nodes and accounting, or a skip saying why not."""
    nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N"], capture_output=True, text=True,
                           timeout=20).stdout.split()
    if not {"node1", "node2"} <= set(nodes) or not Path("/sys/class/net/hpcrl-br0").exists():
        pytest.skip(f"the Slurm running here is not a 2+ node scripts/local_cluster.sh cluster (nodes: {nodes}); "
                    "start it with `sudo scripts/local_cluster.sh start`")
    if subprocess.run(["sacct", "-n", "-X"], capture_output=True, timeout=30).returncode:
        pytest.skip("sacct does not answer: the running cluster has no accounting database")


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
def test_default_job_on_two_nodes(cluster, tmp_path):
    run_dir = tmp_path / "run"
    links = {node: (link_bytes(node, "rx"), link_bytes(node, "tx")) for node in ("node1", "node2")}
    started = time.monotonic()
    # as docs/sites.md says: save the --dry-run script, submit it as saved (its first start makes the job folder)
    script = hpcrl("submit", "--site", "local-cluster", "--nodes", "2", "--run-dir", str(run_dir), "--dry-run",
                   *BUDGET)
    assert script.returncode == 0 and not (tmp_path / "run.job").exists(), script.stderr
    (tmp_path / "job.sh").write_text(script.stdout)
    out = subprocess.run(["sbatch", "--parsable", "job.sh"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    state = wait_for(lambda: job_state(job_id), 240, f"job {job_id} to finish")
    wall = time.monotonic() - started
    log = (tmp_path / f"slurm-{job_id}.out").read_text()  # the folder sbatch ran in
    assert state == "COMPLETED", log[-3000:]
    assert f"stop.total_env_steps={STEPS} reached" in log

    # ranks on both hostnames, each actor's file in the run directory
    ranks = read_table(run_dir / "run.h5", "rank_map")
    nodes = [n.decode() for n in ranks["node"]]
    assert set(nodes) == {"node1", "node2"}, nodes
    actors = [(int(i), node) for role, i, node in zip(ranks["role"], ranks["index"], nodes) if role == 2]
    learner_nodes = {node for role, node in zip(ranks["role"], nodes) if role == 1}
    steps = {}
    for index, _ in actors:
        path = run_dir / traj_filename(index)
        assert path.is_file() and not writer_has_open(path) and not is_truncated(path), path
        steps[index] = read_trajectory_steps(path)
        assert steps[index] > 0
    # the record is whole: run.h5 closed cleanly, its trajectory view holds every actor's steps
    assert not is_truncated(run_dir / "run.h5") and not writer_has_open(run_dir / "run.h5")
    view = read_trajectories(run_dir / "run.h5", ["policy_version"])["policy_version"]
    assert view.shape[0] == len(actors), (view.shape, actors)
    assert int((view >= 0).sum()) == sum(steps.values()) >= STEPS, (int((view >= 0).sum()), steps)
    assert len(read_table(run_dir / "run.h5", "episodes")["return"]) > 0

    # MPI crossed the bridge: actors on another node than the learner sent their fragments over it, and
    # read the weights (RMA on rank 0's window) through it; shared memory would leave the links idle
    with h5py.File(run_dir / "run.h5", "r", locking=False) as f:
        weight_bytes = 4 * int(f.attrs["num_params"])
    remote = [(i, node) for i, node in actors if node not in learner_nodes]
    assert remote, f"every actor shares a node with a learner: {nodes}"
    for i, node in remote:
        obs = read_trajectory(run_dir / traj_filename(i), ["obs"])["obs"]
        sent = link_bytes(node, "rx") - links[node][0]
        received = link_bytes(node, "tx") - links[node][1]
        assert sent >= obs.nbytes, (node, sent, obs.nbytes)  # at least the observations
        assert received >= weight_bytes, (node, received)

    # accounting: the job and its MPI step on two nodes, with their elapsed seconds
    def accounted():
        rows = sacct_rows(job_id)
        done = rows.get(job_id, {}).get("State") == "COMPLETED" and f"{job_id}.0" in rows
        return rows if done else None

    rows = wait_for(accounted, 60, f"sacct to report job {job_id}")
    for key in (job_id, f"{job_id}.0"):
        assert rows[key]["NNodes"] == "2" and rows[key]["NodeList"] == "node[1-2]", rows[key]
    node_seconds = 2 * int(rows[job_id]["ElapsedRaw"])
    assert 0 < node_seconds <= 2 * (wall + 5), (rows, wall)

    # hpcrl analyze reads the record written from two nodes: every episode, and the updates
    out = hpcrl("analyze", str(run_dir), "--out", str(tmp_path / "analysis"), "--no-html", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = (tmp_path / "analysis" / "summary.md").read_text()
    counts = read_row_counts(run_dir / "run.h5")
    assert f"| episodes | {counts['episodes']:,} |" in summary, summary[:1500]
    assert f"| updates | {counts['updates']:,} |" in summary and counts["updates"] > 0, summary[:1500]
    # ... and bills the job as sacct does: its allocation's node-seconds, kept beside the run (issue 26 item 3)
    alloc = read_table(run_dir / "run.h5", "allocations")
    assert [j.decode() for j in alloc["job_id"]] == [job_id] and alloc["site"][0] == b"local-cluster", alloc
    assert int(alloc["nodes"][0]) == 2
    assert f"| billed node-seconds (sacct) | {node_seconds:,} |" in summary, summary[:3000]
    assert f"| {job_id} | COMPLETED | 1 | 2 | {int(rows[job_id]['ElapsedRaw']):,} | {node_seconds:,} |" in summary
    assert (run_dir / "accounting.json").is_file()


@pytest.mark.parametrize("flags, message", [
    (["--nodes", "17", "-o", "actors.count=20"], "--nodes: 17 outside the local-cluster debug range 1-16"),
    (["--queue", "gpu"], "--queue: local-cluster has no partition 'gpu'; it has debug"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(flags, message, tmp_path):
    run_dir = tmp_path / "run"
    out = hpcrl("submit", "--site", "local-cluster", "--run-dir", str(run_dir), *flags)
    assert out.returncode == 2 and out.stderr.strip() == f"hpcrl submit: error: {message}", out.stderr
    assert out.stdout == "" and not list(tmp_path.iterdir())  # no job directory, no script: nothing to submit


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.slow
def test_parsl_workflow_on_two_nodes(cluster, tmp_path):
    """workflows/train.py --site local-cluster: a 2-node Parsl block, the app's srun step across both nodes (the
    one-node --site local-slurm uses the same Parsl config: this test covers it)."""
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, str(ROOT / "workflows" / "train.py"), "--site", "local-cluster",
                          "--nodes", "2", "--run-dir", str(run_dir), *BUDGET],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    app_out = tmp_path / "run.job" / "app.out"
    log = app_out.read_text() if app_out.exists() else ""
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:] + log[-2000:]
    assert "4 ranks on 2 node(s)" in out.stdout, out.stdout
    assert f"stop.total_env_steps={STEPS} reached" in log, log[-3000:]
    nodes = {n.decode() for n in read_table(run_dir / "run.h5", "rank_map")["node"]}
    assert nodes == {"node1", "node2"}
    parsl_log = next((tmp_path / "run.job").glob("parsl/*/parsl.log")).read_text()
    assert "Creating process with command 'sbatch " in parsl_log  # the block really was a Slurm job
    assert "mpi_launcher='srun'" in parsl_log or "mpi_launcher: srun" in parsl_log
