"""Fixtures several test modules share (a module asks for one with ``pytestmark = pytest.mark.usefixtures(...)``),
and the xdist groups of make test's second pass."""
from __future__ import annotations

import pytest


@pytest.fixture
def one_torch_thread():
    """Small tensors: a second intra-op thread only waits for a busy core on a shared machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(items) -> None:
    """The modules that hold a slow test first (each module's tests kept together and in order, so a module's
    fixtures are made once), so that make test's passes do not end with one worker on a long test and the
    other idle. make test's second pass (``-n 2 --dist loadgroup``) runs two queues side by side, each one test
    at a time: the Slurm tests (they share the one local cluster) and the other MPI tests (each starts a job
    of several ranks; two of them at once took longer than one beside a Slurm test, which mostly waits).
    Without ``--dist loadgroup`` the groups change nothing."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module.__name__ not in slow_modules)  # stable: the order within stays
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("cluster"))
        elif item.get_closest_marker("mpi"):
            item.add_marker(pytest.mark.xdist_group("mpi"))
