"""Fixtures several test modules share (a module asks for one with ``pytestmark = pytest.mark.usefixtures(...)``),
and the order of make test's passes."""
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
    fixtures are made once), so that make test's passes (scripts/test_passes.sh) do not end with one worker on a
    long test and the other idle."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module.__name__ not in slow_modules)  # stable: the order within stays
