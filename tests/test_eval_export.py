"""`hpcrl eval` and `hpcrl export`: a run's checkpoint played, recorded and written as a plain TorchScript policy.

Most runs here are made without training (a config.yaml and a checkpoint of perturbed initial weights,
written as the parameter rank writes them); the slow tests train a tiny CartPole run with `hpcrl run`.
Oracles that are not the code under test: plain Gymnasium episodes driven by the exported file in a
Python that never imports hpcrl, the actors' own VectorSampler normalisation, CartPole's reward of 1 a step.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcrl.algos import make_algorithm
from hpcrl.cli import main as cli_main
from hpcrl.config import load_config
from hpcrl.policy import play as play_module
from hpcrl.policy.export import export_policy, observations
from hpcrl.policy.load import load_policy
from hpcrl.runtime.record.checkpoint import save_checkpoint
from hpcrl.runtime.roles.sampler import VectorSampler, describe_env

# torch 2.13 deprecates torch.jit (see hpcrl/policy/export.py)
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")
CONFIGS = Path(__file__).resolve().parents[1] / "hpcrl" / "configs"


def made_run(run_dir: Path, config: str, overrides=(), normalizer=None, mapping=None, seed=0) -> Path:
    """A run directory as `hpcrl run` leaves it (config.yaml, checkpoints/latest.pt), with perturbed initial weights
    (so greedy actions depend on the observation) instead of trained ones."""
    cfg = load_config(CONFIGS / config, [*overrides, f"io.run_dir={run_dir}"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    env = describe_env(cfg.env)
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    torch.manual_seed(seed)
    model = algo.make_model(env.observation_space, env.action_space)
    with torch.no_grad():
        model.flat.params.add_(0.3 * torch.randn_like(model.flat.params))
    if mapping is not None:
        model.set_mapping(mapping)
    save_checkpoint(run_dir, {"params": model.flat.params.clone(), "normalizers": [normalizer, None],
                              "version": 7, "env_steps": 1234})
    return run_dir


def hopper_stats(seed=0) -> dict:
    """Observation statistics far from (0, 1), so a policy that ignored them would act otherwise."""
    rng = np.random.default_rng(seed)
    return {"obs": {"mean": rng.normal(0, 2, 11), "var": rng.uniform(0.05, 9, 11), "count": 5000.0}, "reward": None}


def cli(args, capsys) -> tuple[int, str, str]:
    rc = cli_main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err.strip()


def printed(out: str, what: str) -> dict[str, float]:
    """The numbers of `hpcrl eval`'s line for ``what`` (return or length)."""
    line = next(line for line in out.splitlines() if line.strip().startswith(what))
    return {k: float(v) for k, v in re.findall(r"(mean|std|min|max) (-?[\d.]+)", line)}


# ---- a real run ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """The default CartPole config trained for a few thousand steps by `hpcrl run` (serial runner)."""
    run_dir = tmp_path_factory.mktemp("cartpole") / "run"
    rc = cli_main(["run", str(CONFIGS / "cartpole.yaml"), "--runner", "serial", "-o", "stop.total_env_steps=1000",
                   "-o", f"io.run_dir={run_dir}"])
    assert rc == 0 and (run_dir / "checkpoints" / "latest.pt").is_file()
    return run_dir


PLAIN_GYM_EPISODES = textwrap.dedent("""
    import json, sys
    import gymnasium as gym, torch
    policy = torch.jit.load(sys.argv[1])
    returns = []
    for seed in json.loads(sys.argv[2]):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            action = policy(torch.as_tensor(obs[None], dtype=torch.float32))[0].item()
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + reward, terminated or truncated
        returns.append(total)
    print(json.dumps({"returns": returns, "hpcrl_imported": any(m.split(".")[0] == "hpcrl" for m in sys.modules)}))
""")


