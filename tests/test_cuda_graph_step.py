"""A group's whole minibatch step (gradient, clipping, Adam) replayed from a CUDA graph, against the eager step."""
import numpy as np
import pytest
import torch
from test_cuda_graph import CUDA, setup

from hpcrl.algos.adam import Adam
from hpcrl.runtime.roles.group_update import GroupUpdate


def test_adam_with_a_tensor_rate_steps_as_with_a_number():
    torch.manual_seed(0)
    a = [torch.randn(7, requires_grad=True) for _ in range(3)]
    b = [p.detach().clone().requires_grad_() for p in a]
    by_number, by_tensor = Adam(a, lr=3e-3, eps=1e-5), Adam(b, lr=3e-3, eps=1e-5)
    by_tensor.param_groups[0]["lr"] = torch.tensor(3e-3)
    for step in range(4):
        if step == 2:  # a schedule's new rate: set on the number, filled into the tensor
            by_number.param_groups[0]["lr"] = 1e-3
            by_tensor.param_groups[0]["lr"].fill_(1e-3)
        for p, q in zip(a, b):
            p.grad = torch.randn(7)
            q.grad = p.grad.clone()
        by_number.step()
        by_tensor.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    saved = by_tensor.state_dict()["param_groups"][0]["lr"]
    assert isinstance(saved, float) and saved == pytest.approx(1e-3)


def test_a_cpu_group_takes_the_eager_step():
    algo, model, _, _ = setup("continuous", "cpu")
    assert GroupUpdate(algo, model, torch.Generator(), cuda_graphs=True).graphed is None


def two_batches(kind: str, device: str, cuda_graphs: bool, resume_from: dict | None = None):
    """The weights after two batches (4 minibatches x 2 passes each, the rate changed between them), the stats
    of each batch and the group's state."""
    algo, model, mb, _ = setup(kind, device, rows=256)
    algo.cfg.minibatch_size, algo.cfg.num_sgd_iter = 64, 2
    inner = GroupUpdate(algo, model, torch.Generator().manual_seed(1), cuda_graphs)
    if resume_from is not None:
        inner.restore(resume_from)
    stats = []
    for lr in (5e-4, 2e-4):
        inner.set_lr(lr)
        got = inner.run(mb, inner.fused_step)
        stats.append(got[1])
        mb = {k: v.flip(0) for k, v in mb.items()}
    return model.flat.params.detach().cpu().numpy(), stats, inner


@CUDA
@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_the_replayed_update_is_the_eager_update(kind):
    eager, eager_stats, _ = two_batches(kind, "cuda", cuda_graphs=False)
    graphed, graphed_stats, inner = two_batches(kind, "cuda", cuda_graphs=True)
    assert inner.graphed is not None and len(inner.graphed.graphs) == 1
    np.testing.assert_allclose(graphed, eager, rtol=1e-4, atol=1e-6)
    for e, g in zip(eager_stats, graphed_stats):
        assert g["inner_steps"] == e["inner_steps"] == 8
        assert g == pytest.approx(e, rel=1e-3, abs=1e-6)


@CUDA
def test_a_resumed_group_recaptures_on_its_restored_state():
    _, _, first = two_batches("discrete", "cuda", cuda_graphs=True)
    saved = first.state()
    eager, _, _ = two_batches("discrete", "cuda", cuda_graphs=False, resume_from=saved)
    graphed, _, inner = two_batches("discrete", "cuda", cuda_graphs=True, resume_from=saved)
    np.testing.assert_allclose(graphed, eager, rtol=1e-4, atol=1e-6)
    assert isinstance(inner.optimizer.param_groups[0]["lr"], torch.Tensor)

