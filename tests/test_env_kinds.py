"""Every environment kind on the actors: the env backends in process, and each shipped config through
`hpcrl run` in this process (serial), and under mpi (the CLI and mpiexec) one config per env backend: CartPole
(batched, 2 actor ranks), LES probes (PettingZoo copies, a shared cache) and OpenFOAM (gymnasium envs, a solver
process each; Lorenz's gymnasium envs instead where OpenFOAM is missing). An actor rank builds and steps its envs
with the same sampler and backend code in both runners, so les_closure (gymnasium, LES cache) and wallmodel_tiny
(PettingZoo copies, channel cache) run serially only.

The shipped configs run with tiny budgets and tiny env settings (short spin-up, tiny LES, few
OpenFOAM iterations) given with -o, so the file stays well under a minute on two busy cores.
Every run is checked against its own trajectory files: each recorded episode return is the sum
of the rewards its instance received (so rewards, episode ends and instance indices agree).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv

from hpcrl.algos import make_algorithm
from hpcrl.commands.run import create_run_dir, validate
from hpcrl.config import AggregationConfig, EnvConfig, ModelConfig, PPOConfig, load_config
from hpcrl.envs.parrl import foam_case as fc
from hpcrl.errors import ConfigError
from hpcrl.io import read_table, read_trajectory
from hpcrl.runtime.roles.env_backends import ParallelBackend, make_backend, shared_spaces
from hpcrl.runtime.roles.sampler import VectorSampler, describe_env, rescale


CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs"
FOAM_MISSING = fc.find_bashrc() is None or fc.find_tutorial() is None
# a short spin-up (t = 1.6) and 3-action episodes: the tiny channel in seconds
SHORT_CHANNEL = {"preset": "tiny", "spinup_steps": 200, "snapshots": 2, "snapshot_every": 100, "max_actions": 3}
TINY_LES = {"les_n": 16, "dns_n": 64, "kp": 3.0, "re": 500.0, "t_end": 0.4, "interval": 0.1}


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> Path:
    """Spun-up channel fields and LES references, made once for the whole file."""
    return tmp_path_factory.mktemp("env-caches")


# ---------------------------------------------------------------- backends, in process

def test_batched_backend_autoresets_and_keeps_the_final_observation():
    cfg = EnvConfig(id="hpcrl/CartPole-v1", num_envs=6, kwargs={"max_episode_steps": 5})
    assert describe_env(cfg).num_envs == 6
    short, longer = make_backend(cfg), make_backend(cfg.model_copy(update={"kwargs": {"max_episode_steps": 6}}))
    o1, o2 = short.reset(seed=3), longer.reset(seed=3)
    assert o1.shape == (6, 4) and np.array_equal(o1, o2)
    for t in range(5):
        a = np.arange(6) % 2
        s1, s2 = short.step(a), longer.step(a)
    # the 5-step limit truncated every instance that was not terminated; the 6-step twin went on
    assert np.all(s1.truncated | s1.terminated) and s1.truncated.any() and not s2.truncated.any()
    alive = ~s2.terminated
    assert np.allclose(s1.final_obs[alive], s2.obs[alive])  # the observation the episode ended in
    assert np.all(np.abs(s1.obs) <= 0.05)  # already the fresh initial states
    short.close(), longer.close()


def test_sampler_bootstraps_truncated_batched_instances_from_their_final_observation():
    cfg = EnvConfig(id="hpcrl/CartPole-v1", num_envs=8, seed=11, kwargs={"max_episode_steps": 5})
    algo = make_algorithm(PPOConfig(), ModelConfig(hidden_sizes=[8]), AggregationConfig(is_truncation=False))
    info = describe_env(cfg)
    model = algo.make_model(info.observation_space, info.action_space)
    sampler = VectorSampler(cfg, actor_index=2, gamma=0.99)
    frag, episodes = sampler.sample(algo, model, 5, 0, 2)
    twin = make_backend(cfg.model_copy(update={"kwargs": {"max_episode_steps": 6}}))
    obs = twin.reset(cfg.seed + 1000 * 2)
    for t in range(5):
        assert np.allclose(frag["obs"][t], obs)
        obs = twin.step(frag["actions"][t]).obs
    trunc = (frag["truncated"][4] == 1) & (frag["terminated"][4] == 0)
    assert trunc.any()
    expect = algo.value(model, obs[trunc]).numpy()
    assert np.allclose(frag["final_values"][4][trunc], expect, atol=1e-6)
    assert np.all(frag["final_values"][:4] == 0) and np.all(frag["final_values"][4][~trunc] == 0)
    assert sorted(e.env_index for e in episodes) == list(range(8))
    assert all(e.episode_return == e.length and e.actor == 2 for e in episodes)  # CartPole: +1 per step
    sampler.close()


def test_actor_ranks_draw_different_action_noise():
    # every MPI rank seeds torch with env.seed before building its model; the sampler reseeds per actor
    cfg = EnvConfig(id="hpcrl/Pendulum-v1", num_envs=4, seed=3)
    algo = make_algorithm(PPOConfig(), ModelConfig(hidden_sizes=[8]), AggregationConfig(is_truncation=False))
    info = describe_env(cfg)
    noise = []
    for actor in (0, 1):
        torch.manual_seed(cfg.seed)
        model = algo.make_model(info.observation_space, info.action_space)
        sampler = VectorSampler(cfg, actor_index=actor)
        frag, _ = sampler.sample(algo, model, 6, 0, actor)
        with torch.no_grad():
            mean = model.pi(torch.as_tensor(frag["obs"])).numpy()
        noise.append((frag["actions"] - mean) / np.exp(model.log_std.detach().numpy()))
        sampler.close()
    assert noise[0].shape == (6, 4, 1) and not np.allclose(noise[0], noise[1], atol=1e-3)


@pytest.mark.slow
def test_parallel_backend_agents_are_instances_and_truncated_copies_reset(caches):
    kwargs = {**SHORT_CHANNEL, "cache_dir": str(caches / "channel")}
    cfg = EnvConfig(id="hpcrl/TurbulentChannelWM-v0", num_envs=2, kwargs=kwargs)
    info = describe_env(cfg)
    assert info.num_envs == 2 * 32 and info.observation_space.shape == (2,)
    short = make_backend(cfg)
    longer = make_backend(cfg.model_copy(update={"kwargs": {**kwargs, "max_actions": 4}}))
    assert short.num_envs == 64
    o1, o2 = short.reset(seed=5), longer.reset(seed=5)
    assert np.array_equal(o1, o2)
    rng = np.random.default_rng(0)
    for t in range(3):
        a = rng.uniform(0.9, 1.1, size=(64, 1)).astype(np.float32)
        s1, s2 = short.step(a), longer.step(a)
        assert np.allclose(s1.rewards, s2.rewards)
    assert s1.truncated.all() and not s1.terminated.any() and not s2.truncated.any()
    assert np.allclose(s1.final_obs, s2.obs)  # per agent: the observation its episode ended in
    assert not np.allclose(s1.obs, s1.final_obs)  # both copies were reset (perturbed again)
    short.close(), longer.close()


class _TwoAgents(ParallelEnv):
    """Two agents; ``odd_space`` gives the second another action space, ``early`` ends the first alone."""

    metadata = {"name": "two_agents"}

    def __init__(self, odd_space=False, early=False):
        self.possible_agents = ["a", "b"]
        self.agents = []
        self.early = early
        self._obs = spaces.Box(-1, 1, (1,), np.float32)
        self._acts = {"a": spaces.Box(-1, 1, (1,), np.float32),
                      "b": spaces.Box(-2, 2, (1,), np.float32) if odd_space else spaces.Box(-1, 1, (1,), np.float32)}

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return self._acts[agent]

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        done = {a: self.early and a == "a" for a in self.agents}
        obs = {a: np.ones(1, np.float32) for a in self.agents}
        self.agents = [a for a in self.agents if not done[a]]
        return obs, dict.fromkeys(done, 1.0), done, dict.fromkeys(done, False), {a: {} for a in done}


def test_parallel_backend_refuses_unshared_spaces_and_agents_that_end_alone():
    with pytest.raises(ConfigError, match="share one observation and action space"):
        shared_spaces(_TwoAgents(odd_space=True), "two")
    backend = ParallelBackend([_TwoAgents(early=True), _TwoAgents()], "two")
    assert backend.num_envs == 4
    backend.reset(seed=0)
    with pytest.raises(RuntimeError, match="ended before the others"):
        backend.step(np.zeros((4, 1), np.float32))


def test_rescaled_actions_span_the_action_space():
    low, high = np.array([0.9], np.float32), np.array([1.1], np.float32)
    out = rescale(np.array([[-5.0], [-1.0], [0.0], [1.0], [3.0]]), low, high)
    assert np.allclose(out[:, 0], [0.9, 0.9, 1.0, 1.1, 1.1])


# ---------------------------------------------------------------- shipped configs, both runners

def _cases(tmp: Path, caches: Path) -> dict[str, tuple[list[str], int]]:
    """Per shipped config: the -o overrides of a tiny run, and instances per actor rank."""
    les = [f"env.kwargs.{k}={v}" for k, v in TINY_LES.items()] + [f"env.kwargs.cache_dir={caches / 'les'}"]
    return {
        "cartpole_batched_actors": (["env.num_envs=4", "actors.fragment_length=16", "stop.total_env_steps=600",
                                     "algo.train_batch_size=64", "algo.minibatch_size=32"], 4),
        "lorenz": (["env.num_envs=2", "env.kwargs.episode_steps=20", "env.kwargs.judged_steps=10",
                    "env.normalize_reward=false", "actors.fragment_length=20", "stop.total_env_steps=160",
                    "algo.train_batch_size=40", "algo.minibatch_size=20"], 2),
        "les_closure": (les + ["env.num_envs=2", "actors.fragment_length=4", "stop.total_env_steps=32",
                               "algo.train_batch_size=8", "algo.minibatch_size=8"], 2),
        "les_probes": (les + ["env.num_envs=1", "actors.fragment_length=4", "stop.total_env_steps=256",
                              "algo.train_batch_size=64", "algo.minibatch_size=32"], 16),
        "wallmodel_tiny": ([f"env.kwargs.{k}={v}" for k, v in SHORT_CHANNEL.items() if k != "preset"]
                           + [f"env.kwargs.cache_dir={caches / 'channel'}", "env.num_envs=1",
                              "actors.fragment_length=3", "stop.total_env_steps=192", "algo.train_batch_size=96",
                              "algo.minibatch_size=48"], 32),
        "foam_relaxation": (["env.kwargs.iterations_per_step=5", "env.kwargs.max_iterations=10",
                             f"env.kwargs.work_dir={tmp / 'foam'}", "actors.count=1", "actors.fragment_length=2",
                             "stop.total_env_steps=2", "algo.train_batch_size=2", "algo.minibatch_size=2"], 1),
    }


def _run(name: str, runner: str, tmp: Path, caches: Path) -> tuple[Path, int]:
    """A tiny run of a shipped config; under mpi with one actor rank (3 ranks) except CartPole's two."""
    overrides, instances = _cases(tmp, caches)[name]
    run_dir = tmp / f"{name}-{runner}"
    overrides = [*overrides, f"io.run_dir={run_dir}", "io.flush_seconds=0.5", "launch.timeout_seconds=120"]
    if runner == "mpi" and name != "cartpole_batched_actors":
        overrides.append("actors.count=1")
    path = CONFIGS / f"{name}.yaml"
    if runner == "serial":
        from hpcrl.runtime.plan import make_plan
        from hpcrl.runtime.runners import serial

        cfg = load_config(path, [*overrides, "launch.runner=serial"])
        plan = make_plan(cfg)
        validate(plan)
        assert serial.run(plan, create_run_dir(plan), progress="plain").stop_reason.startswith("stop.")
    else:
        args = [sys.executable, "-m", "hpcrl", "run", str(path), "--runner", "mpi"]
        for o in overrides:
            args += ["-o", o]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(f"hpcrl run {name} --runner mpi hung:\n{out[-3000:]}") from None
        assert proc.returncode == 0, out[-3000:]
    return run_dir, instances


