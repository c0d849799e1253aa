"""The whole pipeline is the algorithm: a real job's weights equal the fused update on its recorded batches.

With one learner group, sync admission and on-policy sampling, a job of either runner (the serial
runner's threads or MPI ranks) must train exactly what PPO's fused ``update`` trains on the same
batches: every minibatch gradient at the newest weights, Adam on the parameter rank with the
annealed learning rate, GAE on the learner's values. The test runs K rounds of a small job, rebuilds
each batch from the actors' trajectory files alone (observations and rewards as the actors
normalised them, ``bootstrap_values`` where a fragment does not continue an episode), replays
``algo.update`` on them from the job's initial weights and compares with the job's final checkpoint.
Anything in between that changes what is trained (a stale weight read, an lr step off by a batch, a
batch in another order, a lost or doubled gradient, a wrong bootstrap) moves the weights by far more
than float rounding; the test checks that it would notice (one batch fewer is far off).

Tests that only read a job share it (the ``jobs`` fixture); serial jobs run in this process.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcrl.algos import make_algorithm
from hpcrl.cli import main as cli_main
from hpcrl.config import load_config
from hpcrl.io import read_table, read_trajectory
from hpcrl.io.schema import traj_filename
from hpcrl.runtime.record.checkpoint import load_checkpoint
from hpcrl.runtime.roles.learner import minibatch_generator
from hpcrl.runtime.roles.sampler import describe_env


ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
TOLERANCE = 1e-5
"""Largest |difference| of any weight allowed: float rounding (the learner's value forward runs on
another batch shape than the replay's), far below what one Adam step at these learning rates moves."""

JOBS = {
    # the shipped Hopper config (CleanRL's PPO), shrunk: 2 actors x 1 env x 64 steps, 2 x 2 minibatches of
    # 32 per batch; the lr anneals over 1,000 steps so every batch has its own lr; Hopper terminates often
    "hopper": (str(ROOT / "hpcrl" / "configs" / "hopper.yaml"),
               ["actors.count=2", "actors.fragment_length=64", "algo.train_batch_size=128", "algo.minibatch_size=32",
                "algo.num_sgd_iter=2", "stop.total_env_steps=1000"]),
    # Pendulum's episodes end only by its 200-step time limit: truncations inside the fragments,
    # bootstrapped from bootstrap_values; two envs per actor
    "pendulum": (str(ROOT / "hpcrl" / "configs" / "hopper.yaml"),
                 ["env.id=Pendulum-v1", "env.num_envs=2", "actors.count=2", "actors.fragment_length=80",
                  "algo.train_batch_size=320", "algo.minibatch_size=80", "algo.num_sgd_iter=2",
                  "stop.total_env_steps=2000"]),
}


def run_job(tmp_path: Path, job: str, runner: str, extra: list[str] = ()) -> Path:
    """``hpcrl run`` of JOBS[job]: the serial runner in this process (it needs no process of its own), the MPI
    runner in a subprocess that starts mpiexec."""
    config, overrides = JOBS[job]
    run_dir = tmp_path / f"{job}-{runner}"
    overrides = [*overrides, f"stop.max_rounds={ROUNDS}", f"io.run_dir={run_dir}", "io.log_seconds=60", *extra]
    args = ["run", config, "--runner", runner, *[a for o in overrides for a in ("-o", o)]]
    if runner == "serial":
        assert cli_main(args) == 0
        return run_dir
    done = subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return run_dir


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """``jobs(job, runner, *extra)``: the run directory of that job, run once for every test that only reads it
    (a test that resumes one works on a copy)."""
    made: dict[tuple, Path] = {}

    def get(job: str, runner: str, *extra: str) -> Path:
        key = (job, runner, *extra)
        if key not in made:
            made[key] = run_job(tmp_path_factory.mktemp("job"), job, runner, list(extra))
        return made[key]

    return get


def recorded_fragments(run_dir: Path, actor: int, T: int) -> list[dict[str, np.ndarray]]:
    """The actor's fragments as its learner received them ([T, N] arrays), from its trajectory file alone."""
    path = run_dir / traj_filename(actor)
    data = read_trajectory(path)
    with h5py.File(path, "r", locking=False) as f:
        N = int(f.attrs["num_envs"])
    steps = len(data["rewards"]) // (T * N)
    frags = []
    for k in range(steps):
        rows = slice(k * T * N, (k + 1) * T * N)
        part = {name: a[rows].reshape(T, N, *a.shape[1:]) for name, a in data.items()}
        boot = part["bootstrap_values"]
        assert not np.isnan(boot).any(), "bootstrap_values not recorded"
        frags.append({**part, "final_values": np.where(part["truncated"] == 1, boot, 0.0).astype(np.float32),
                      "last_value": boot[-1]})
    for k in range(steps - 1):  # the observation after a fragment opens the next one: the learner's last_obs
        frags[k]["last_obs"] = frags[k + 1]["obs"][0]
    return frags


def replay(run_dir: Path, batches: int) -> torch.Tensor:
    """The fused update (algo.update per minibatch, Adam, the documented lr schedule) on the job's first
    ``batches`` recorded batches, from the job's initial weights; returns the flat weights."""
    cfg = load_config(run_dir / "config.yaml")
    env = describe_env(cfg.env)
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    torch.manual_seed(cfg.env.seed)  # every role's initial weights
    model = algo.make_model(env.observation_space, env.action_space)
    optimizer = algo.make_optimizer(model)
    generator = minibatch_generator(cfg.env.seed, 0)
    actors = [recorded_fragments(run_dir, a, cfg.actors.fragment_length) for a in range(cfg.actors.count)]
    per_batch = cfg.algo.train_batch_size // (cfg.actors.fragment_length * env.num_envs)
    assert per_batch == cfg.actors.count, "on-policy sync: one fragment of every actor per batch"
    # a version per minibatch gradient, or one per batch when the group pushes its whole update
    versions_per_batch = (1 if cfg.learners.push == "update"
                          else cfg.algo.num_sgd_iter * -(-cfg.algo.train_batch_size // cfg.algo.minibatch_size))
    for k in range(batches):
        fragments = [frags[k] for frags in actors]  # the learner's order: by actor
        for f in fragments:  # on-policy: batch k was sampled with the weights batch k - 1 made
            assert (f["policy_version"] == k * versions_per_batch).all()
        lr = cfg.algo.lr * max(0.0, 1.0 - k * cfg.algo.train_batch_size / cfg.algo.lr_anneal_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = algo.prepare(fragments, model)
        for mb in algo.minibatches(batch, generator):
            algo.update(mb, model, optimizer)
    return model.flat.params.detach().clone()


@pytest.mark.parametrize("runner", ["serial", pytest.param("mpi", marks=pytest.mark.mpi)])
@pytest.mark.parametrize("job", sorted(JOBS))
@pytest.mark.slow
def test_job_weights_equal_the_fused_update_on_its_recorded_batches(jobs, job, runner):
    assert_trained_as_the_fused_update(jobs(job, runner), f"{job}/{runner}")


SLOW_ACTOR = ("debug.slow_actor=1", "debug.slow_actor_seconds=0.4")


@pytest.mark.mpi
@pytest.mark.slow
def test_a_slow_actor_keeps_its_place_in_every_batch(jobs):
    """On-policy: actor 1 takes 0.4 s longer per fragment. Actor 0 must not fill its place with a second fragment
    sampled with the same weights: each batch holds one fragment of each actor, and the job is still the fused
    update on them."""
    run_dir = jobs("hopper", "mpi", *SLOW_ACTOR)
    assert_trained_as_the_fused_update(run_dir, "slow actor/mpi")


def assert_trained_as_the_fused_update(run_dir: Path, label: str) -> None:
    """The job's final weights equal the replay of its ROUNDS batches, and (so the check can fail) the same
    replay one batch short is far off."""
    trained = load_checkpoint(run_dir)["params"]
    gap = float((trained - replay(run_dir, ROUNDS)).abs().max())
    assert gap < TOLERANCE, f"{label}: the job's weights differ from the fused update by up to {gap:.3g}"
    short = float((trained - replay(run_dir, ROUNDS - 1)).abs().max())
    assert short > 100 * TOLERANCE, f"one batch fewer moves the weights by only {short:.3g}"


@pytest.mark.parametrize("runner", ["serial", pytest.param("mpi", marks=pytest.mark.mpi)])
@pytest.mark.slow
def test_update_push_makes_one_version_per_batch_and_gradient_push_one_per_minibatch(jobs, runner):
    """hopper.yaml's learners.push=update: the group runs every minibatch step itself with its own Adam (lr
    annealed per batch from the CONSUMED word) and pushes theta_start - theta_end; rank 0's outer step (lr 1, no
    momentum) lands on the group's weights, so the job trains what the fused loop trains, one version per batch
    (the JOBS test above). learners.push=gradient, one push per minibatch on the newest weights, trains the same."""
    updates = read_table(jobs("hopper", runner) / "run.h5", "gradients")
    assert list(updates["inner_steps"]) == [8] * ROUNDS  # 2 passes x 4 minibatches of 32 per batch of 128
    run_dir = jobs("hopper", runner, "learners.push=gradient")
    assert_trained_as_the_fused_update(run_dir, f"gradient push/{runner}")


@pytest.mark.mpi
@pytest.mark.slow
def test_an_on_policy_sync_mpi_job_repeats_itself_exactly(jobs):
    # every rank's randomness is seeded and a learner orders its batch by actor, so arrival timing changes nothing:
    # the second job is the slow-actor test's, whose actor 1 takes 0.4 s longer per fragment (its fragments arrive
    # last, where they may come first or last in two runs of one config)
    first, second = jobs("hopper", "mpi"), jobs("hopper", "mpi", *SLOW_ACTOR)
    assert torch.equal(load_checkpoint(first)["params"], load_checkpoint(second)["params"])
    trained = ROUNDS * 64  # steps of each actor's ROUNDS fragments (fragment_length 64, one env)
    for actor in range(2):
        a, b = read_trajectory(first / traj_filename(actor)), read_trajectory(second / traj_filename(actor))
        # an actor may sample one more fragment before the stop reaches it (timing): the trained ones must agree
        assert min(len(a["rewards"]), len(b["rewards"])) >= trained
        for name in ("actions", "rewards"):
            assert np.array_equal(a[name][:trained], b[name][:trained]), f"actor {actor}: {name} differ"


@pytest.mark.slow
def test_a_serial_job_repeats_itself_exactly(tmp_path, jobs):
    # docs/runtime.md "The same seed, the same record": sync admission, actors.on_policy=true (hopper.yaml)
    first = jobs("hopper", "serial")
    second = run_job(tmp_path, "hopper", "serial")
    assert torch.equal(load_checkpoint(first)["params"], load_checkpoint(second)["params"])
    a, b = read_table(first / "run.h5", "episodes"), read_table(second / "run.h5", "episodes")
    for actor in range(2):  # each actor's episodes; the order of two actors' rows is their arrival's
        for name in ("return", "length", "policy_version"):
            assert np.array_equal(a[name][a["actor"] == actor], b[name][b["actor"] == actor]), f"episodes.{name}"
    for actor in range(2):
        a, b = read_trajectory(first / traj_filename(actor)), read_trajectory(second / traj_filename(actor))
        for name in ("actions", "rewards"):
            assert np.array_equal(a[name], b[name]), f"actor {actor}: {name} differ"


@pytest.mark.mpi
@pytest.mark.slow
def test_update_push_resume_goes_on_with_each_groups_optimizer_state(tmp_path, jobs):
    """--resume of an update-push job: the group's Adam continues (its step count and moments are those of the
    checkpoint, not a fresh optimizer's) and so does its minibatch order's generator. The job resumed is a copy of
    the update-push test's ROUNDS-round MPI job, resumed for one round more."""
    run_dir = tmp_path / "run"
    shutil.copytree(jobs("hopper", "mpi"), run_dir)  # hopper.yaml pushes updates
    first = load_checkpoint(run_dir)["inner_states"][0]
    assert _adam_steps(first["optimizer"]) == ROUNDS * 8
    res = subprocess.run([sys.executable, "-m", "hpcrl", "run", "--resume", str(run_dir), "-o",
                          f"stop.max_rounds={ROUNDS + 1}"], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    second = load_checkpoint(run_dir)["inner_states"][0]
    assert _adam_steps(second["optimizer"]) == (ROUNDS + 1) * 8  # a fresh optimizer would have taken 8
    # the generator went on from where the first job left it: one batch's draws past the first job's state
    g = torch.Generator()
    g.set_state(first["minibatch_rng"])
    cfg = load_config(run_dir / "config.yaml")
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    for _ in algo.minibatches({"advantages": torch.zeros(cfg.algo.train_batch_size)}, g):
        pass
    assert torch.equal(g.get_state(), second["minibatch_rng"])


def _adam_steps(state: dict) -> int:
    steps = {int(s["step"]) for s in state["state"].values()}
    assert len(steps) == 1
    return steps.pop()
