"""Batch scripts per site: golden renderings, bash -n, sbatch --test-only, and no injection.

Regenerate the golden files after an intended template change with
``HPCRL_UPDATE_GOLDEN=1 pytest tests/test_submit.py`` and review the diff.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from slurm_fixture import slurm  # noqa: F401 - the session fixture (starts scripts/local_cluster.sh if needed)

from hpcrl.cli import main as cli_main
from hpcrl.config import build_config, load_config
from hpcrl.errors import ConfigError
from hpcrl.sites import load_site, site_names
from hpcrl.submit import CONFIG_END, parse_job_id, plan_job, render, write_job

GOLDEN = Path(__file__).parent / "golden"
PYTHON = "/opt/hpcrl/bin/python"

# name -> (site, plan_job keyword arguments, config overrides)
CASES = {
    "local-slurm": ("local-slurm", {"run_dir": "/scratch/me/runs/cartpole"}, []),
    "local-cluster": ("local-cluster", {"run_dir": "/scratch/me/runs/cartpole", "nodes": 2}, []),
    "slurm": ("slurm", {"run_dir": "/scratch/me/runs/cartpole", "account": "myproject", "time": "02:00:00"}, []),
    "perlmutter-gpu": ("perlmutter-gpu", {"run_dir": "/pscratch/sd/m/me/runs/cartpole", "account": "m1234",
                                          "queue": "debug"},
                       ["launch.container={runtime: podman-hpc, image: registry.nersc.gov/m1234/hpcrl:0.1, gpu: true}"]),
    "perlmutter-cpu": ("perlmutter-cpu", {"run_dir": "/pscratch/sd/m/me/runs/cartpole", "account": "m1234"},
                       ["launch.container={runtime: shifter, image: 'docker:me/hpcrl:0.1'}"]),
    "polaris": ("polaris", {"run_dir": "/eagle/MyProject/runs/cartpole", "account": "MyProject",
                            "time": "01:00:00"}, ["actors.count=10"]),
    "polaris-apptainer": ("polaris", {"run_dir": "/lus/grand/projects/MyProject/runs/cartpole",
                                      "account": "MyProject", "queue": "debug-scaling", "nodes": 2},
                          ["actors.count=10",
                           "launch.container={runtime: apptainer, image: /eagle/MyProject/hpcrl.sif, gpu: true}"]),
    "aurora": ("aurora", {"run_dir": "/lus/flare/projects/MyProject/runs/cartpole", "account": "MyProject"}, []),
}


def rendered(case: str) -> str:
    site, kwargs, overrides = CASES[case]
    cfg = load_config(None, overrides)
    job = plan_job(cfg, load_site(site), python=PYTHON, **kwargs)
    return render(job)


def golden_text(case: str) -> str:
    """The rendering with the config it carries (checked here to be the job's resolved config) as one line: the
    golden files show the script around it, and the config is the same YAML in every one of them."""
    site, kwargs, overrides = CASES[case]
    job = plan_job(load_config(None, overrides), load_site(site), python=PYTHON, **kwargs)
    head, rest = render(job).split(f"<<'{CONFIG_END}' || exit 1\n", 1)
    body, tail = rest.split(f"\n{CONFIG_END}\n", 1)
    assert body + "\n" == job.config_yaml
    return f"{head}<<'{CONFIG_END}' || exit 1\n(job.config_yaml: the resolved config)\n{CONFIG_END}\n{tail}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendering_matches_golden_file(case):
    text = golden_text(case)
    path = GOLDEN / f"{case}.sh"
    if os.environ.get("HPCRL_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"missing {path}; run with HPCRL_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{case}: rendering differs from {path} (HPCRL_UPDATE_GOLDEN=1 to accept)"


def test_every_site_has_a_golden_rendering():
    batch_sites = {CASES[c][0] for c in CASES}
    assert batch_sites == set(site_names())


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_script_is_valid_bash(case, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(rendered(case))
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_script_starts_or_resumes_and_requeues(case):
    text = rendered(case)
    site = load_site(CASES[case][0])
    assert text.startswith("#!/bin/bash\n")
    job = plan_job(load_config(None, CASES[case][2]), site, python=PYTHON, **CASES[case][1])
    assert f"RANK_ARGS=({' '.join(job.rank_start.resume)})" in text and job.rank_start.resume[-1] == "--resume"
    assert f"RANK_ARGS=({' '.join(job.rank_start.start)})" in text and ' \\\n    "${RANK_ARGS[@]}" &\n' in text
    assert f"\n{job.launch} \\\n" in text  # the site's launcher (hpcrl.launchers) wrote the line
    assert job.rank_start.start[-3:] == ["hpcrl.runtime.runners.mpi", job.run_dir, "--progress=plain"]
    assert 'cp "$CONFIG" "$RUN_DIR/config.yaml"' in text  # a fresh start puts the resolved config where the ranks read it
    assert "trap 'REQUEUE=1;" in text
    if site.scheduler == "slurm":
        assert "#SBATCH --signal=B:USR1@120" in text and "#SBATCH --requeue" in text
        assert 'scontrol requeue "$SLURM_JOB_ID"' in text
        assert re.search(r"^srun --ntasks=\d+", text, re.M)
    else:
        assert "#PBS -r y" in text and "kill -s USR1 $$" in text and "qsub -W depend=afterany" in text
        assert re.search(r"^mpiexec -n \d+ --ppn \d+ --depth=\d+ --cpu-bind depth", text, re.M)


def test_container_prefixes_land_in_the_rank_command():
    assert "podman-hpc run --rm --mpi --gpu -v /pscratch/sd/m/me/runs:/pscratch/sd/m/me/runs" in rendered("perlmutter-gpu")
    cpu = rendered("perlmutter-cpu")
    assert "shifter --image=docker:me/hpcrl:0.1 --module=mpich python3 -m hpcrl.runtime.runners.mpi" in cpu
    assert "#SBATCH --image=docker:me/hpcrl:0.1" in cpu
    polaris = rendered("polaris-apptainer")
    assert ("apptainer exec --nv --bind /opt --bind /var/run/palsd/ --bind /lus/grand/projects/MyProject/runs "
            "/eagle/MyProject/hpcrl.sif python3 -m hpcrl.runtime.runners.mpi") in polaris
    assert "module load cray-mpich-abi" in polaris and "#PBS -l filesystems=home:eagle:grand" in polaris


def test_site_launch_lines_start_the_one_rank_command():
    """srun / PALS mpiexec with the layout, then hpcrl.launch.rank_command's argv (in the container if any)."""
    box = "launch.container={runtime: apptainer, image: /images/hpcrl.sif, binds: ['/lus/proj:/data'], gpu: true}"
    text = render(plan_job(load_config(None, ["actors.count=62", box]), load_site("slurm"), run_dir="/runs/x",
                           python=PYTHON))
    assert re.search(r"^srun --ntasks=64 --ntasks-per-node=32 --mpi=pmi2 --kill-on-bad-exit=1 \\$", text, re.M)
    assert ("RANK_ARGS=(apptainer exec --nv --bind /lus/proj:/data --bind /runs /images/hpcrl.sif "
            "python3 -m hpcrl.runtime.runners.mpi /runs/x --progress=plain)") in text
    assert re.search(r"^srun .* --cpu-bind=cores --gpu-bind=none --kill-on-bad-exit=1 \\$", rendered("perlmutter-gpu"),
                     re.M)
    pol = render(plan_job(load_config(None, ["actors.count=30"]), load_site("polaris"), account="P",
                          queue="debug-scaling", nodes=4, run_dir="/x/r", python=PYTHON))
    assert re.search(r"^mpiexec -n 32 --ppn 8 --depth=8 --cpu-bind depth ", pol, re.M)
    assert f"RANK_ARGS=({PYTHON} -m hpcrl.runtime.runners.mpi /x/r --progress=plain --resume)" in pol


def test_layout_follows_cores_and_nodes():
    cfg = load_config(None, ["actors.count=254"])  # 256 ranks
    gpu = plan_job(cfg, load_site("perlmutter-gpu"), account="m1", run_dir="/x/r", python=PYTHON)
    assert (gpu.nodes, gpu.ranks_per_node, gpu.cpus_per_rank) == (4, 64, 2)
    cpu = plan_job(cfg, load_site("perlmutter-cpu"), account="m1", run_dir="/x/r", python=PYTHON, nodes=4)
    assert (cpu.ranks_per_node, cpu.cpus_per_rank) == (64, 4)
    pol = plan_job(load_config(None, ["actors.count=14"]), load_site("polaris"), account="P", run_dir="/x/r",
                   python=PYTHON, nodes=2)
    assert (pol.ranks_per_node, pol.cpus_per_rank) == (8, 8)  # 2 threads x floor(32 / 8)
    with pytest.raises(ConfigError, match="more than the 32 cores"):
        plan_job(cfg, load_site("polaris"), account="P", run_dir="/x/r", python=PYTHON, nodes=2, queue="prod")


def test_queue_limits_are_checked():
    cfg = load_config()
    with pytest.raises(ConfigError, match="exceeds the polaris debug limit of 01:00:00"):
        plan_job(cfg, load_site("polaris"), account="P", time="02:00:00", run_dir="/x/r", python=PYTHON)
    with pytest.raises(ConfigError, match="outside the polaris prod range 10-496"):
        plan_job(cfg, load_site("polaris"), account="P", queue="prod", run_dir="/x/r", python=PYTHON)
    with pytest.raises(ConfigError, match="--account"):
        plan_job(cfg, load_site("aurora"), run_dir="/x/r", python=PYTHON)


HOSTILE = [
    (["--account", "a;touch /tmp/pwned"], "--account"),
    (["--account", "$(reboot)"], "--account"),
    (["--queue", "debug\n#SBATCH --uid=0"], "--queue"),
    (["--queue=-wrap"], "--queue"),
    (["--time", "1:00"], "--time"),
    (["--time", "00:00:00"], "--time"),
    (["--time", "01:00:00;id"], "--time"),
    (["--run-dir", "/tmp/a b"], "--run-dir"),
    (["--run-dir", "/tmp/`id`"], "--run-dir"),
    (["--run-dir", "/tmp/x\n#SBATCH --uid=0"], "--run-dir"),
    (["--python", "python3; id"], "--python"),
    (["--env-script", "/tmp/$(id).sh"], "--env-script"),
    (["-o", "name=x;id"], "name"),
    (["-o", "io.run_dir=/tmp/$HOME/{name}"], "--run-dir"),
    (["-o", "launch.container={runtime: apptainer, image: 'x.sif; id'}"], "launch.container.image"),
    (["-o", "launch.container={runtime: apptainer, image: x.sif, binds: ['/a,/etc:/etc']}"], "launch.container.binds"),
    (["-o", "launch.container={runtime: shifter, image: x}"], "launch.container.runtime"),
    (["--warning-seconds", "999999"], "--warning-seconds"),
]


@pytest.mark.parametrize("extra, field", HOSTILE)
def test_hostile_values_are_rejected_with_one_line(extra, field, capsys, tmp_path):
    run_dir = [] if "io.run_dir" in " ".join(extra) else ["--run-dir", str(tmp_path / "run")]
    argv = ["submit", "--site", "local-slurm", "--dry-run", "--python", PYTHON, *run_dir, *extra]
    assert cli_main(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], out.err


def test_config_values_are_never_run_by_the_script(tmp_path):
    """The script carries the resolved config in a quoted here-document: a saved --dry-run script writes it
    on its first start, and nothing in it is expanded or run."""
    marker = tmp_path / "pwned"
    cfg = build_config({"env": {"kwargs": {"x": f"$(touch {marker})", "y": f"`touch {marker}`",
                                           "z": "a\nHPCRL_CONFIG_YAML\nb"}}})
    job = plan_job(cfg, load_site("local-slurm"), run_dir=str(tmp_path / "run"), python=PYTHON)
    script = render(job)
    start, end = script.index("RUN_DIR="), script.index('cd "$JOB_DIR" || exit 1')
    subprocess.run(["bash", "-c", script[start:end]], check=True, timeout=30)  # the first start's config step
    assert not marker.exists()
    written = tmp_path / "run.job" / "config.yaml"
    assert written.read_text() == job.config_yaml
    assert load_config(written).env.kwargs == cfg.env.kwargs
    shutil.rmtree(tmp_path / "run.job")
    path = write_job(job, cfg, script)
    resolved = load_config(tmp_path / "run.job" / "config.yaml")
    assert resolved.env.kwargs == cfg.env.kwargs and resolved.io.run_dir == str(tmp_path / "run")
    assert path.read_text() == script and os.access(path, os.X_OK)
    with pytest.raises(ConfigError, match="already exists"):
        write_job(job, cfg, script)


def test_dry_run_writes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli_main(["submit", "--site", "aurora", "--account", "P", "--dry-run", "--run-dir", str(run)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("#!/bin/bash\n#PBS -N cartpole") and "qsub" in out.err
    assert not run.exists() and not (tmp_path / "run.job").exists()


def test_job_ids_are_parsed():
    assert parse_job_id("slurm", "1234\n") == "1234"
    assert parse_job_id("slurm", "1234;perlmutter\n") == "1234"
    assert parse_job_id("pbs", "5678.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov\n").startswith("5678.polaris")
    with pytest.raises(RuntimeError):
        parse_job_id("slurm", "sbatch: error: Batch job submission failed")


# -- against the real local Slurm (scripts/local_cluster.sh start) -----------------------------------------

SITE_ONLY = re.compile(r"^#SBATCH --(constraint|qos|account|gpus-per-node|image)=.*\n", re.M)


@pytest.mark.slurm
@pytest.mark.parametrize("case", [c for c in sorted(CASES) if load_site(CASES[c][0]).scheduler == "slurm"])
def test_slurm_scripts_pass_sbatch_test_only(case, tmp_path, slurm):
    text = rendered(case)
    extra = []
    if case not in {"local-slurm", "local-cluster"}:
        # The local node has neither the site's features, QOS and GPUs nor its cores: drop those lines and
        # let the ranks share the node's cores. Every other directive must parse and be schedulable.
        text = SITE_ONLY.sub("", text)
        text = re.sub(r"^#SBATCH --(ntasks-per-node|cpus-per-task)=\d+\n", "", text, flags=re.M)
        extra = ["--overcommit"]
    script = tmp_path / "job.sh"
    script.write_text(text)
    out = subprocess.run(["sbatch", "--test-only", *extra, str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "to start at" in out.stderr, out.stderr
