"""Small promises to users: what README.md says about reading the record, its tables render, `hpcrl --version`."""
from __future__ import annotations

import re
from pathlib import Path

import h5py
import pytest

from hpcrl.config import build_config
from hpcrl.io import RunFile

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_table_row_follows_a_header_and_separator():
    """A blank line inside a table ends it: the rows after it render as raw '|' text."""
    lines = README.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and not (i > 0 and lines[i - 1].startswith("|")):
            # the first row of a block must be a header followed by its --- separator
            assert i + 1 < len(lines) and re.match(r"^\|( *:?-+:? *\|)+$", lines[i + 1]), \
                f"README.md line {i + 1} starts a table without a header row and separator: {line[:60]!r}"


def test_the_readme_h5py_recipe_reads_a_file_that_is_still_being_written(tmp_path):
    recipe = re.search(r'`(h5py\.File\(path, "r", swmr=True, locking=False\))`', README.read_text())
    assert recipe, "README.md no longer shows the h5py recipe this test checks"
    cfg = build_config({})
    path = tmp_path / "run.h5"
    rank_map = {"rank": [0], "role": [0], "group": [-1], "index": [0], "node": [b"node0"]}
    writer = RunFile.create(path, cfg.to_yaml(), rank_map, cfg.io.compression, flush_seconds=0.0)
    try:
        writer.append("episodes", {"time": [0.5], "actor": 0, "env_index": 0, "return": [10.0], "length": [10],
                                   "policy_version": [1], "env_steps": [10]})
        writer.flush()
        with pytest.raises(OSError):  # what the README warns about
            h5py.File(path, "r")
        with eval(recipe.group(1), {"h5py": h5py, "path": path}) as f:
            assert f["episodes/return"][0] == 10.0
    finally:
        writer.close()


def test_hpcrl_version(capsys):
    from hpcrl import __version__
    from hpcrl.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"hpcrl {__version__}\n"
