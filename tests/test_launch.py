"""launch: the command lines that start the ranks, and detecting that we already are a rank."""
import os
import stat

import pytest

from hpcrl import launch
from hpcrl.config import ContainerConfig, LaunchConfig
from hpcrl.errors import ConfigError


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"PMI_RANK": "3", "PMI_SIZE": "8"}, (3, 8)),
    ({"PMI_RANK": "0", "PMI_SIZE": "1"}, None),  # a singleton is not a job of ranks
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, (1, 4)),
    ({"SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "6", "SLURM_NTASKS": "6"}, (2, 6)),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "6"}, None),  # the batch script itself, not an srun step
    ({"PALS_RANKID": "5", "PALS_SIZE": "16"}, (5, 16)),
])
def test_job_rank_detection(environ, expected):
    assert launch.job_rank(environ) == expected


def _fake_exe(path):
    path.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_mpiexec_next_to_the_interpreter_is_preferred(tmp_path, monkeypatch):
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    mine = _fake_exe(bindir / "mpiexec")
    other = tmp_path / "elsewhere"
    other.mkdir()
    _fake_exe(other / "mpiexec")
    monkeypatch.setenv("PATH", str(other))
    assert launch.find_mpiexec(LaunchConfig(), python=str(bindir / "python")) == str(mine)
    assert launch.find_mpiexec(LaunchConfig(), python=str(tmp_path / "nobin" / "python")) == str(other / "mpiexec")
    assert launch.mpi_flavour(str(mine)) == "mpich"


def test_no_mpiexec_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        launch.find_mpiexec(LaunchConfig(), python=str(tmp_path / "python"))
    msg = str(info.value)
    assert "pip install mpich" in msg and "module" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="launch.mpiexec"):
        launch.find_mpiexec(LaunchConfig(mpiexec=str(tmp_path / "no" / "mpiexec")))


def test_local_command_composition(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    cfg = LaunchConfig(mpiexec_args=["-bind-to", "none"])
    cmd = launch.local_command(cfg, 4, "/runs/x", mpiexec="/v/bin/mpiexec", flavour="mpich",
                               python="/v/bin/python", progress="pipe")
    assert cmd == ["/v/bin/mpiexec", "-n", "4", "-bind-to", "none", "/v/bin/python", "-m", "hpcrl.runtime.runners.mpi",
                   "/runs/x", "--progress=pipe"]
    cmd = launch.local_command(LaunchConfig(), 4, "/runs/x", mpiexec="mpiexec", flavour="openmpi",
                               python="python", resume=True)
    assert cmd[:4] == ["mpiexec", "-n", "4", "--oversubscribe"] and cmd[-1] == "--resume"


def test_one_rank_command_in_a_container():
    """The argv every launcher starts (local mpiexec, batch scripts, Parsl apps); the site launch lines in test_submit."""
    c = ContainerConfig(image="/images/hpcrl.sif", binds=["/lus/proj:/data"], gpu=True)
    cmd = launch.rank_command("/runs/x", python="/v/bin/python", container=c, binds=["/opt"])
    assert cmd[:6] == ["apptainer", "exec", "--nv", "--bind", "/lus/proj:/data", "--bind"]
    assert cmd[6:9] == ["/opt", "--bind", "/runs"]  # the site's binds, then the run directory's parent
    assert cmd[9:] == ["/images/hpcrl.sif", "python3", "-m", "hpcrl.runtime.runners.mpi", "/runs/x", "--progress=plain"]
    shifter = launch.rank_command("/runs/x", resume=True, container=ContainerConfig(runtime="shifter", image="img:1"))
    assert shifter == ["shifter", "--image=img:1", "--module=mpich",  # no volume: shifter mounts scratch itself
                       "python3", "-m", "hpcrl.runtime.runners.mpi", "/runs/x", "--progress=plain", "--resume"]
    local = launch.local_command(LaunchConfig(container=c), 4, "/runs/x", mpiexec="mpiexec", flavour="mpich")
    assert local[:5] == ["mpiexec", "-n", "4", "apptainer", "exec"]
    assert local[-4:] == ["-m", "hpcrl.runtime.runners.mpi", "/runs/x", "--progress=plain"]


def test_rank_environment_keeps_explicit_values():
    env = launch.rank_environment({"OMP_NUM_THREADS": "4", "PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == "4" and env["HDF5_USE_FILE_LOCKING"] == "FALSE" and env["PATH"] == "/bin"
