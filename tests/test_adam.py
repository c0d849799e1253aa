"""hpcrl's Adam against torch.optim.Adam: the same parameters step for step, state dicts that load
into either class, and the state operations hpcrl relies on (skipped parameters, lr changes,
forgotten moments)."""
import pytest
import torch

from hpcrl.algos import adam as adam_module
from hpcrl.algos.adam import Adam


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(3, generator=g))]


def _step_both(ours, theirs, p_ours, p_theirs, steps: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for a, b in zip(p_ours, p_theirs):
            grad = torch.randn(a.shape, generator=g)
            a.grad, b.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()


@pytest.mark.parametrize("fused", [True, False])
def test_same_parameters_as_torch_adam(fused, monkeypatch):
    if not fused:  # the plain-tensor update (devices without torch's fused kernel)
        monkeypatch.setattr(adam_module, "_fusable", lambda p: False)
    mine, ref = _params(), _params()
    ours = Adam(mine, lr=1e-2, eps=1e-5)
    theirs = torch.optim.Adam(ref, lr=1e-2, eps=1e-5, foreach=False)
    _step_both(ours, theirs, mine, ref, steps=50)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert float(ours.state[mine[0]]["step"]) == 50


def test_state_dicts_load_into_either_class():
    mine, ref = _params(), _params()
    ours, theirs = Adam(mine, lr=3e-3), torch.optim.Adam(ref, lr=3e-3)
    _step_both(ours, theirs, mine, ref, steps=5)
    # torch's state into ours (a checkpoint written before hpcrl had its own Adam), then on together
    resumed = Adam(mine, lr=1.0)
    resumed.load_state_dict(theirs.state_dict())
    assert resumed.param_groups[0]["lr"] == 3e-3
    with torch.no_grad():
        for a, b in zip(mine, ref):
            a.copy_(b)
    _step_both(resumed, theirs, mine, ref, steps=5, seed=2)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # ours into torch's
    back = torch.optim.Adam(ref, lr=3e-3)
    back.load_state_dict(resumed.state_dict())
    _step_both(resumed, back, mine, ref, steps=3, seed=3)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_groups_lr_changes_and_skipped_parameters():
    actor, critic = _params(0), _params(1)
    opt = Adam([{"params": actor, "lr": 1e-3}, {"params": critic, "lr": 1e-2}])
    before = [p.detach().clone() for p in actor + critic]
    for p in critic:  # only the actor has gradients: the critic and its moments stay put
        p.grad = None
    for p in actor:
        p.grad = torch.ones_like(p)
    opt.step()
    assert all(not torch.equal(p, b) for p, b in zip(actor, before[:2]))
    assert all(torch.equal(p, b) for p, b in zip(critic, before[2:]))
    assert all(p not in opt.state for p in critic)
    # the first Adam step moves every coordinate by lr (m_hat / sqrt(v_hat) = 1)
    torch.testing.assert_close(actor[0].detach(), before[0] - 1e-3, rtol=0, atol=1e-6)
    opt.param_groups[0]["lr"] = 0.0  # what lr annealing does between steps
    frozen = actor[0].detach().clone()
    opt.step()
    torch.testing.assert_close(actor[0].detach(), frozen)
    del opt.state[actor[0]]  # MARL sharing forgets a copied slot's moments: it restarts at step 1
    opt.param_groups[0]["lr"] = 1e-3
    opt.step()
    assert float(opt.state[actor[0]]["step"]) == 1 and float(opt.state[actor[1]]["step"]) == 3
    torch.testing.assert_close(actor[0].detach(), frozen - 1e-3, rtol=0, atol=1e-6)


def test_refuses_what_it_does_not_implement():
    ref = _params()
    torch_opt = torch.optim.Adam(ref, weight_decay=0.1)
    with pytest.raises(ValueError, match="weight decay"):
        Adam(_params()).load_state_dict(torch_opt.state_dict())
    with pytest.raises(ValueError, match="groups do not match"):
        Adam([{"params": _params()[:1]}, {"params": _params()[1:]}]).load_state_dict(torch_opt.state_dict())
    with pytest.raises(ValueError, match="no parameters"):
        Adam([])


def test_step_counts_stay_per_parameter_when_some_skip_steps():
    """Equal counts share one step tensor; a parameter without a grad in a step keeps its own count."""
    mine, ref = _params(), _params()
    ours = Adam(mine, lr=1e-2)
    theirs = torch.optim.Adam(ref, lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(4)
    for k in range(6):
        for i, (a, b) in enumerate(zip(mine, ref)):
            skip = i == 1 and k in (2, 3)  # the bias sits out two steps
            grad = None if skip else torch.randn(a.shape, generator=g)
            a.grad, b.grad = (None, None) if skip else (grad.clone(), grad.clone())
        ours.step()
        theirs.step()
    assert [float(ours.state[p]["step"]) for p in mine] == [6, 4]
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    saved = ours.state_dict()["state"]
    assert saved[0]["step"] is not saved[1]["step"] and float(saved[1]["step"]) == 4


def test_rebuilding_a_groups_lists_reads_no_step_count_off_the_cpu():
    """HDDPG steps its critic's group, then its actor's: each build after the other group's first step must not
    read a count on the host (on a GPU, a sync in every iteration). Meta tensors stand in: they have no value."""
    actor, critic = [torch.zeros(3, device="meta", requires_grad=True)], [torch.zeros(2, device="meta",
                                                                                      requires_grad=True)]
    opt = Adam([{"params": actor}, {"params": critic}])
    for group, params in ((1, critic), (0, actor), (1, critic), (0, actor)):
        _, steps, _, _, _, counts = opt._lists(group, params)
        assert len(counts) == 1 and all(s is counts[0] for s in steps)