@pytest.mark.slow
def test_eval_of_a_trained_run_matches_its_export_played_in_plain_gymnasium(cartpole_run, capsys, tmp_path):
    rc, out, err = cli(["eval", str(cartpole_run), "--episodes", "3", "--seed", "11"], capsys)
    assert rc == 0, err
    state = torch.load(cartpole_run / "checkpoints" / "latest.pt", weights_only=False)
    assert f"checkpoint version {state['version']}" in out and "3 greedy episodes, seeds 11..13" in out
    ret, length = printed(out, "return"), printed(out, "length")  # CartPole: reward 1 per step
    assert ret == length

    rc, out, err = cli(["export", str(cartpole_run), "-o", str(tmp_path / "cartpole.pt")], capsys)
    assert rc == 0, err
    meta = json.loads((tmp_path / "cartpole.pt.json").read_text())
    assert (meta["env"]["id"], meta["algorithm"], meta["checkpoint"]["version"]) == ("CartPole-v1", "ppo",
                                                                                      state["version"])
    assert meta["action_space"] == {"type": "Discrete", "n": 2, "start": 0}
    res = subprocess.run([sys.executable, "-c", PLAIN_GYM_EPISODES, str(tmp_path / "cartpole.pt"), "[11, 12, 13]"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plain = json.loads(res.stdout)
    assert not plain["hpcrl_imported"]
    returns = np.array(plain["returns"])
    assert (returns.mean(), returns.min(), returns.max()) == pytest.approx((ret["mean"], ret["min"], ret["max"]),
                                                                          abs=0.006)


@pytest.mark.slow
def test_eval_video_writes_one_mp4_per_episode_with_every_frame(cartpole_run, capsys, tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    iio = pytest.importorskip("imageio.v2")
    rc, out, err = cli(["eval", str(cartpole_run), "--episodes", "2", "--seed", "3", "--video", str(tmp_path / "v")],
                       capsys)
    assert rc == 0, err
    videos = sorted((tmp_path / "v").glob("*.mp4"))
    assert [v.name for v in videos] == ["CartPole-v1-seed3-episode-0.mp4", "CartPole-v1-seed4-episode-0.mp4"]
    lengths = play_module.play(load_policy(cartpole_run), 2, seed=3).lengths.tolist()  # the same episodes, unrecorded
    frames = [iio.get_reader(str(v), "ffmpeg").count_frames() for v in videos]
    assert frames == [n + 1 for n in lengths]  # the reset's frame and one per step
    assert "videos  2 mp4" in out
    # what is played is said before the episodes (the seconds of silence were the video's)
    lines = out.splitlines()
    assert lines[0] == f"hpcrl eval: loading the checkpoint of {cartpole_run}"
    assert lines[1].startswith("hpcrl eval: ") and lines[1].endswith(f"recording videos in {tmp_path / 'v'}")
    assert lines[2].startswith("  return  mean")


# ---- export = eval's actions, for every kind of env and model -------------------------------

KINDS = {
    "gym-discrete": ("cartpole.yaml", [], None, None),
    "gym-box-normalized": ("hopper.yaml", [], hopper_stats(), None),
    "gym-box-rescaled": ("hopper.yaml", ["env.rescale_actions=true"], hopper_stats(1), None),
    "batched": ("cartpole_batched_actors.yaml", [], None, None),
    "marl-ppo": ("mpe_spread_ippo.yaml", ["env.num_envs=1"], None, [0, 0, 1, 1, 2, 2]),
    "marl-iql": ("mpe_spread_iql.yaml", ["env.num_envs=1", "env.normalize_obs=false"], None, [1, 0, 1, 0, 1, 0]),
}


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k in ("marl-ppo", "gym-box-normalized")
                                  else k for k in KINDS])  # slow: the first MuJoCo and PettingZoo imports
def test_exported_policy_acts_as_eval_does(kind, tmp_path):
    config, overrides, normalizer, mapping = KINDS[kind]
    if "hopper" in config:
        pytest.importorskip("mujoco")
    if "mpe" in config:
        pytest.importorskip("mpe2")
        normalizer = {"obs": {"mean": np.full(36, 0.3), "var": np.full(36, 0.5), "count": 10.0}, "reward": None} \
            if "ippo" in config else None
    run = made_run(tmp_path / "run", config, overrides, normalizer, mapping)
    policy = load_policy(run)
    path, meta_path = export_policy(policy, tmp_path / "out")
    exported = torch.jit.load(str(path))
    rows = 6 * 5 if policy.agents else 64  # a parallel env: whole env copies
    raw = observations(policy, rows, seed=5).astype(np.float32)
    got = exported(torch.as_tensor(raw)).numpy()
    want = policy.actions(raw)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert len(np.unique(want)) > 1  # the actions depend on the observation: the comparison means something
    meta = json.loads(meta_path.read_text())
    assert meta["input"]["shape"] == ["batch", *policy.env.observation_space.shape]
    if mapping is not None:
        assert meta["agents"]["policy_of"] == mapping


@pytest.mark.parametrize("rescale", [False, True])
def test_export_folds_the_samplers_observation_normalisation(rescale, tmp_path):
    pytest.importorskip("mujoco")
    stats = hopper_stats(2)
    overrides = [f"env.rescale_actions={str(rescale).lower()}"]
    run = made_run(tmp_path / "run", "hopper.yaml", overrides, stats)
    path, meta_path = export_policy(load_policy(run), tmp_path / "policy.pt")
    exported = torch.jit.load(str(path))

    # the actors' own normalisation and action mapping, from the checkpoint's statistics, around the same weights
    cfg = load_config(run / "config.yaml")
    sampler = VectorSampler(cfg.env.model_copy(update={"num_envs": 1}), actor_index=0)
    sampler.load_normalizer_state(stats)
    algo = make_algorithm(cfg.algo, cfg.model, cfg.aggregation)
    model = algo.make_model(sampler.backend.observation_space, sampler.backend.action_space)
    model.flat.load_(torch.load(run / "checkpoints" / "latest.pt", weights_only=False)["params"])
    raw = np.stack([sampler.backend.envs[0].observation_space.sample() for _ in range(32)]) * 3 + 1
    want = sampler.env_action(algo.greedy(model, sampler.policy_obs(raw)).numpy())
    got = exported(torch.as_tensor(raw, dtype=torch.float32)).numpy()
    assert np.array_equal(got, want)
    unnormalised = sampler.env_action(algo.greedy(model, raw.astype(np.float32)).numpy())
    assert not np.allclose(got, unnormalised, atol=1e-3)  # the statistics changed the actions
    assert np.all(got >= sampler.low) and np.all(got <= sampler.high)
    norm = json.loads(meta_path.read_text())["observation_normalization"]
    assert np.allclose(norm["mean"], stats["obs"]["mean"]) and np.allclose(norm["var"], stats["obs"]["var"])
    assert norm["clip"] == cfg.env.clip and norm["folded"]
    sampler.close()


def test_onnx_export_gives_the_same_actions(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("mujoco")
    from onnx.reference import ReferenceEvaluator

    run = made_run(tmp_path / "run", "hopper.yaml", [], hopper_stats(3))
    policy = load_policy(run)
    path, _ = export_policy(policy, tmp_path / "policy.onnx", fmt="onnx")
    raw = observations(policy, 17, seed=9).astype(np.float32)
    got = ReferenceEvaluator(str(path)).run(None, {"obs": raw})[0]
    assert np.allclose(got, policy.actions(raw), atol=1e-5)


def test_onnx_without_the_onnx_package_is_one_line(tmp_path, capsys, monkeypatch):
    run = made_run(tmp_path / "run", "cartpole.yaml")
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    rc, out, err = cli(["export", str(run), "--format", "onnx"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "pip install 'hpcrl[export]'" in err


# ---- eval of MARL and batched runs --------------------------------------------------------

@pytest.mark.slow
def test_marl_eval_reports_every_policy_group(tmp_path, capsys):
    pytest.importorskip("mpe2")
    run = made_run(tmp_path / "run", "mpe_spread_ippo.yaml", ["env.normalize_obs=false"], mapping=[0, 0, 1, 1, 2, 2])
    rc, out, err = cli(["eval", str(run), "--episodes", "2"], capsys)
    assert rc == 0, err
    groups = [line for line in out.splitlines() if line.strip().startswith("policy ")]
    assert [g.split(":")[0].strip() for g in groups] == ["policy 0 (agent_0, agent_1)", "policy 1 (agent_2, agent_3)",
                                                         "policy 2 (agent_4, agent_5)"]
    means = [float(re.search(r"mean (-?[\d.]+)", g).group(1)) for g in groups]
    assert np.mean(means) == pytest.approx(printed(out, "return per agent")["mean"], abs=0.01)  # equal-sized groups
    assert printed(out, "length")["mean"] == 25  # MPE's max_cycles


def test_batched_env_eval_and_video_refused_in_one_line(tmp_path, capsys):
    run = made_run(tmp_path / "run", "cartpole_batched_actors.yaml")
    rc, out, err = cli(["eval", str(run), "--episodes", "4"], capsys)
    assert rc == 0, err
    ret, length = printed(out, "return"), printed(out, "length")  # CartPole: reward 1 per step
    assert ret == length
    rc, out, err = cli(["eval", str(run), "--video", str(tmp_path / "v")], capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert "batched tensor env" in err and "Gymnasium envs" in err and not (tmp_path / "v").exists()


def test_sampled_actions_differ_from_greedy_and_follow_the_seed(tmp_path):
    run = made_run(tmp_path / "run", "cartpole.yaml")
    policy = load_policy(run)
    greedy = play_module.play(policy, 4, seed=0)
    sampled = [play_module.play(policy, 4, sampled=True, seed=0) for _ in range(2)]
    assert np.array_equal(sampled[0].returns, sampled[1].returns)
    assert not np.array_equal(sampled[0].returns, greedy.returns)


# ---- mistakes and missing renderers: one line, exit code 2 ----------------------------------

def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    run = made_run(tmp_path / "run", "cartpole.yaml")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.yaml").write_text((run / "config.yaml").read_text())
    (tmp_path / "fused").mkdir()
    (tmp_path / "fused" / "config.yaml").write_text(load_config(CONFIGS / "cartpole_ha2c.yaml").to_yaml())
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    torch.save({"format": 99}, tmp_path / "other.pt")
    cases = [
        (["eval", str(tmp_path / "nope")], "no such run directory"),
        (["export", str(tmp_path)], "not a run directory (no config.yaml"),
        (["eval", str(tmp_path / "bare")], "no checkpoint in"),
        (["export", str(tmp_path / "bare")], "no checkpoint in"),
        (["eval", str(tmp_path / "fused")], "algo ha2c in the fused single-process loop writes none"),
        (["eval", str(run), "--checkpoint", str(tmp_path / "missing.pt")], "--checkpoint"),
        (["eval", str(run), "--checkpoint", str(tmp_path / "junk.pt")], "not a readable checkpoint"),
        (["export", str(run), "--checkpoint", str(tmp_path / "other.pt")], "not an hpcrl checkpoint"),
        (["eval", str(run), "--episodes", "0"], "--episodes 0"),
    ]
    for args, message in cases:
        rc, out, err = cli(args, capsys)
        assert (rc, len(err.splitlines())) == (2, 1), (args, err)
        assert message in err and err.startswith(f"hpcrl {args[0]}: error:"), (args, err)


def test_checkpoint_of_another_config_and_missing_statistics_are_one_line(tmp_path, capsys):
    run = made_run(tmp_path / "run", "cartpole.yaml", ["model.hidden_sizes=[8]"])
    other = made_run(tmp_path / "other", "cartpole.yaml")
    rc, _, err = cli(["eval", str(run), "--checkpoint", str(other / "checkpoints" / "latest.pt")], capsys)
    assert rc == 2 and "do not fit the model" in err and len(err.splitlines()) == 1
    norm = made_run(tmp_path / "norm", "cartpole.yaml", ["env.normalize_obs=true"])  # no actor statistics saved
    rc, _, err = cli(["export", str(norm)], capsys)
    assert rc == 2 and "no observation statistics" in err and len(err.splitlines()) == 1


def test_no_offscreen_renderer_names_mujoco_gl_and_the_choices(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mujoco")
    run = made_run(tmp_path / "run", "hopper.yaml", [], hopper_stats())
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(play_module, "gl_context_error", lambda gl: f"cannot open lib{gl}")
    rc, out, err = cli(["eval", str(run), "--video", str(tmp_path / "v")], capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert all(word in err for word in ("MUJOCO_GL", "egl", "osmesa", "cannot open libegl"))
    assert "MUJOCO_GL" not in os.environ


@pytest.mark.slow
def test_hopper_video_renders_offscreen(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mujoco")
    pytest.importorskip("imageio_ffmpeg")
    iio = pytest.importorskip("imageio.v2")
    run = made_run(tmp_path / "run", "hopper.yaml", ["env.kwargs={max_episode_steps: 4}"], hopper_stats())
    if not os.environ.get("MUJOCO_GL"):
        if all(play_module.gl_context_error(gl) for gl in play_module.GL_CHOICES):
            pytest.skip("neither EGL nor OSMesa makes a GL context here")
        monkeypatch.setenv("MUJOCO_GL", "unset")  # so that the value the command chooses is removed after the test
        monkeypatch.delenv("MUJOCO_GL")
    rc, out, err = cli(["eval", str(run), "--episodes", "1", "--video", str(tmp_path / "v")], capsys)
    assert rc == 0, err
    video = tmp_path / "v" / "Hopper-v5-seed1000000-episode-0.mp4"
    steps = int(printed(out, "length")["max"])
    assert iio.get_reader(str(video), "ffmpeg").count_frames() == steps + 1


@pytest.mark.parametrize("steps", [10, 11, 12, 13])  # 11-14 frames: moviepy's clip at 50 fps lost the last one
def test_a_short_recorded_episode_keeps_every_frame(tmp_path, steps, monkeypatch):
    iio = pytest.importorskip("imageio.v2")
    pytest.importorskip("imageio_ffmpeg")
    import gymnasium

    from hpcrl.policy.video import FirstEpisodeVideo

    monkeypatch.setenv("SDL_VIDEODRIVER", os.environ.get("SDL_VIDEODRIVER", "dummy"))  # pygame without a display
    env = FirstEpisodeVideo(gymnasium.make("CartPole-v1", render_mode="rgb_array", max_episode_steps=steps),
                            tmp_path / "e.mp4")
    env.reset(seed=0)
    done, taken = False, 0
    while not done:
        _, _, terminated, truncated, _ = env.step(taken % 2)  # alternate pushes: truncated at `steps`
        taken += 1
        done = terminated or truncated
    env.reset(seed=1)  # a second episode is not recorded
    env.close()
    assert iio.get_reader(str(tmp_path / "e.mp4"), "ffmpeg").count_frames() == taken + 1