def _check_episodes(run_dir: Path, instances: int) -> dict[str, np.ndarray]:
    """Episodes in run.h5: instance and actor indices in range, each return the sum of its instance's rewards."""
    cfg = load_config(run_dir / "config.yaml")
    ep = read_table(run_dir / "run.h5", "episodes")
    assert len(ep["return"]) >= 1
    assert np.all((ep["env_index"] >= 0) & (ep["env_index"] < instances))
    assert np.all((ep["actor"] >= 0) & (ep["actor"] < cfg.actors.count))
    for a in np.unique(ep["actor"]):
        traj = read_trajectory(run_dir / "traj" / f"actor-{a:05d}.h5")
        assert set(np.unique(traj["env_index"])) == set(range(instances))
        for i in np.unique(ep["env_index"][ep["actor"] == a]):
            rows = traj["env_index"] == i
            r, done = traj["rewards"][rows].astype(np.float64), (traj["terminated"] | traj["truncated"])[rows] == 1
            ends = np.flatnonzero(done)
            sums = [r[s:e + 1].sum() for s, e in zip(np.r_[0, ends[:-1] + 1], ends)]
            lengths = np.diff(np.r_[-1, ends])
            mine = (ep["actor"] == a) & (ep["env_index"] == i)
            assert np.allclose(ep["return"][mine], sums[:mine.sum()], rtol=1e-4, atol=1e-4)
            assert np.array_equal(ep["length"][mine], lengths[:mine.sum()])
    return ep


