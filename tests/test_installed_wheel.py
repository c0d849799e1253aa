"""hpcrl installed from its wheel, away from the source tree: run, analyze, submit, ClusterEnv batch, Parsl apps.

The wheel is built from exactly what singularity/hpcrl.def copies into the image (its %files, placed
where the image's pip install reads them), so a folder the image would miss fails here too. The fresh
venv borrows the test venv's site-packages (torch & co., no download) through a .pth file; the
checkout is not on its path, and the first test checks that hpcrl comes from the wheel.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from test_container_def import image_files, image_install

from hpcrl.config import load_config
from hpcrl.sites import load_site, site_names
from hpcrl.submit import plan_job, render

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEF = ROOT / "singularity" / "hpcrl.def"
PYTHON_ON_NODES = "/opt/hpcrl/bin/python"


def stage_like_the_image(into: Path) -> Path:
    """Copy the def's %files as the image build does; returns the folder pip would install."""
    text = DEF.read_text()
    src, _ = image_install(text)
    for repo_path, image_path in image_files(text):
        if not image_path.startswith(src + "/"):
            continue  # not part of the package source
        target = into / os.path.relpath(image_path, src)
        if (ROOT / repo_path).is_dir():
            shutil.copytree(ROOT / repo_path, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / repo_path, target)
    return into


def ci_env() -> dict:
    """This environment without anything that would point the fresh venv back at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HPCRL_TEMPLATE_DIR", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def run(cmd: list, cwd: Path, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or ci_env(), capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; the commands run in the folder ``work`` beside it."""
    top = tmp_path_factory.mktemp("installed")
    src = stage_like_the_image(top / "src")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-index", "--no-deps", "--no-build-isolation",
         "-w", top / "dist", f"{src}/"], cwd=top)
    wheels = list((top / "dist").glob("hpcrl-*.whl"))
    assert len(wheels) == 1, wheels
    home = top / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", home], cwd=top)
    python = home / "bin" / "python"
    site_dir = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=top).stdout.strip()
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(site_dir, "ci-dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", "--no-deps", wheels[0]],
        cwd=top)
    (top / "work").mkdir()
    return home


