"""singularity/hpcrl.def: spython parses it, it is MPICH-based, and (where apptainer exists) it builds and passes %test."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from spython.main.parse.parsers import SingularityParser

ROOT = Path(__file__).resolve().parent.parent
DEF = ROOT / "singularity" / "hpcrl.def"


@pytest.fixture(scope="module")
def recipe():
    layers = SingularityParser(str(DEF)).recipe
    assert len(layers) == 1
    return next(iter(layers.values()))


def sections(text: str) -> list[str]:
    return re.findall(r"^%(\w+)", text, re.M)


def test_spython_parses_a_docker_bootstrap(recipe):
    assert DEF.read_text().startswith("Bootstrap: docker\nFrom: ")
    assert recipe.fromHeader.startswith("python:3.")


def test_required_sections_are_present():
    assert {"files", "post", "environment", "runscript", "test", "help", "labels"} <= set(sections(DEF.read_text()))


def test_runscript_is_the_hpcrl_cli(recipe):
    assert recipe.cmd == 'exec python3 -m hpcrl "$@"'


def test_image_mpi_is_mpich_and_mpi4py_is_built_against_it(recipe):
    post = "\n".join(line for line in recipe.install if not line.lstrip().startswith("#"))
    assert re.search(r"apt-get install .*\bmpich\b.*\blibmpich-dev\b", post)
    assert "--no-binary=mpi4py mpi4py" in post and "MPICC=mpicc" in post
    assert "openmpi" not in post.lower() and "local-mpi" not in post  # no second MPI in the image
    assert "torch==2.13.0" in post


def test_environment_suits_parallel_file_systems(recipe):
    assert "HDF5_USE_FILE_LOCKING=FALSE" in recipe.environ


def test_files_copied_into_os_paths_exist_in_the_repository(recipe):
    for line in recipe.files:
        src, dst = line.split()
        assert (ROOT / src).exists(), src
        assert dst.startswith("/opt/"), dst  # OS paths, never /home or /tmp


def test_smoke_test_runs_a_job_and_checks_its_hdf5():
    text = DEF.read_text()
    test = text.split("%test", 1)[1].split("\n%", 1)[0]
    assert "python3 -m hpcrl run" in test and "stop.total_env_steps=" in test and "run.h5" in test


@pytest.mark.slow
def test_image_builds_and_passes_its_own_test(tmp_path):
    apptainer = shutil.which("apptainer")
    if apptainer is None:
        pytest.skip("apptainer is not on PATH (it cannot be installed from this environment's registries); "
                    "the definition file was checked with spython only")
    image = tmp_path / "hpcrl.sif"
    build = subprocess.run([apptainer, "build", "--fakeroot", str(image), str(DEF)], cwd=ROOT,
                           capture_output=True, text=True, timeout=3600)
    assert build.returncode == 0, build.stderr[-3000:]
    test = subprocess.run([apptainer, "test", str(image)], capture_output=True, text=True, timeout=600)
    assert test.returncode == 0 and "episodes recorded" in test.stdout, test.stderr[-3000:]
