"""ClusterEnv keeps its head from starving workers that share its cores: the head's torch threads."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.clusterenv.threads import head_threads_for, usable_cores, workers_on_this_host
from hpcrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_the_rule_leaves_one_core_per_worker_on_the_head_host():
    assert head_threads_for("auto", cores=2, sharing=2) == 1
    assert head_threads_for("auto", cores=16, sharing=2) == 14
    assert head_threads_for("auto", cores=2, sharing=5) == 1
    assert head_threads_for("auto", cores=16, sharing=0) is None  # workers elsewhere: torch's setting stays
    assert head_threads_for(3, cores=2, sharing=2) == 3
    assert head_threads_for(None, cores=2, sharing=2) is None
    import socket

    here = socket.gethostname()
    assert workers_on_this_host([{"host": here}, {"host": here + "-other"}, {"host": here}]) == 2


def test_bad_head_threads_is_one_line():
    import hpcrl

    for bad in (0, "many", 1.5, True):
        with pytest.raises(ConfigError, match=r"^head_threads: .*; allowed: 'auto', an int >= 1, or None$"):
            hpcrl.ClusterEnv("CartPole-v1", 4, workers=2, head_threads=bad)


HEAD = """
import sys, torch, hpcrl
cores = int(sys.argv[1])
torch.set_num_threads(cores)  # torch's default: one thread per core
for setting, expected in (("auto", max(1, cores - 2)), (None, cores)):
    env = hpcrl.ClusterEnv("CartPole-v1", 4, workers=2, head_threads=setting)
    env.reset(seed=0)
    env.step(env.action_space.sample())
    inside = torch.get_num_threads()
    env.close()
    print(setting, inside, expected, torch.get_num_threads())
"""


@pytest.mark.mpi
@pytest.mark.slow
def test_the_head_gets_fewer_threads_while_local_workers_run_and_its_own_back_at_close(tmp_path):
    cores = usable_cores()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, "-c", HEAD, str(cores)], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    rows = [line.split() for line in res.stdout.splitlines()]
    assert rows == [["auto", str(max(1, cores - 2)), str(max(1, cores - 2)), str(cores)],
                    ["None", str(cores), str(cores), str(cores)]]
