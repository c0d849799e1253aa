"""The wheel carries the repository's slurm_templates/ as hpcrl/slurm_templates/ (hpcrl.templates).

Everything else about the package is in pyproject.toml; this file only adds that copy, because the
templates stay beside hpcrl/ in the repository and setuptools packages only what is inside a package.
"""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

TEMPLATES = "slurm_templates"
HERE = Path(__file__).resolve().parent


class BuildWithTemplates(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads them from the checkout
            return
        found = sorted((HERE / TEMPLATES).glob("*.j2"))
        if not found:
            raise SystemExit(f"setup.py: no {TEMPLATES}/*.j2 beside pyproject.toml; the wheel needs them "
                             "(a container build must copy slurm_templates/ too)")
        target = Path(self.build_lib, "hpcrl", TEMPLATES)
        self.mkpath(str(target))
        for path in found:
            self.copy_file(str(path), str(target / path.name))


setup(cmdclass={"build_py": BuildWithTemplates})