RUNNERS = ["serial", pytest.param("mpi", marks=pytest.mark.mpi)]
SERIAL = ["serial"]  # a config whose env backend another config runs under mpi (the module docstring)
GYM_RUNNERS = ["serial", pytest.param("mpi", marks=[pytest.mark.mpi, pytest.mark.skipif(
    not FOAM_MISSING, reason="test_foam_relaxation[mpi] runs gymnasium envs under mpi")])]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.slow
def test_cartpole_batched_actors(tmp_path, caches, runner):
    ep = _check_episodes(*_run("cartpole_batched_actors", runner, tmp_path, caches))
    assert np.array_equal(ep["return"], ep["length"]) and np.all(ep["length"] >= 8)  # +1 per step
    assert len(ep["return"]) >= 10


@pytest.mark.parametrize("runner", GYM_RUNNERS)
@pytest.mark.slow
def test_lorenz(tmp_path, caches, runner):
    ep = _check_episodes(*_run("lorenz", runner, tmp_path, caches))
    assert np.all(ep["length"] == 20) and len(ep["return"]) >= 4
    # +-10 per step; a failed episode (mean of the last 10 <= -2) ends with -100 instead
    assert np.all((ep["return"] % 10 == 0) & (np.abs(ep["return"]) <= 19 * 10 + 100))


