"""Joining ranks in a PBS job (Polaris, Aurora): ``steps`` is a PALS ``mpiexec --hostfile WHO-N.hosts`` naming a
node of $PBS_NODEFILE that holds none of the job's ranks; ``jobs`` is a one-node job of its own, ``qsub -V -W
block=true WHO-N.pbs`` (a rendered script), ended with ``qdel``; ``hpcrl submit`` asks for the steps' nodes and
exports what the jobs ask for. No PBS here: the argv, the node choice, the rendered scripts and the refusals are
checked, the steps argv runs under MPICH's Hydra mpiexec, and a run joins through a stand-in qsub that runs the
rendered script on this machine (docs/sites.md says what only a PBS site can show)."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hpcrl.config import load_config
from hpcrl.errors import ConfigError
from hpcrl.join_jobs import MIN_WALLTIME, PbsJobs, joining_jobs, walltime
from hpcrl.join_launch import Joiner, join_command, join_node, joining_refused, step_environment
from hpcrl.launchers import PalsMpiexec
from hpcrl.sites import load_site
from hpcrl.submit import plan_job, render

GOLDEN = Path(__file__).parent / "golden"
VENV_BIN = Path(sys.executable).parent


def pbs_env(tmp_path: Path, site: str, nodes: list[str]) -> dict[str, str]:
    nodefile = tmp_path / "nodefile"
    # PBS writes one line per rank slot: a node's name repeats
    nodefile.write_text("".join(f"{n}\n{n}\n" for n in nodes))
    return {"PBS_JOBID": "123.polaris-pbs-01", "PBS_NODEFILE": str(nodefile), "HPCRL_SITE": site}


def jobs_env(tmp_path: Path, site: str = "polaris", ends_in: float = 3600.0) -> dict[str, str]:
    """A door rank's environment in a job that hpcrl submit rendered with elastic=jobs (_pbs.sh.j2's exports)."""
    return {**pbs_env(tmp_path, site, NODES), "HPCRL_JOIN_ACCOUNT": "MyProject", "HPCRL_JOIN_QUEUE": "debug",
            "HPCRL_JOIN_FILESYSTEMS": "home:eagle", "HPCRL_JOB_ENDS_AT": str(time.time() + ends_in)}


NODES = ["x3001c0s1b0n0.hsn.cm.polaris.alcf.anl.gov", "x3001c0s7b0n0.hsn.cm.polaris.alcf.anl.gov",
         "x3002c0s13b0n0.hsn.cm.polaris.alcf.anl.gov"]
JOIN = ["/opt/hpcrl/bin/python", "-m", "hpcrl.runtime.runners.join", "/eagle/MyProject/runs/x", "--group", "1"]


def test_join_node_is_a_spare_node_of_the_nodefile(tmp_path):
    env = pbs_env(tmp_path, "polaris", NODES)
    own = ["x3001c0s1b0n0"]  # gethostname() gives the short name
    assert [join_node(own, s, env) for s in range(3)] == [NODES[1], NODES[2], NODES[1]]
    with pytest.raises(RuntimeError, match="no node of allocation .*nodefile is free"):
        join_node([n.split(".")[0] for n in NODES], 0, env)


@pytest.mark.parametrize("site", ["polaris", "aurora"])
def test_steps_are_pals_mpiexec_on_a_hostfile_naming_the_spare_node(tmp_path, site):
    env = pbs_env(tmp_path, site, NODES)
    log = tmp_path / "actor-0-0.log"
    argv = join_command("steps", 3, [NODES[0]], 1, env, None, ["python", "-m", "x"], log, setting="actors.elastic")
    hosts = tmp_path / "actor-0-0.hosts"
    assert argv == ["mpiexec", "-n", "3", "--ppn", "3", "--hostfile", str(hosts), "python", "-m", "x"]
    assert hosts.read_text() == NODES[2] + "\n"


def test_pals_words_take_the_jobs_nodefile_or_a_hostfile():
    assert PalsMpiexec().prefix(4, 2, 8) == 'mpiexec -n 4 --ppn 2 --depth=8 --cpu-bind depth --hostfile "$PBS_NODEFILE"'
    assert PalsMpiexec(hostfile="/r/joins/group-0-0.hosts").words(4, 2) == [
        "mpiexec", "-n", "4", "--ppn", "2", "--hostfile", "/r/joins/group-0-0.hosts"]
    for bad in ("", "a\nb"):
        with pytest.raises(ValueError, match="hostfile=.*; allowed: a path"):
            PalsMpiexec(hostfile=bad)


def test_refusals_under_pbs(tmp_path):
    env = pbs_env(tmp_path, "polaris", NODES)
    assert joining_refused("steps", env) is None
    assert joining_refused("jobs", env) is None
    assert joining_refused("jobs", {"SLURM_JOB_ID": "7", "HPCRL_SITE": "local-cluster"}) is None
    assert "allowed: actors.elastic=steps or jobs in a job of hpcrl submit, or park" in joining_refused(
        "steps", {"PBS_JOBID": "1"}, "actors.elastic")
    assert "this run is not in a batch job of hpcrl submit" in joining_refused("jobs", {"PBS_JOBID": "1"})
    with pytest.raises(RuntimeError, match="not in a Slurm or PBS batch job of hpcrl submit"):
        joining_jobs({"PBS_JOBID": "1"})


def test_steps_and_jobs_refuse_a_slurm_site_in_a_pbs_job(tmp_path):
    env = {**jobs_env(tmp_path), "HPCRL_SITE": "perlmutter-cpu"}
    for how in ("steps", "jobs"):
        with pytest.raises(RuntimeError, match="launches with srun; allowed: a PALS site"):
            join_command(how, 1, [NODES[0]], 0, env, None, ["true"], tmp_path / "log")


def test_a_joining_job_is_a_blocking_qsub_of_its_rendered_script(tmp_path):
    env = jobs_env(tmp_path, ends_in=1200)
    log = tmp_path / "group-1-0.log"
    argv = join_command("jobs", 3, [NODES[0]], 1, env, None, JOIN, log, "group1")
    script = tmp_path / "group-1-0.pbs"
    assert argv == ["qsub", "-V", "-W", "block=true", str(script)]
    text = script.read_text()
    assert "#PBS -N hpcrl-join-group1\n#PBS -A MyProject\n#PBS -q debug\n#PBS -l select=1:system=polaris\n" in text
    assert "#PBS -l walltime=00:19:" in text or "#PBS -l walltime=00:20:00" in text  # what the run's job has left
    assert f"exec >>{log} 2>&1\n" in text
    assert text.endswith('mpiexec -n 3 --ppn 3 --hostfile "$PBS_NODEFILE" \\\n    ' + " ".join(JOIN) + "\n")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_the_joining_script_matches_its_golden_file(tmp_path):
    """The whole script for a fixed log path and submit time (HPCRL_UPDATE_GOLDEN=1 to accept a change)."""
    env = {**jobs_env(tmp_path, "aurora"), "HPCRL_JOB_ENDS_AT": "1000000", "HPCRL_JOIN_FILESYSTEMS": "home:flare"}
    text = PbsJobs(env, "actors.elastic").render(1, JOIN, Path("/lus/flare/projects/P/runs/x/joins/actor-3-0.log"),
                                                 "hpcrl-join-actor3", now=1000000 - 3723)
    path = GOLDEN / "join-job-aurora.pbs"
    if os.environ.get("HPCRL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    assert "#PBS -l walltime=01:02:03\n" in text


def test_joining_job_walltime_and_bad_exports_are_one_line(tmp_path):
    assert walltime(3723.9) == "01:02:03" and walltime(-50) == walltime(10) == "00:05:00" == walltime(MIN_WALLTIME)
    log = tmp_path / "group-0-0.log"
    env = jobs_env(tmp_path)
    no_end = {k: v for k, v in env.items() if k != "HPCRL_JOB_ENDS_AT"}
    with pytest.raises(RuntimeError, match="learners.elastic=jobs: .*no HPCRL_JOB_ENDS_AT.*allowed: a job of hpcrl "
                                           "submit with learners.elastic=jobs"):
        join_command("jobs", 1, [], 0, no_end, None, JOIN, log)
    hostile = {**env, "HPCRL_JOIN_ACCOUNT": "P\n#PBS -l select=400"}
    with pytest.raises(RuntimeError, match="^learners.elastic=jobs: HPCRL_JOIN_ACCOUNT: .* is not allowed") as err:
        join_command("jobs", 1, [], 0, hostile, None, JOIN, log)
    assert "\n" not in str(err.value).replace("\\n", "")
    assert not (tmp_path / "group-0-0.pbs").exists()


def test_job_id_cancel_and_allocation_row(tmp_path):
    jobs = joining_jobs(jobs_env(tmp_path))
    assert isinstance(jobs, PbsJobs) and jobs.id_suffix == ".qsub"
    # qsub prints the id first; a blocking qsub may add its own lines on stderr (here in the same file)
    assert jobs.job_id("4242.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov\nqsub: wait for job interrupted\n") == \
        "4242.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"
    assert jobs.job_id("") == "" and jobs.job_id("qsub: Job exceeds queue resource limits\n") == ""
    assert jobs.cancel_argv("4242.polaris-pbs-01") == ["qdel", "4242.polaris-pbs-01"]
    row = jobs.row("4242.polaris-pbs-01")
    assert row["job_id"] == b"4242.polaris-pbs-01" and row["nodes"] == 1 and row["site"] == b"polaris"
    slurm = joining_jobs({"SLURM_JOB_ID": "7", "HPCRL_SITE": "local-cluster"})
    assert (slurm.id_suffix, slurm.job_id("99;cluster\n"), slurm.cancel_argv("99")) == (".sbatch", "99",
                                                                                        ["scancel", "99"])


def test_a_given_up_join_deletes_its_job_with_qdel(tmp_path, monkeypatch):
    """The Joiner ends a joining job it gives up on through its backend: qdel with the id qsub printed, then the
    blocking qsub itself."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "qdel").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/qdel.calls\n')
    (fake / "qdel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    joiner = Joiner(tmp_path, "group-0", 0, "jobs", 1, 1.0, None, [NODES[0]], "learners.elastic")
    joiner._jobs = PbsJobs(jobs_env(tmp_path), "learners.elastic")
    joiner._stem = tmp_path / "group-0-0"
    (tmp_path / "group-0-0.qsub").write_text("4242.polaris-pbs-01\n")
    joiner._proc = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the blocking qsub
    code = joiner._stop_step()
    assert (tmp_path / "qdel.calls").read_text() == "4242.polaris-pbs-01\n"
    assert code != 0 and joiner._proc.poll() is not None


def submit_job(site: str, elastic: str, **kwargs):
    cfg = load_config(None, [f"learners.elastic={elastic}", "learners.ranks_per_group=2", "learners.groups=2",
                             "algo.minibatch_size=64"])
    return plan_job(cfg, load_site(site), account="MyProject", run_dir="/eagle/MyProject/runs/x",
                    python="/opt/hpcrl/bin/python", **kwargs)


def test_submit_asks_pbs_for_the_steps_nodes(tmp_path):
    job = submit_job("polaris", "steps", queue="debug-scaling")
    assert (job.nodes, job.join_nodes) == (1, 2)
    text = render(job)
    assert "# 1 node(s) for the ranks, 2 for the joining ranks' mpiexecs" in text
    assert "#PBS -l select=3:system=polaris\n" in text
    # PALS has no --nodes: the ranks fill the nodefile's first node, the joins take the others
    assert job.launch == 'mpiexec -n 5 --ppn 5 --depth=12 --cpu-bind depth --hostfile "$PBS_NODEFILE"'
    assert "HPCRL_JOIN" not in text
    path = tmp_path / "job.pbs"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    with pytest.raises(ConfigError, match=r"--nodes: 1 \+ 2 for the joining ranks outside the polaris debug range 1-2"):
        submit_job("polaris", "steps")


def test_submit_exports_what_the_joining_jobs_ask_for(tmp_path):
    job = submit_job("polaris", "jobs")
    assert (job.join_nodes, job.joining_jobs) == (0, True)
    text = render(job)
    assert "#PBS -l select=1:system=polaris\n" in text
    assert ("export HPCRL_JOIN_ACCOUNT=MyProject HPCRL_JOIN_QUEUE=debug HPCRL_JOIN_FILESYSTEMS=home:eagle\n"
            "export HPCRL_JOB_ENDS_AT=$(( $(date +%s) + 1800 ))\n") in text
    # the exports are set before the ranks start: the door ranks read them
    assert text.index("HPCRL_JOB_ENDS_AT") < text.index("mpiexec -n 5")
    ends = subprocess.run(["bash", "-c", text[text.index("export HPCRL_JOIN"):text.index("))\n") + 3]
                           + "echo $HPCRL_JOB_ENDS_AT"], capture_output=True, text=True).stdout
    assert abs(int(ends) - (time.time() + 1800)) < 60
    assert submit_job("aurora", "jobs", queue="prod").joining_jobs  # a queue whose limits hpcrl does not know


@pytest.mark.parametrize("site, queue, message", [
    ("polaris", "debug-scaling", "up to 2 joining job.s. beside the run's own, and --queue debug-scaling on polaris "
                                 "holds 1 job.s. a user; allowed: a queue that takes them .debug, preemptable., "
                                 "or learners.elastic=steps"),
    ("aurora", None, "--queue debug on aurora holds 1 job.s. a user"),
    ("aurora", "debug-scaling", "each join is a one-node job in --queue debug-scaling, which takes 2-256 nodes on "
                                "aurora; allowed: a queue that takes them .none of those hpcrl knows on aurora., "
                                "or learners.elastic=steps"),
])
def test_submit_refuses_jobs_in_a_queue_that_cannot_hold_them(site, queue, message):
    with pytest.raises(ConfigError, match=f"^learners.elastic=jobs: .*{message}"):
        submit_job(site, "jobs", queue=queue)


@pytest.mark.mpi
def test_steps_argv_runs_under_hydra_on_the_spare_node(tmp_path):
    """MPICH's Hydra mpiexec takes the same ``-n --ppn --hostfile``: the join argv, with this machine as the
    nodefile's spare node, starts its ranks there (PALS itself needs a PBS site)."""
    import socket

    here = socket.gethostname()
    env = pbs_env(tmp_path, "aurora", ["busy-node", here])
    probe = [sys.executable, "-c", "from mpi4py import MPI; c = MPI.COMM_WORLD; "  # one print: no interleaving
             "seen = c.gather(f'{c.rank} {c.size} {MPI.Get_processor_name()}'); c.rank or print('|'.join(seen))"]
    argv = join_command("steps", 2, ["busy-node"], 0, env, None, probe, tmp_path / "group-0-0.log")
    assert Path(argv[argv.index("--hostfile") + 1]).read_text() == here + "\n"
    argv[0] = str(VENV_BIN / "mpiexec")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=step_environment(dict(os.environ)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"0 2 {here}|1 2 {here}"


FAKE_QSUB = """#!/bin/bash
# stands in for PBS Pro's `qsub -V -W block=true SCRIPT`: prints a job id, runs SCRIPT as that job on this machine
# (its nodefile: this host) and exits with its status
echo "$*" >> {calls}
id="$((4242 + $(wc -l < {calls}))).fakepbs"
echo "$id"
hostname > {folder}/nodefile."$id"
PBS_JOBID="$id" PBS_NODEFILE={folder}/nodefile."$id" exec bash "${{@: -1}}"
"""


@pytest.mark.mpi
@pytest.mark.slow
def test_a_group_joins_as_a_pbs_job_through_a_stand_in_qsub(tmp_path):
    """learners.elastic=jobs in a (pretend) PBS job: the door renders the joining job's script, submits it with
    ``qsub -V -W block=true``, the script's PALS line (Hydra here) starts the group's second rank, which joins,
    pushes and leaves; the joining job is an allocations row of its own."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "qsub").write_text(FAKE_QSUB.format(calls=tmp_path / "qsub.calls", folder=tmp_path))
    (fake / "qsub").chmod(0o755)
    (tmp_path / "nodefile").write_text(subprocess.run(["hostname"], capture_output=True, text=True).stdout)
    run_dir = tmp_path / "run"
    data = {"name": "pbs-jobs", "env": {"id": "CartPole-v1", "num_envs": 2},
            "actors": {"count": 1, "fragment_length": 32},
            "learners": {"groups": 1, "ranks_per_group": 2, "elastic": "jobs"},
            "algo": {"name": "ppo", "train_batch_size": 256, "minibatch_size": 64, "num_sgd_iter": 2},
            # the group's first batch waits for its join: a few rounds after it show the pushes admitted
            "stop": {"total_env_steps": 10_000_000, "target_return": None, "max_rounds": 4},
            "io": {"run_dir": str(run_dir), "flush_seconds": 0.5, "checkpoint_every": 1000},
            "launch": {"timeout_seconds": 240}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
    env.update(PATH=f"{fake}:{VENV_BIN}:{env['PATH']}", PBS_JOBID="77.fakepbs",
               PBS_NODEFILE=str(tmp_path / "nodefile"), HPCRL_SITE="aurora", HPCRL_JOIN_ACCOUNT="MyProject",
               HPCRL_JOIN_QUEUE="prod", HPCRL_JOIN_FILESYSTEMS="home:flare", HPCRL_JOB_ENDS_AT=str(time.time() + 3600))
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", "-q", str(tmp_path / "cfg.yaml")], env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    from test_joining import events

    from hpcrl.io import read_table

    script = run_dir / "joins" / "group-0-0.pbs"
    assert (tmp_path / "qsub.calls").read_text() == f"-V -W block=true {script}\n"
    assert "#PBS -l select=1\n#PBS -l place=scatter:excl\n" in script.read_text()
    assert (run_dir / "joins" / "group-0-0.qsub").read_text().splitlines()[0] == "4243.fakepbs"
    assert "hpcrl: joining job 4243.fakepbs on" in (run_dir / "joins" / "group-0-0.log").read_text()
    got = [(a, r) for g, a, r in events(run_dir / "run.h5") if g == 0]
    assert ("joined", "job_step") in got and ("left", "job_step") in got, got
    rows = read_table(run_dir / "run.h5", "allocations")
    assert [j.decode() for j in rows["job_id"]] == ["77.fakepbs", "4243.fakepbs"]
    assert list(rows["nodes"]) == [1, 1] and set(rows["site"]) == {b"aurora"}
    assert read_table(run_dir / "run.h5", "gradients")["admitted"].sum() > 0
