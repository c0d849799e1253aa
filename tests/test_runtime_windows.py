"""The job's shared objects under real concurrency, each invariant on both transports.

One body per invariant (tests/mpi_programs/stress.py) runs on the RMA windows under mpiexec (ranks, COMM_SELF
then COMM_WORLD) and on the serial runner's in-memory twins (threads, one then N).
"""
import pytest
from mpi_programs.launcher import run_mpi
from mpi_programs.stress import run_threads

BACKENDS = ["threads", pytest.param("mpi", marks=pytest.mark.mpi)]
SLOW_ON_MPI = ["threads", pytest.param("mpi", marks=[pytest.mark.mpi, pytest.mark.slow])]
"""The threads take a fraction of a second where mpiexec's start alone takes more."""


def stress(backend: str, n: int, name: str, *args, timeout: float) -> str:
    """Invariant ``name`` on ``n`` ranks of ``backend``; what it said (an assertion failed otherwise)."""
    if backend == "mpi":
        return run_mpi(n, "stress", name, *args, timeout=timeout)
    return run_threads(n, name, *args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mailbox_one_rank_pushes_to_itself(backend):
    assert "OK mailbox" in stress(backend, 1, "mailbox", 1, 2, 60, 1000, 0, timeout=30)


@pytest.mark.parametrize("backend", SLOW_ON_MPI)
def test_mailbox_thousands_of_pushes_from_shared_groups(backend):
    # 5 pushers into 3 groups (two groups shared by two ranks), 2 slots each, random sleeps
    assert "OK mailbox" in stress(backend, 6, "mailbox", 3, 2, 500, 2000, 0, timeout=45)


@pytest.mark.parametrize("backend", SLOW_ON_MPI)
def test_mailbox_back_pressure_makes_learners_wait(backend):
    assert "OK mailbox" in stress(backend, 4, "mailbox", 3, 2, 40, 100_000, 0.01, 1, timeout=30)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_weight_board_never_returns_a_torn_copy_and_counters_are_exact(backend):
    # history=1: the reader's slot is rewritten under it all the time, so the seqlock must work
    assert "OK board size=3" in stress(backend, 3, "board", 100_000, 1, 0.6, timeout=60)
    assert "OK board size=4" in stress(backend, 4, "board", 50_000, 3, 0.6, timeout=30)


TWO_CLIQUES = {"MPIR_CVAR_NUM_CLIQUES": "2", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "lo"}
"""Ranks on two MPICH "nodes": rank 0's words reached over OFI/TCP by half the ranks, in shared memory by the rest."""


@pytest.mark.parametrize("backend, env", [("threads", None), pytest.param("mpi", None, marks=pytest.mark.mpi),
                                          pytest.param("mpi", TWO_CLIQUES, marks=pytest.mark.mpi)],
                         ids=["threads", "mpi", "mpi-two-nodes"])
def test_a_read_sees_all_words_of_an_add_each_or_none(backend, env):
    # rank 0 frees an on-policy version's places in every group's backlog word at once
    # (runtime/roles/freed_places.py): an actor that saw some groups freed and not others would route by timing
    said = (run_mpi(4, "stress", "words_together", 6, 1.5, timeout=60, env=env) if backend == "mpi"
            else run_threads(4, "words_together", 6, 1.5))
    reads = int(said.split("reads=")[1].split()[0])
    assert "OK words_together size=4" in said and reads > 100, said
