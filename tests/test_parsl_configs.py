"""Parsl site configs: every factory builds an MPIExecutor + SimpleLauncher config without touching anything."""
import socket
import subprocess

import pytest
from parsl.executors import MPIExecutor
from parsl.launchers import SimpleLauncher

from hpcrl.config import load_config
from hpcrl.errors import ConfigError
from hpcrl.parsl_runs import prepare
from hpcrl.sites import load_site
from hpcrl.sites.parsl_configs import BATCH_SITE, SITES, make_config

ADDRESS = {"perlmutter": "10.0.0.1", "polaris": "10.0.0.1", "aurora": "10.0.0.1"}


@pytest.fixture
def no_side_effects(monkeypatch):
    """Any subprocess or network connection while a config is built fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a config factory ran something: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("site", sorted(SITES))
def test_factory_builds_an_mpi_config_without_side_effects(site, no_side_effects, tmp_path):
    kw = {"address": ADDRESS[site]} if site in ADDRESS else {}
    cfg = make_config(site, run_dir=str(tmp_path / "runinfo"), **kw)
    mpi = [e for e in cfg.executors if isinstance(e, MPIExecutor)]
    assert len(mpi) == 1 and isinstance(mpi[0].provider.launcher, SimpleLauncher)
    assert mpi[0].address is not None  # never Parsl's address lookup (it queries an internet service)
    assert {e.label for e in cfg.executors} == {"mpi", "local"}
    assert not (tmp_path / "runinfo").exists()


def test_cluster_sites_carry_the_placeholder_account(no_side_effects):
    for site in ("perlmutter", "polaris", "aurora"):
        provider = make_config(site, address="10.0.0.1").executors[0].provider
        assert provider.account == "YOUR_ACCOUNT"
    assert make_config("polaris", address="10.0.0.1", account="P1", queue="prod").executors[0].provider.queue == "prod"


def test_configs_read_the_batch_scripts_site_facts(no_side_effects):
    """File systems, GPUs and CPUs come from hpcrl/sites/*.yaml, the facts hpcrl submit renders."""
    polaris = make_config("polaris", address="10.0.0.1").executors[0].provider
    assert polaris.scheduler_options == f"#PBS -l filesystems={load_site('polaris').filesystems}" \
        == "#PBS -l filesystems=home:eagle"
    assert (polaris.select_options, polaris.cpus_per_node) == ("ngpus=4", 64)
    aurora = make_config("aurora", address="10.0.0.1").executors[0].provider
    assert aurora.scheduler_options == "#PBS -l filesystems=home:flare"
    gpu = make_config("perlmutter", address="10.0.0.1").executors[0].provider  # SlurmProvider appends its own lines
    assert gpu.scheduler_options.startswith("#SBATCH --gpus-per-node=4\n")
    cpu = make_config("perlmutter", address="10.0.0.1", constraint="cpu").executors[0].provider
    assert "--gpus-per-node" not in cpu.scheduler_options


def test_unknown_site_and_setting_are_one_line_errors():
    with pytest.raises(ConfigError, match="known: local"):
        make_config("summit")
    with pytest.raises(ConfigError, match="--site local"):
        make_config("local", account="x")


def test_missing_interface_says_what_to_do():
    with pytest.raises(ConfigError, match="no network interface 'bond0'"):
        make_config("polaris")


@pytest.mark.parametrize("site, options", [
    ("local", "-launcher fork"),
    ("local-slurm", "--overcommit --mpi=pmi2"),
    ("local-cluster", "--overcommit --mpi=pmi2"),
    ("perlmutter", "--cpus-per-task=32 --cpu-bind=cores --gpu-bind=none"),
    ("polaris", "--depth=16 --cpu-bind depth"),
    ("aurora", "--depth=25 --cpu-bind depth"),
])
def test_app_resources_and_command(site, options, tmp_path):
    run = prepare(load_config(), site, tmp_path / "run", python="/opt/py/bin/python")
    assert run.resources == {"num_nodes": 1, "ranks_per_node": 4, "num_ranks": 4, "launcher_options": options}
    assert run.command.endswith('\n$PARSL_MPI_PREFIX "${RANK_ARGS[@]}"\n')
    rank = f"/opt/py/bin/python -m hpcrl.runtime.runners.mpi {tmp_path}/run --progress=plain"  # as in the batch scripts
    assert f"RANK_ARGS=({rank} --resume)" in run.command and f"RANK_ARGS=({rank})" in run.command
    assert load_config(run.job_dir / "config.yaml").io.run_dir == str(tmp_path / "run")
    facts = load_site(BATCH_SITE[site]) if BATCH_SITE[site] else None
    for key, value in (facts.env if facts else {}).items():  # the site's rank environment, as in the batch scripts
        assert f"\nexport {key}={value}\n" in run.command
    script = tmp_path / "app.sh"
    script.write_text(run.command)
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_app_in_a_container_and_bad_paths(tmp_path):
    cfg = load_config(None, ["launch.container={runtime: apptainer, image: /img/hpcrl.sif}"])
    run = prepare(cfg, "polaris", tmp_path / "run")
    assert (f"RANK_ARGS=(apptainer exec --bind /opt --bind /var/run/palsd/ --bind {tmp_path} /img/hpcrl.sif "
            f"python3 -m hpcrl.runtime.runners.mpi {tmp_path}/run") in run.command
    assert "module load cray-mpich-abi" in run.command  # the site's container setup, as in the batch scripts
    with pytest.raises(ConfigError, match="launch.container.runtime: 'apptainer' is not available on perlmutter-gpu"):
        prepare(cfg, "perlmutter", tmp_path / "run2")
    assert not (tmp_path / "run2.job").exists()
    with pytest.raises(ConfigError, match="--run-dir"):
        prepare(load_config(), "local", tmp_path / "a b")


def test_docs_show_every_site_config_verbatim():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    docs = (root / "docs" / "sites.md").read_text()
    for module in SITES.values():
        path = f"hpcrl/sites/parsl_configs/{module}.py"
        block = f"### `{path}`\n\n```python\n{(root / path).read_text()}```\n"
        assert block in docs, f"docs/sites.md is out of date for {path}"
