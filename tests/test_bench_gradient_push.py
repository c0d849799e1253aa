"""The gradient-push benchmark runs end to end on tiny sizes and prints every path."""
import subprocess
import sys

import pytest


@pytest.mark.mpi
@pytest.mark.slow
def test_gradient_push_bench_prints_all_paths():
    out = subprocess.run([sys.executable, "-m", "hpcrl", "bench", "gradient-push", "--sizes", "1000",
                          "--seconds", "0.02", "--timeout", "60"], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr[-2000:]
    for path in ("numpy memcpy", "mailbox push (learner)", "pickle over MPI send/recv", "JSON list() round trip"):
        assert path in out.stdout
