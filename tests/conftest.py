"""Fixtures several test modules share (a module asks for one with ``pytestmark = pytest.mark.usefixtures(...)``)."""
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
