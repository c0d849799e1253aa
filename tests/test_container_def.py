"""singularity/hpcrl.def carries what the package build reads, and installs the extras its commands need.

Apptainer cannot be installed here, so the def is read as text: its %files (what the image copies)
against the paths pyproject.toml and setup.py build from, and the extras of its hpcrl pip line
against hpcrl[all]. tests/test_installed_wheel.py builds a wheel from the same %files and runs it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hpcrl import templates

tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11+")

ROOT = Path(__file__).resolve().parent.parent
DEF = ROOT / "singularity" / "hpcrl.def"
HOST_ONLY = {"local-mpi": "the image has its own MPICH; an MPI wheel would shadow it",
             "dev": "tests and linters, not commands"}
"""Extras of hpcrl[all] the image leaves out, and why."""
NEEDED_BY = {"analysis": "hpcrl analyze", "workflows": "the Parsl apps and configs (hpcrl.parsl_runs, sites.parsl_configs)"}


def section(text: str, name: str) -> str:
    return text.split(f"\n%{name}", 1)[1].split("\n%", 1)[0]


def image_files(text: str) -> list[tuple[str, str]]:
    """%files as (repository path, image path)."""
    return [tuple(line.split()) for line in section(text, "files").splitlines()
            if line.strip() and not line.strip().startswith("#")]


def image_install(text: str) -> tuple[str, set[str]]:
    """The folder %post pip-installs hpcrl from, and the extras it asks for."""
    found = re.findall(r'pip install [^\n]*?"(/[^"\[]+)\[([^\]]*)\]"', section(text, "post"))
    assert len(found) == 1, f"expected one pip install of the copied source in %post, found {found}"
    folder, extras = found[0]
    return folder, {e.strip() for e in extras.split(",") if e.strip()}


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def build_inputs() -> set[str]:
    """Repository paths the wheel build reads: pyproject's readme and package folders, setup.py and the
    templates it copies."""
    tool = pyproject()["tool"]["setuptools"]
    find = tool["packages"]["find"]
    needed = {"pyproject.toml", pyproject()["project"]["readme"]}
    for where in find["where"]:
        if where != ".":
            needed.add(where)
            continue
        patterns = [re.escape(p).replace(r"\*", ".*") for p in find["include"]]
        needed |= {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()
                   and any(re.fullmatch(pat, p.name) for pat in patterns)}
    if (ROOT / "setup.py").is_file():
        needed.add("setup.py")
        tree = ast.parse((ROOT / "setup.py").read_text())
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                  for t in n.targets if isinstance(t, ast.Name)}
        needed.add(consts["TEMPLATES"])
    return needed


def missing_from_image(text: str) -> list[str]:
    """Build inputs the def does not copy to the same place under the folder it pip-installs."""
    folder, _ = image_install(text)
    copied = {repo for repo, image in image_files(text) if image == f"{folder}/{repo}"}
    return sorted(build_inputs() - copied)


def test_build_inputs_are_what_the_package_is_made_of():
    needed = build_inputs()
    assert {"pyproject.toml", "README.md", "hpcrl", "analysis", "setup.py", templates.FOLDER} <= needed, needed
    assert all((ROOT / p).exists() for p in needed), needed


def test_def_copies_every_build_input_where_pip_reads_it():
    assert missing_from_image(DEF.read_text()) == []


@pytest.mark.parametrize("dropped", ["analysis", "slurm_templates", "setup.py"])
def test_dropping_a_build_input_from_files_is_caught(dropped):
    text = DEF.read_text()
    line = next(f"    {repo} {image}\n" for repo, image in image_files(text) if repo == dropped)
    assert missing_from_image(text.replace(line, "")) == [dropped]


def test_pip_line_installs_every_extra_of_all_except_the_host_only_ones():
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    (everything,) = extras["all"]
    in_all = set(re.fullmatch(r"hpcrl\[([^\]]+)\]", everything).group(1).split(","))
    _, wanted = image_install(DEF.read_text())
    assert wanted <= set(extras), f"the def names extras pyproject does not have: {sorted(wanted - set(extras))}"
    for extra, command in NEEDED_BY.items():
        assert extra in wanted, f"{command} needs the {extra} extra in the image"
    assert wanted == in_all - set(HOST_ONLY), (f"missing: {sorted(in_all - set(HOST_ONLY) - wanted)}, "
                                               f"not wanted: {sorted(wanted & set(HOST_ONLY))}")


def test_image_self_test_runs_the_commands_that_read_shipped_files():
    test = section(DEF.read_text(), "test")
    assert "hpcrl analyze" in test and "hpcrl submit --site" in test and "--dry-run" in test and "prepare(" in test
