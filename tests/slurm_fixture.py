"""The session fixture for tests that need Slurm: use the one answering sinfo, or start the local cluster."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "local_cluster.sh"


def sinfo_ok() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="session")
def slurm():
    """A running Slurm; the local cluster (3 nodes) is started here, and stopped at the end, only if none was running."""
    if sinfo_ok():
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("no Slurm running and not root: start one with `sudo scripts/local_cluster.sh start`")
    start = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    if start.returncode != 0:
        pytest.skip(f"scripts/local_cluster.sh start failed: {start.stderr.strip().splitlines()[-1:]}")
    conf = subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True).stdout.split("=", 1)[1].strip()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf  # in case /etc/slurm/slurm.conf belongs to someone else
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):
    """predicate()'s first true value, polled every ``poll`` s; AssertionError naming ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
