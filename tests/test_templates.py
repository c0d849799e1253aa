"""hpcrl.templates: which folder of batch templates every renderer reads (checkout, wheel, HPCRL_TEMPLATE_DIR)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpcrl.config import load_config
from hpcrl.errors import ConfigError
from hpcrl.sites import load_site
from hpcrl.submit import plan_job, render, render_template
from hpcrl.templates import ENV, template_dir

ROOT = Path(__file__).resolve().parent.parent


def job(site: str = "slurm"):
    return plan_job(load_config(), load_site(site), account="PROJ", run_dir="/scratch/me/run", python="/opt/py/bin/python")


def test_a_checkout_renders_from_its_slurm_templates_folder(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert template_dir() == ROOT / "slurm_templates"


def test_the_variable_names_a_site_s_own_edited_copies(monkeypatch, tmp_path):
    mine = tmp_path / "templates"
    shutil.copytree(ROOT / "slurm_templates", mine)
    edited = mine / "slurm.sbatch.j2"
    text = edited.read_text()
    assert "{% block directives %}\n" in text
    edited.write_text(text.replace("{% block directives %}\n", "{% block directives %}\n#SBATCH --comment=edited-at-the-site\n", 1))
    monkeypatch.setenv(ENV, str(mine))
    assert template_dir() == mine
    assert "#SBATCH --comment=edited-at-the-site\n" in render(job())
    monkeypatch.delenv(ENV)
    assert "edited-at-the-site" not in render(job())


def test_a_variable_naming_no_folder_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError) as info:
        render(job())
    assert ENV in str(info.value) and "nowhere" in str(info.value) and "\n" not in str(info.value)


def test_a_folder_without_the_template_names_it_and_what_is_there(monkeypatch, tmp_path):
    (tmp_path / "other.j2").write_text("x\n")
    monkeypatch.setenv(ENV, str(tmp_path))
    with pytest.raises(ConfigError, match=r"'clusterenv_workers\.j2' not found in .*; its \*\.j2 files: other\.j2$"):
        render_template("clusterenv_workers.j2")