def fresh(venv: Path, *args, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run in the fresh venv, from a folder outside the checkout."""
    return run(list(args), cwd=venv.parent / "work", timeout=timeout, env=env)


def test_hpcrl_analysis_and_templates_come_from_the_wheel(venv):
    code = ("import json, sys, hpcrl, hpcrl_analysis; from hpcrl.templates import template_dir; "
            "print(json.dumps({'hpcrl': hpcrl.__file__, 'analysis': hpcrl_analysis.__file__, "
            "'templates': str(template_dir()), 'path': sys.path}))")
    where = json.loads(fresh(venv, venv / "bin" / "python", "-c", code).stdout)
    for key in ("hpcrl", "analysis", "templates"):
        assert Path(where[key]).is_relative_to(venv), f"{key} from {where[key]}, not from the wheel in {venv}"
    checkout = {ROOT, ROOT / "analysis"}  # (the test venv's site-packages may lie inside the checkout: allowed)
    assert not any(p and Path(p).resolve() in checkout for p in where["path"]), where["path"]
    assert {p.name for p in Path(where["templates"]).glob("*.j2")} == {p.name for p in (ROOT / "slurm_templates").glob("*.j2")}


def test_every_data_file_of_the_package_is_installed(venv):
    """Configs, sites, cluster profiles, sweeps, bench references: what pyproject's package-data must match."""
    package = Path(fresh(venv, venv / "bin" / "python", "-c", "import hpcrl; print(hpcrl.__file__)").stdout.strip()).parent
    data = [p.relative_to(ROOT / "hpcrl") for p in (ROOT / "hpcrl").rglob("*")
            if p.suffix in (".yaml", ".yml", ".json", ".j2", ".txt", ".csv") and "__pycache__" not in p.parts]
    assert len(data) > 40
    assert [str(p) for p in data if not (package / p).is_file()] == []


def test_serial_run_then_analyze(venv):
    work = venv.parent / "work"
    fresh(venv, venv / "bin" / "hpcrl", "run", "-o", "launch.runner=serial", "-o", "stop.total_env_steps=600",
          "-o", f"io.run_dir={work / 'serial'}")
    assert (work / "serial" / "run.h5").is_file()
    fresh(venv, venv / "bin" / "hpcrl", "analyze", work / "serial")
    summary = (work / "serial" / "analysis" / "summary.md").read_text()
    assert "episodes" in summary.lower() and (work / "serial" / "analysis" / "report.html").is_file()
    assert list((work / "serial" / "analysis").glob("learning_envsteps.png"))


@pytest.mark.mpi
def test_mpi_run_from_the_wheel(venv):
    """4 ranks through the MPI of the test venv (the mpich wheel's mpiexec and libmpi: local-mpi extra)."""
    mpiexec, libmpi = Path(sys.executable).parent / "mpiexec", Path(sys.prefix, "lib", "libmpi.so.12")
    if not (mpiexec.is_file() and libmpi.is_file()):
        pytest.skip(f"no mpich wheel in this venv ({mpiexec}, {libmpi}): the local-mpi extra is not installed")
    work = venv.parent / "work"
    fresh(venv, venv / "bin" / "hpcrl", "run", "-o", "stop.total_env_steps=600", "-o", f"io.run_dir={work / 'mpi'}",
          "-o", f"launch.mpiexec={mpiexec}", env={**ci_env(), "MPI4PY_LIBMPI": str(libmpi)}, timeout=180)
    assert (work / "mpi" / "run.h5").is_file()
    assert sorted(p.name for p in (work / "mpi" / "traj").glob("actor-*.h5")) == ["actor-00000.h5", "actor-00001.h5"]


SUBMIT_EVERY_SITE = """
import contextlib, io, json, sys
from hpcrl.cli import main
from hpcrl.sites import site_names
scripts = {}
for site in site_names():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["submit", "--site", site, "--dry-run", "--account", "PROJ", "--run-dir", f"/scratch/me/runs/{site}",
                     "--python", sys.argv[1]])
    scripts[site] = (code, out.getvalue())
print(json.dumps(scripts))
"""


def test_submit_dry_run_for_every_site_renders_what_the_checkout_renders(venv):
    """hpcrl submit --dry-run for each shipped site, in one process of the fresh venv (the console script itself
    is run by the other tests here)."""
    scripts = json.loads(fresh(venv, venv / "bin" / "python", "-c", SUBMIT_EVERY_SITE, PYTHON_ON_NODES).stdout)
    assert list(scripts) == site_names() and len(scripts) >= 5
    for site, (code, text) in scripts.items():
        run_dir = f"/scratch/me/runs/{site}"
        here = render(plan_job(load_config(), load_site(site), account="PROJ", run_dir=run_dir, python=PYTHON_ON_NODES))
        assert code == 0 and text == here, f"{site}: the wheel's script differs from the checkout's"
        assert "#SBATCH" in text if load_site(site).scheduler == "slurm" else "#PBS" in text


RENDER = """
import json, sys
from hpcrl.clusterenv.batch import plan_workers, render_workers
from hpcrl.clusterenv.options import ClusterOptions
from hpcrl.config import load_config
from hpcrl.parsl_runs import prepare
from hpcrl.sites import site_names
from hpcrl.sites.parsl_configs import SITES
work = sys.argv[1]
workers = {s: render_workers(plan_workers(ClusterOptions("CartPole-v1", 8, workers=4, launch="batch", site=s,
           batch={"job_dir": f"{work}/ce-{s}", "account": "PROJ"}), s)) for s in site_names()}
apps = {s: prepare(load_config(), s, f"{work}/parsl-{s}").command for s in SITES}
print(json.dumps({"workers": workers, "apps": apps, "python": sys.executable}))
"""


def test_clusterenv_batch_and_parsl_apps_render(venv):
    work = venv.parent / "work"
    out = json.loads(fresh(venv, venv / "bin" / "python", "-c", RENDER, work).stdout)
    assert sorted(out["workers"]) == site_names()
    for site, text in out["workers"].items():
        directive = "#SBATCH" if load_site(site).scheduler == "slurm" else "#PBS"
        assert text.startswith("#!/bin/bash\n") and directive in text, site
        assert f"{out['python']} -m hpcrl.clusterenv.worker --rendezvous {work}/ce-{site}/head.json" in text, site
    for site, command in out["apps"].items():
        assert out["python"] in command and command.endswith('\n$PARSL_MPI_PREFIX "${RANK_ARGS[@]}"\n'), site
        assert (work / f"parsl-{site}.job" / "config.yaml").is_file()


def test_sweep_array_dry_run_names_the_installed_spec(venv):
    where = fresh(venv, venv / "bin" / "python", "-c", "import sys, hpcrl; print(sys.executable); print(hpcrl.__file__)")
    python, package = where.stdout.split()
    specs = sorted(Path(package).parent.joinpath("sweeps").glob("*.yaml"))
    assert specs, "the wheel has no hpcrl/sweeps/*.yaml"
    out = fresh(venv, venv / "bin" / "hpcrl", "sweep", specs[0].stem, "--site", "local-slurm", "--dry-run",
                "--out", venv.parent / "work" / "sweep").stdout
    assert "#SBATCH --array=0-" in out and f"{python} -m hpcrl sweep {specs[0]} --out " in out
