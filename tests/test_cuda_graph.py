"""PPO's device-only gradient (what a CUDA graph captures) and the graph replay against eager compute_gradient."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from hpcrl.algos.ppo import GRADIENT_STATS, PPO, gradient_and_stats
from hpcrl.config import ModelConfig, PPOConfig
from hpcrl.runtime.roles.cuda_graph import GraphedGradient

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SPACES = {"discrete": (spaces.Box(-1, 1, (4,)), spaces.Discrete(2)),
          "continuous": (spaces.Box(-1, 1, (11,)), spaces.Box(-1, 1, (3,)))}


def setup(kind: str, device: str, rows: int = 64, seed: int = 0):
    obs_space, action_space = SPACES[kind]
    algo = PPO(PPOConfig(kl_coeff=0.2, entropy_coeff=0.01, max_grad_norm=0.1), ModelConfig(hidden_sizes=[64, 64]))
    torch.manual_seed(seed)
    weights = algo.make_model(obs_space, action_space).flat.params.detach().clone()
    model = algo.make_model(obs_space, action_space, torch.device(device))
    model.flat.load_(weights)
    g = torch.Generator().manual_seed(seed)
    actions = (torch.randint(0, 2, (rows,), generator=g) if kind == "discrete" else torch.randn(rows, 3, generator=g))
    mb = {"obs": torch.randn(rows, obs_space.shape[0], generator=g), "actions": actions,
          "behaviour_logp": torch.randn(rows, generator=g) * 0.1 - 1.0, "values": torch.randn(rows, generator=g),
          "advantages": torch.randn(rows, generator=g), "returns": torch.randn(rows, generator=g)}
    return algo, model, {k: v.to(device) for k, v in mb.items()}, weights


@pytest.mark.parametrize("kind", sorted(SPACES))
def test_device_only_gradient_is_compute_gradient(kind):
    algo, model, mb, _ = setup(kind, "cpu")
    eager, stats = algo.compute_gradient(mb, model)
    eager = eager.clone()
    grad, vector = algo.gradient_tensors(mb, model)
    torch.testing.assert_close(grad, eager)
    assert algo.gradient_stat_names == GRADIENT_STATS and vector.shape == (len(GRADIENT_STATS),)
    assert dict(zip(GRADIENT_STATS, vector.tolist())) == pytest.approx(stats)
    assert stats["grad_norm"] > 0.1  # clipped: the returned gradient has norm max_grad_norm
    assert float(torch.linalg.vector_norm(grad)) == pytest.approx(0.1, rel=1e-4)


def test_kl_coefficient_is_read_from_the_model_tensor():
    algo, model, mb, _ = setup("discrete", "cpu")
    mb["behaviour_logp"] = mb["behaviour_logp"] - 0.5  # a KL term that matters
    _, at_02 = gradient_and_stats(mb, model, algo.cfg, kl_coeff=model.constants["kl_coeff"])
    with torch.no_grad():
        model.constants["kl_coeff"].fill_(2.0)
    _, at_2 = gradient_and_stats(mb, model, algo.cfg, kl_coeff=model.constants["kl_coeff"])
    kl = at_2[GRADIENT_STATS.index("kl")]
    assert float(at_2[0] - at_02[0]) == pytest.approx(1.8 * float(kl), rel=1e-4)  # loss moved by 1.8 KL


def test_graphs_refuse_a_cpu_model():
    algo, model, _, _ = setup("discrete", "cpu")
    with pytest.raises(ValueError, match="needs a CUDA model"):
        GraphedGradient(algo, model)


@CUDA
@pytest.mark.parametrize("kind", sorted(SPACES))
def test_graph_replay_matches_eager_across_new_weights_and_shapes(kind):
    algo, model, mb, weights = setup(kind, "cuda")
    graphed = GraphedGradient(algo, model)
    for step in range(3):  # new weights each time, loaded in place as the learner does
        w = weights + 0.01 * step * torch.randn_like(weights)
        model.flat.load_(w.numpy())
        got, stats = graphed(mb)
        got = got.copy()
        eager, eager_stats = algo.compute_gradient(mb, model)
        np.testing.assert_allclose(got, eager.cpu().numpy(), rtol=1e-4, atol=1e-6)
        assert stats == pytest.approx(eager_stats, rel=1e-4, abs=1e-6)
    short = {k: v[:40] for k, v in mb.items()}  # a batch's last, shorter minibatch: a second graph
    got, _ = graphed(short)
    np.testing.assert_allclose(got, algo.compute_gradient(short, model)[0].cpu().numpy(), rtol=1e-4, atol=1e-6)
    assert len(graphed.graphs) == 2


@CUDA
def test_graph_copies_the_same_tensors_again_after_an_in_place_change():
    algo, model, mb, _ = setup("discrete", "cuda")
    graphed = GraphedGradient(algo, model)
    first = graphed(mb)[0].copy()
    again = graphed(mb)[0].copy()  # the same tensors: not copied again, the same gradient
    np.testing.assert_array_equal(first, again)
    mb["advantages"].mul_(-1.0)  # the same tensor, new values: must be copied
    flipped = graphed(mb)[0].copy()
    np.testing.assert_allclose(flipped, algo.compute_gradient(mb, model)[0].cpu().numpy(), rtol=1e-4, atol=1e-6)
    assert not np.allclose(first, flipped)


@CUDA
def test_a_launched_gradient_survives_the_next_launch():
    """The learner pushes gradient k while the graph computes k + 1 (learners.overlap_push)."""
    algo, model, mb, _ = setup("discrete", "cuda")
    graphed = GraphedGradient(algo, model)
    first, _ = graphed.launch(mb).result()
    kept = first.copy()
    other = {k: v.clone() for k, v in mb.items()}
    other["advantages"].mul_(-1.0)
    launched = graphed.launch(other)  # same shape, same graph: its copy goes to the other host buffer
    np.testing.assert_array_equal(first, kept)
    second, _ = launched.result()
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_allclose(second, algo.compute_gradient(other, model)[0].cpu().numpy(), rtol=1e-4, atol=1e-6)


@CUDA
@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [True, False])
def test_a_cuda_job_pushes_every_gradient_once_with_and_without_overlap(tmp_path, overlap):
    from test_runtime_e2e import hpcrl_run, write_config

    from hpcrl.io import read_table
    cfg, run_dir = write_config(tmp_path, learners={"device": "cuda", "overlap_push": overlap},
                                algo={"num_sgd_iter": 4}, stop={"total_env_steps": 3000})
    res = hpcrl_run(str(cfg))
    assert res.returncode == 0, res.stdout[-3000:]
    g = read_table(run_dir / "run.h5", "gradients", ["seq", "staleness"])
    assert np.array_equal(np.sort(g["seq"]), np.arange(g["seq"].size))  # each once, none lost
    cycles = read_table(run_dir / "run.h5", "learner_cycles", ["seq"])
    assert np.array_equal(np.sort(cycles["seq"]), np.arange(g["seq"].size))
    stale = np.mean(g["staleness"] >= 1)
    if overlap:  # every gradient after a batch's first was computed before the previous one was pushed
        assert stale >= 0.6, stale
