"""RMA windows under real concurrency (each test starts mpiexec; bodies run on COMM_SELF and COMM_WORLD)."""
import pytest
from mpi_programs.launcher import run_mpi


@pytest.mark.mpi
def test_mailbox_one_rank_pushes_to_itself():
    assert "OK mailbox" in run_mpi(1, "mailbox_stress", 1, 2, 60, 1000, 0, timeout=30)


@pytest.mark.mpi
@pytest.mark.slow
def test_mailbox_thousands_of_pushes_from_shared_groups():
    # 5 pushers into 3 groups (two groups shared by two ranks), 2 slots each, random sleeps
    out = run_mpi(6, "mailbox_stress", 3, 2, 500, 2000, 0, timeout=45)
    assert "OK mailbox" in out


@pytest.mark.mpi
@pytest.mark.slow
def test_mailbox_back_pressure_makes_learners_wait():
    out = run_mpi(4, "mailbox_stress", 3, 2, 40, 100_000, 0.01, "expect-wait", timeout=30)
    assert "OK mailbox" in out


@pytest.mark.mpi
@pytest.mark.slow
def test_weight_board_never_returns_a_torn_copy_and_counters_are_exact():
    # history=1: the reader's slot is rewritten under it all the time, so the seqlock must work
    out = run_mpi(3, "weight_board", 100_000, 1, 0.6, timeout=60)
    assert "OK board size=3" in out
    out = run_mpi(4, "weight_board", 50_000, 3, 0.6, timeout=30)
    assert "OK board size=4" in out
