"""The record opens in HDF5 readers nobody here wrote: Debian's h5dump/h5ls (HDF5 1.10.8) and an h5py on an older HDF5.

A tiny real run (``hpcrl run --runner serial``) is read by ``h5dump`` (package hdf5-tools, installed by
scripts/install_system_deps.sh) including run.h5's virtual ``trajectories`` view with its real
shape, and by Debian's python3-h5py (h5py 3.7 on HDF5 1.10.8) through /usr/bin/python3. A run in
the format an older hpcrl wrote (``libver="latest"``: HDF5 2.0's under the h5py 3.16 wheel) is
refused by those readers, still resumes and analyses here, and opens everywhere after ``hpcrl convert``.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from hpcrl.cli import main as cli_main
from hpcrl.commands.analyze import load_analysis
from hpcrl.io import read_table, read_trajectories
from hpcrl.io.convert import convert_file
from hpcrl.io.rollback import trajectory_files
from hpcrl.runtime.record.checkpoint import load_checkpoint

H5DUMP = shutil.which("h5dump")
needs_h5dump = pytest.mark.skipif(H5DUMP is None, reason="h5dump not installed (apt-get install hdf5-tools; "
                                                         "scripts/install_system_deps.sh does it as root)")
SYSTEM_PYTHON = "/usr/bin/python3"


def _run(run_dir: Path, *extra: str, steps: int = 500) -> None:
    """``hpcrl run --runner serial`` (the default job, 2 actors) in this process: the serial runner needs none of
    its own."""
    assert cli_main(["run", "--runner", "serial", *extra, "-o", f"stop.total_env_steps={steps}",
                     "-o", f"io.run_dir={run_dir}"]) == 0


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny run that the tests only read (one that changes it works on a copy)."""
    run_dir = tmp_path_factory.mktemp("readers") / "run"
    _run(run_dir)
    return run_dir


def h5dump(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([H5DUMP, *args], capture_output=True, text=True, timeout=60)


def _dataspace(header: str) -> tuple[int, ...]:
    m = re.search(r"DATASPACE\s+SIMPLE \{ \( ([\d, ]+) \)", header)
    assert m, header[:2000]
    return tuple(int(x) for x in m[1].split(","))


@needs_h5dump
@pytest.mark.slow
def test_h5dump_reads_run_and_trajectory_files(run_dir):
    for path in [run_dir / "run.h5", *trajectory_files(run_dir).values()]:
        res = h5dump("-H", str(path))
        assert res.returncode == 0 and "ERROR" not in res.stdout + res.stderr, f"{path.name}: {res.stderr[-2000:]}"
    rewards = read_trajectories(run_dir, ["rewards"])["rewards"]
    assert rewards.shape[0] == 2 and rewards.shape[1] > 0
    res = h5dump("-H", "-d", "/trajectories/rewards", str(run_dir / "run.h5"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert _dataspace(res.stdout) == rewards.shape
    episodes = len(read_table(run_dir, "episodes")["time"])
    res = h5dump("-d", "/committed/episodes", str(run_dir / "run.h5"))
    assert res.returncode == 0 and re.search(r"\(0\): (\d+)", res.stdout)[1] == str(episodes)
    h5ls = shutil.which("h5ls")
    if h5ls:
        res = subprocess.run([h5ls, "-r", str(run_dir / "run.h5")], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "ERROR" not in res.stdout, res.stdout[-2000:]


READ_WITH_SYSTEM_H5PY = """
import json, sys, h5py
with h5py.File(sys.argv[1], "r", swmr=True, locking=False) as f:
    view = f["trajectories/rewards"][()]
    print(json.dumps({"hdf5": h5py.version.hdf5_version, "episodes": int(f["episodes/time"].shape[0]),
                      "view": list(view.shape), "real": int((f["trajectories/policy_version"][()] >= 0).sum())}))
"""


def _system_h5py() -> str | None:
    """Version of the HDF5 under /usr/bin/python3's h5py, if that h5py is there."""
    if not Path(SYSTEM_PYTHON).exists():
        return None
    res = subprocess.run([SYSTEM_PYTHON, "-c", "import h5py; print(h5py.version.hdf5_version)"],
                         capture_output=True, text=True, timeout=60)
    return res.stdout.strip() if res.returncode == 0 else None


def test_an_h5py_on_an_older_hdf5_reads_the_run(run_dir):
    version = _system_h5py()
    if version is None:
        pytest.skip("no h5py for /usr/bin/python3 (apt-get install python3-h5py; scripts/install_system_deps.sh)")
    if tuple(int(x) for x in version.split(".")[:2]) >= tuple(h5py.version.hdf5_version_tuple[:2]):
        pytest.skip(f"/usr/bin/python3's h5py uses HDF5 {version}, not older than this h5py's")
    res = subprocess.run([SYSTEM_PYTHON, "-c", READ_WITH_SYSTEM_H5PY, str(run_dir / "run.h5")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    seen = json.loads(res.stdout)
    policy_version = read_trajectories(run_dir, ["policy_version"])["policy_version"]
    assert seen["episodes"] == len(read_table(run_dir, "episodes")["time"]) > 0
    assert tuple(seen["view"]) == policy_version.shape and seen["real"] == int((policy_version >= 0).sum())


@pytest.mark.slow
@needs_h5dump
@pytest.mark.skipif(h5py.version.hdf5_version_tuple < (2, 0), reason="only HDF5 2.0 writes the format older "
                    "hpcrl runs have (libver='latest' under HDF5 2.0)")
def test_a_run_in_hdf5_2_format_resumes_and_converts(tmp_path, run_dir, capfd):
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    for path in [old / "run.h5", *trajectory_files(old).values()]:
        convert_file(path, libver="latest")  # what hpcrl wrote before the v110 bound
    assert h5dump("-H", str(old / "run.h5")).returncode != 0  # the problem: HDF5 1.10 cannot decode it
    episodes = len(read_table(old, "episodes")["time"])
    assert len(load_analysis().load_run(old).tables["episodes"]["time"]) == episodes  # what hpcrl analyze reads
    # --resume reads and appends to the 2.0-format files (the copy's config.yaml keeps the io.run_dir it was made in)
    assert cli_main(["run", "--runner", "serial", "--resume", str(old), "-o",
                     f"stop.total_env_steps={load_checkpoint(old)['env_steps'] + 500}"]) == 0
    assert len(read_table(old, "episodes")["time"]) > episodes
    capfd.readouterr()
    code = cli_main(["convert", str(old)])
    out, err = capfd.readouterr()
    assert code == 0 and "rewrote 3 files" in out, err
    for path in [old / "run.h5", *trajectory_files(old).values()]:
        assert h5dump("-H", str(path)).returncode == 0, path
    shape = _dataspace(h5dump("-H", "-d", "/trajectories/rewards", str(old / "run.h5")).stdout)
    assert shape == read_trajectories(old, ["rewards"])["rewards"].shape


def test_convert_names_what_is_wrong(tmp_path, capfd):
    assert cli_main(["convert", str(tmp_path)]) == 2
    assert capfd.readouterr().err.strip() == f"hpcrl convert: error: {tmp_path}: not a run directory (no run.h5)"
