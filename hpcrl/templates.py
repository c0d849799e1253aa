"""Where the batch script templates are: one answer for a source checkout and an installed wheel.

The templates live in the repository's ``slurm_templates/`` (beside ``hpcrl/``); a wheel carries
them as ``hpcrl/slurm_templates/`` (setup.py copies them there when it builds). ``hpcrl submit``,
``hpcrl sweep --site``, ClusterEnv's batch mode and the Parsl apps all render from :func:`template_dir`.
"""
from __future__ import annotations

import os
from pathlib import Path

from hpcrl.errors import ConfigError

FOLDER = "slurm_templates"
ENV = "HPCRL_TEMPLATE_DIR"
"""Names a folder of templates to use instead (a site's own edited copies)."""
PACKAGE = Path(__file__).resolve().parent


def candidates() -> list[Path]:
    """The folders looked in, first match wins: the wheel's copy, then the checkout's folder."""
    return [PACKAGE / FOLDER, PACKAGE.parent / FOLDER]


def template_dir() -> Path:
    """The folder of Jinja2 batch templates (``$HPCRL_TEMPLATE_DIR`` when set)."""
    chosen = os.environ.get(ENV)
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_dir():
            raise ConfigError(f"{ENV}={chosen!r} is not a folder; unset it, or name a folder of *.j2 templates")
        return path
    for path in candidates():
        if path.is_dir():
            return path
    raise ConfigError(f"no {FOLDER}/ found (looked in {', '.join(map(str, candidates()))}); reinstall hpcrl from "
                      f"its wheel or checkout, or set {ENV} to a folder of *.j2 templates")