@pytest.mark.parametrize("runner", SERIAL)
@pytest.mark.slow
def test_les_closure(tmp_path, caches, runner):
    ep = _check_episodes(*_run("les_closure", runner, tmp_path, caches))
    assert np.all(ep["length"] == 4) and np.all(ep["return"] < 0)  # minus a spectrum error per action
    assert len(ep["return"]) >= 4


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.slow
def test_les_probes(tmp_path, caches, runner):
    ep = _check_episodes(*_run("les_probes", runner, tmp_path, caches))
    assert np.all(ep["length"] == 4) and np.all(ep["return"] < 0)
    for a in np.unique(ep["actor"]):  # the 16 agents of a copy end their episodes together
        assert len(set(np.bincount(ep["env_index"][ep["actor"] == a], minlength=16))) == 1


@pytest.mark.parametrize("runner", SERIAL)
@pytest.mark.slow
def test_wallmodel_tiny(tmp_path, caches, runner):
    ep = _check_episodes(*_run("wallmodel_tiny", runner, tmp_path, caches))
    assert np.all(ep["length"] == 3) and len(ep["return"]) >= 32
    assert len(set(np.bincount(ep["env_index"], minlength=32))) == 1
    # rewards telescope: return = initial error - final error (+ bonuses), errors within [0, 20]
    assert np.all(np.abs(ep["return"]) < 20.0)


@pytest.mark.skipif(FOAM_MISSING, reason="OpenFOAM v1912 not installed: apt-get install openfoam openfoam-examples")
@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.slow
def test_foam_relaxation(tmp_path, caches, runner):
    run_dir, instances = _run("foam_relaxation", runner, tmp_path, caches)
    ep = _check_episodes(run_dir, instances)
    # minus the simpleFoam iterations (5 per step, at most 10): no -2000 failure penalty
    assert np.all((ep["return"] < 0) & (ep["return"] >= -10)) and np.all(ep["length"] <= 2)
    assert list((tmp_path / "foam").iterdir()) == []  # each env's own case directory, removed at the end
