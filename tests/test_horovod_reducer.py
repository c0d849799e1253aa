"""Horovod as the learner-group allreduce: the group mean on split communicators, and the config check."""
import re

import pytest
from mpi_programs.launcher import MPIEXEC, run_mpi

from hpcrl.runtime.transport.group_reduce import horovod_available

NO_HOROVOD = "horovod.torch is not importable here (build it with docs/runtime.md's recipe to run this test)"


@pytest.mark.mpi
def test_horovod_averages_within_each_learner_group():
    if not horovod_available():
        print(f"skipped: {NO_HOROVOD}")
        pytest.skip(NO_HOROVOD)
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec next to this Python ({MPIEXEC})")
    out = run_mpi(4, "horovod_group_average", 2, timeout=120)  # two groups of two ranks
    # found anywhere in a line: Horovod's own log lines from other ranks can land in the middle of one
    assert sorted(re.findall(r"OK horovod rank (\d+)", out)) == list("0123"), out[-3000:]


def test_run_refuses_horovod_when_it_is_not_installed(tmp_path):
    if horovod_available():
        pytest.skip("horovod is installed here")
    import argparse

    from hpcrl.commands.run import add_arguments, resolve_plan
    from hpcrl.errors import ConfigError

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["-o", "learners.allreduce=horovod", "-o", "learners.ranks_per_group=2",
                         "-o", f"io.run_dir={tmp_path}/r"])
    with pytest.raises(ConfigError, match=r"^learners.allreduce: horovod"):
        resolve_plan(args)
