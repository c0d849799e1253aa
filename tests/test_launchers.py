"""hpcrl.launchers: each launcher's exact line, what the shell makes of it, one-line errors, one source of truth."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.config import LaunchConfig
from hpcrl.launch import find_mpiexec, mpi_flavour
from hpcrl.launchers import LocalMpiexec, PalsMpiexec, ParslMpiPrefix, Srun, for_site
from hpcrl.sites import load_site, site_names

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("launcher, ranks, words", [
    (LocalMpiexec("/v/bin/mpiexec", "mpich", cores=2), 4, ["/v/bin/mpiexec", "-n", "4"]),
    (LocalMpiexec("mpiexec", "openmpi", cores=2), 4, ["mpiexec", "-n", "4", "--oversubscribe"]),
    (LocalMpiexec("mpiexec", "openmpi", cores=2), 2, ["mpiexec", "-n", "2"]),
    (LocalMpiexec("mpiexec", "openmpi", ("--oversubscribe",), cores=2), 4, ["mpiexec", "-n", "4", "--oversubscribe"]),
    (LocalMpiexec("mpiexec", "mpich", ("-bind-to", "none"), cores=2), 3, ["mpiexec", "-n", "3", "-bind-to", "none"]),
])
def test_local_mpiexec_words(launcher, ranks, words):
    assert launcher.words(ranks, ranks) == words


def test_local_mpiexec_line_quotes_paths():
    launcher = LocalMpiexec("/opt/my mpi/mpiexec", "mpich")
    assert launcher("python -V", 2, 2) == "'/opt/my mpi/mpiexec' -n 2 python -V"


@pytest.mark.parametrize("launcher, layout, line", [
    (Srun(mpi="pmi2", overcommit=True), (4, 4, None), "srun --ntasks=4 --overcommit --mpi=pmi2 --kill-on-bad-exit=1"),
    (Srun(mpi="pmi2"), (10, 4, None), "srun --ntasks=10 --ntasks-per-node=4 --mpi=pmi2 --kill-on-bad-exit=1"),
    (Srun(), (4, 4, 64),
     "srun --ntasks=4 --ntasks-per-node=4 --cpus-per-task=64 --cpu-bind=cores --kill-on-bad-exit=1"),
    (Srun(gpu_bind="none"), (256, 64, 2),
     "srun --ntasks=256 --ntasks-per-node=64 --cpus-per-task=2 --cpu-bind=cores --gpu-bind=none --kill-on-bad-exit=1"),
    (Srun(mpi="pmix", overcommit=True, gpu_bind="closest"), (6, 3, 1),
     "srun --ntasks=6 --cpus-per-task=1 --cpu-bind=cores --gpu-bind=closest --overcommit --mpi=pmix "
     "--kill-on-bad-exit=1"),
    (PalsMpiexec(), (12, 6, 10), 'mpiexec -n 12 --ppn 6 --depth=10 --cpu-bind depth --hostfile "$PBS_NODEFILE"'),
    (PalsMpiexec(), (5, 3, None), 'mpiexec -n 5 --ppn 3 --hostfile "$PBS_NODEFILE"'),
    (ParslMpiPrefix(Srun(mpi="pmi2")), (8, 4, 2), "$PARSL_MPI_PREFIX"),
])
def test_site_launcher_lines(launcher, layout, line):
    assert launcher.prefix(*layout) == line
    assert launcher('"${RANK_ARGS[@]}"', *layout) == line + ' "${RANK_ARGS[@]}"'


@pytest.mark.parametrize("under, cpus, options", [
    (None, None, "-launcher fork"),
    (Srun(mpi="pmi2", overcommit=True), None, "--overcommit --mpi=pmi2"),
    (Srun(gpu_bind="none"), 32, "--cpus-per-task=32 --cpu-bind=cores --gpu-bind=none"),
    (PalsMpiexec(), 16, "--depth=16 --cpu-bind depth"),
])
def test_parsl_resources_carry_the_site_launchers_options(under, cpus, options):
    prefix = ParslMpiPrefix(under)
    assert prefix.resources(10, 4, cpus, 3) == {"num_nodes": 3, "ranks_per_node": 4, "num_ranks": 10,
                                                "launcher_options": options}


def test_each_site_gets_its_launcher():
    assert for_site(load_site("local-slurm")) == Srun(mpi="pmi2", overcommit=True)
    assert for_site(load_site("slurm")) == Srun(mpi="pmi2")
    assert for_site(load_site("perlmutter-cpu")) == Srun()
    assert for_site(load_site("perlmutter-gpu")) == Srun(gpu_bind="none")
    assert for_site(load_site("perlmutter-gpu"), gpus=False) == Srun()  # a job without GPUs: no --gpu-bind
    assert for_site(load_site("polaris")) == for_site(load_site("aurora")) == PalsMpiexec()
    for name in site_names():
        site = load_site(name)
        assert isinstance(for_site(site), PalsMpiexec if site.launcher == "pals" else Srun)


BAD = [
    (lambda: LocalMpiexec("mpiexec", "intel"), "flavour='intel'; allowed: mpich, openmpi, unknown"),
    (lambda: LocalMpiexec().words(4, 2), "ranks_per_node equal to ranks"),
    (lambda: LocalMpiexec().words(4, 4, 2), "cpus_per_rank=2; allowed: None"),
    (lambda: Srun(mpi="pmi2; rm -rf /"), "mpi='pmi2; rm -rf /'; allowed: None or a Slurm MPI plugin name"),
    (lambda: Srun(gpu_bind="single:1"), "gpu_bind='single:1'; allowed: None, none, closest"),
    (lambda: Srun().prefix(0, 1), "srun: ranks=0; allowed: an int of 1 or more"),
    (lambda: Srun().prefix(4, 8), "srun: ranks_per_node=8; allowed: an int from 1 to ranks (4)"),
    (lambda: Srun().prefix(4.0, 4), "srun: ranks=4.0; allowed: an int"),
    (lambda: PalsMpiexec().prefix(4, 4, 0), "PALS mpiexec: cpus_per_rank=0; allowed: None (no binding) or an int"),
    (lambda: PalsMpiexec().prefix(True, 1), "ranks=True"),
    (lambda: ParslMpiPrefix(LocalMpiexec()), "allowed: Srun, PalsMpiexec or None"),
    (lambda: ParslMpiPrefix().resources(10, 4, None, 2),
     "nodes=2; allowed: an int of at least ranks / ranks_per_node (3)"),
]


@pytest.mark.parametrize("make, message", BAD)
def test_bad_input_is_a_one_line_value_error_naming_what_is_allowed(make, message):
    with pytest.raises(ValueError) as info:
        make()
    text = str(info.value)
    assert message in text and "allowed" in text and "\n" not in text


def argv_seen(script: str, env: dict[str, str]) -> list[str]:
    """The argv that the first word of ``script``'s line receives from bash (srun/mpiexec stand-ins)."""
    stand_ins = "srun() { printf '<%s>' srun \"$@\"; }; mpiexec() { printf '<%s>' mpiexec \"$@\"; }\n"
    out = subprocess.run(["bash", "-c", stand_ins + script], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return re.findall(r"<([^>]*)>", out.stdout)


def test_the_shell_expands_the_nodefile_and_the_parsl_prefix_into_the_right_words():
    rank = ["/opt/py/bin/python", "-m", "x", "a b"]
    command = "'/opt/py/bin/python' -m x 'a b'"
    pals = PalsMpiexec()(command, 4, 2, 8)
    assert argv_seen(pals, {"PBS_NODEFILE": "/var/spool/pbs/aux/1 2"}) == [
        "mpiexec", "-n", "4", "--ppn", "2", "--depth=8", "--cpu-bind", "depth", "--hostfile", "/var/spool/pbs/aux/1 2",
        *rank]
    parsl = ParslMpiPrefix(Srun(mpi="pmi2"))(command, 4, 2)
    assert argv_seen(parsl, {"PARSL_MPI_PREFIX": "srun --ntasks 4 --nodes 2 --mpi=pmi2"}) == [
        "srun", "--ntasks", "4", "--nodes", "2", "--mpi=pmi2", *rank]


def test_no_template_spells_a_launch_line():
    """The templates get the line from Python (job.launch / launch); none writes srun or mpiexec itself."""
    spelled = [f"{path.name}: {line}" for path in sorted((ROOT / "slurm_templates").glob("*.j2"))
               for line in path.read_text().splitlines()
               if re.match(r"\s*(srun|mpiexec|\$PARSL_MPI_PREFIX)\b", line)]
    assert spelled == []


@pytest.mark.parametrize("site", ["local-slurm", "perlmutter-gpu", "polaris"])
def test_worker_job_and_parsl_app_render_their_launchers_line(site, tmp_path):
    from hpcrl.clusterenv.batch import plan_workers, render_workers
    from hpcrl.clusterenv.options import ClusterOptions
    from hpcrl.config import load_config
    from hpcrl.parsl_runs import prepare

    opts = ClusterOptions("CartPole-v1", 8, workers=4, launch="batch", site=site,
                          batch={"job_dir": str(tmp_path / "job"), "account": "P"})
    job = plan_workers(opts, site)
    line = for_site(load_site(site), gpus=False).prefix(4, job.ranks_per_node, job.cpus_per_rank)
    assert f"\n{line} \\\n    {job.argv[0]} -m hpcrl.clusterenv.worker" in render_workers(job)
    parsl_site = "perlmutter" if site.startswith("perlmutter") else site
    run = prepare(load_config(), parsl_site, tmp_path / "run", python="/opt/py/bin/python")
    assert run.command.endswith('\n$PARSL_MPI_PREFIX "${RANK_ARGS[@]}"\n')


@pytest.mark.mpi
def test_the_local_line_starts_every_rank():
    mpiexec = find_mpiexec(LaunchConfig())
    launcher = LocalMpiexec(mpiexec, mpi_flavour(mpiexec))
    # one write() per rank: the ranks share the pipe, and print() may split a line into two writes
    code = "import os; from mpi4py import MPI; c = MPI.COMM_WORLD; os.write(1, f'<rank {c.rank} of {c.size}>'.encode())"
    out = subprocess.run(launcher.words(3, 3) + [sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(re.findall(r"<([^>]*)>", out.stdout)) == ["rank 0 of 3", "rank 1 of 3", "rank 2 of 3"]
