"""Fixtures several test modules share (a module asks for one with ``pytestmark = pytest.mark.usefixtures(...)``),
and the xdist group of make test's second pass."""
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
    """make test's second pass (``-n 2 --dist loadgroup``): the Slurm tests share the one local cluster, so they
    run one after another on one worker, and the other MPI tests fill both workers around them. Without
    ``--dist loadgroup`` the group changes nothing."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("cluster"))
