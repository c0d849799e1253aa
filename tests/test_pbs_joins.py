"""Joining ranks in a PBS job (Polaris, Aurora): ``steps`` is a PALS ``mpiexec --hosts NODE`` on a node of
$PBS_NODEFILE holding none of the job's ranks; ``jobs`` (qsub) is still refused. The launch itself needs a PBS
site: here the argv, the node choice and the refusals are checked."""
from pathlib import Path

import pytest

from hpcrl.join_launch import join_command, join_node, joining_refused
from hpcrl.launchers import PalsMpiexec


def pbs_env(tmp_path: Path, site: str, nodes: list[str]) -> dict[str, str]:
    nodefile = tmp_path / "nodefile"
    # PBS writes one line per rank slot: a node's name repeats
    nodefile.write_text("".join(f"{n}\n{n}\n" for n in nodes))
    return {"PBS_JOBID": "123.polaris-pbs-01", "PBS_NODEFILE": str(nodefile), "HPCRL_SITE": site}


NODES = ["x3001c0s1b0n0.hsn.cm.polaris.alcf.anl.gov", "x3001c0s7b0n0.hsn.cm.polaris.alcf.anl.gov",
         "x3002c0s13b0n0.hsn.cm.polaris.alcf.anl.gov"]


def test_join_node_is_a_spare_node_of_the_nodefile(tmp_path):
    env = pbs_env(tmp_path, "polaris", NODES)
    own = ["x3001c0s1b0n0"]  # gethostname() gives the short name
    assert [join_node(own, s, env) for s in range(3)] == [NODES[1], NODES[2], NODES[1]]
    with pytest.raises(RuntimeError, match="no node of allocation .*nodefile is free"):
        join_node([n.split(".")[0] for n in NODES], 0, env)


@pytest.mark.parametrize("site", ["polaris", "aurora"])
def test_steps_are_pals_mpiexec_on_the_spare_node(tmp_path, site):
    env = pbs_env(tmp_path, site, NODES)
    argv = join_command("steps", 3, [NODES[0]], 1, env, None, ["python", "-m", "x"], tmp_path / "log",
                        setting="actors.elastic")
    assert argv == ["mpiexec", "-n", "3", "--ppn", "3", "--hosts", NODES[2], "python", "-m", "x"]


def test_on_hosts_words_and_bad_hosts():
    assert PalsMpiexec().on_hosts(["a", "b"], 4, 2, 8) == ["mpiexec", "-n", "4", "--ppn", "2", "--depth=8",
                                                          "--cpu-bind", "depth", "--hosts", "a,b"]
    with pytest.raises(ValueError, match="hosts=\\['a'\\]; allowed"):
        PalsMpiexec().on_hosts(["a"], 4, 2)


def test_refusals_under_pbs(tmp_path):
    env = pbs_env(tmp_path, "polaris", NODES)
    assert joining_refused("steps", env) is None
    assert "learners.elastic=jobs" in joining_refused("jobs", env)
    assert "allowed: actors.elastic=steps there, or park" in joining_refused(
        "steps", {"PBS_JOBID": "1"}, "actors.elastic")


def test_steps_refuse_a_slurm_site_in_a_pbs_job(tmp_path):
    env = pbs_env(tmp_path, "perlmutter-cpu", NODES)
    with pytest.raises(RuntimeError, match="launches with srun; allowed: a PALS site"):
        join_command("steps", 1, [NODES[0]], 0, env, None, ["true"], tmp_path / "log")


@pytest.mark.mpi
def test_steps_argv_runs_under_hydra_on_the_spare_node(tmp_path):
    """MPICH's Hydra mpiexec takes the same ``-n --ppn --hosts``: the join argv, with this machine as the
    nodefile's spare node, starts its ranks there (PALS itself needs a PBS site)."""
    import os
    import socket
    import subprocess
    import sys

    from hpcrl.join_launch import step_environment

    here = socket.gethostname()
    env = pbs_env(tmp_path, "aurora", ["busy-node", here])
    probe = [sys.executable, "-c", "from mpi4py import MPI; c = MPI.COMM_WORLD; "
             "print(c.rank, c.size, MPI.Get_processor_name())"]
    argv = join_command("steps", 2, ["busy-node"], 0, env, None, probe, tmp_path / "log")
    assert argv[argv.index("--hosts") + 1] == here
    argv[0] = str(Path(sys.executable).with_name("mpiexec"))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=step_environment(dict(os.environ)))
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:2]) == [f"0 2 {here}", f"1 2 {here}"]
