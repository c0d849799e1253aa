"""Episodes of a loaded policy (``hpcrl eval``), optionally recorded as mp4 files.

:func:`play` runs ``episodes`` env copies in lock-step through the env backends the actors use
(:mod:`hpcrl.runtime.roles.env_backends`: Gymnasium envs, one batched tensor env, PettingZoo copies
whose agents are the instances), one episode each, as the evaluation episodes of a run do; copy i
is seeded with ``seed + i``. A parallel env gives one return per agent and copy.

Videos (``video_dir``): Gymnasium envs only (batched tensor envs do not render; PettingZoo envs are
not Gymnasium envs), each copy made with ``render_mode="rgb_array"`` and wrapped in
:class:`hpcrl.policy.video.FirstEpisodeVideo` (imageio's ffmpeg writer: every frame). MuJoCo renders off-screen through
``MUJOCO_GL``: :func:`prepare_rendering` sets it, when unset, to the first of egl and osmesa that
can make a GL context here. Each is tried in a child process: Gymnasium reads MUJOCO_GL when it makes
the first renderer, and the GL library that MuJoCo then imports fixes its platform for the process.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpcrl.errors import ConfigError

GL_CHOICES = ("egl", "osmesa")
"""MUJOCO_GL values tried, in order, for off-screen rendering (glfw needs a display)."""
GL_HELP = "MUJOCO_GL=egl (GPU or Mesa EGL: libEGL), osmesa (CPU: libOSMesa) or glfw (a display)"


@dataclass
class Episodes:
    """One finished episode per instance (a parallel env: per agent of each copy)."""

    returns: np.ndarray
    lengths: np.ndarray
    videos: list[Path]


def play(policy, episodes: int, sampled: bool = False, seed: int = 0, video_dir: str | Path | None = None) -> Episodes:
    """``episodes`` episodes of ``policy`` (a :class:`hpcrl.policy.load.RunPolicy`), greedy or sampled."""
    import torch

    from hpcrl.runtime.roles.env_backends import make_backend
    from hpcrl.runtime.roles.evaluation import MAX_EPISODE_STEPS

    env_cfg = policy.cfg.env
    if video_dir is None:
        backend, videos = make_backend(env_cfg, count=episodes), []
    else:
        backend, videos = _video_backend(policy, episodes, video_dir, seed)
    torch.manual_seed(seed)  # sampled actions
    try:
        raw = _reset(backend, seed, env_cfg.id, video_dir)
        N = backend.num_envs
        returns, lengths = np.zeros(N), np.zeros(N, dtype=np.int64)
        running = np.ones(N, dtype=bool)
        for _ in range(MAX_EPISODE_STEPS):
            step = backend.step(policy.actions(raw, sampled))
            returns[running] += step.rewards[running]
            lengths[running] += 1
            running &= ~(step.terminated | step.truncated)  # copies that ended step on, uncounted
            if not running.any():
                break
            raw = step.obs
        else:
            raise ConfigError(f"an episode of {env_cfg.id} ran past {MAX_EPISODE_STEPS} steps; the env needs a time "
                              "limit (env.kwargs.max_episode_steps)")
    finally:
        backend.close()  # a recording still open is written
    return Episodes(returns, lengths, [v for v in videos if v.is_file()])


def _reset(backend, seed: int, env_id: str, video_dir) -> np.ndarray:
    """The first observations; with video, a renderer that fails (MuJoCo's GL) is one line."""
    if video_dir is None:
        return backend.reset(seed)
    try:
        return backend.reset(seed)
    except Exception as exc:  # noqa: BLE001 - the first frame is rendered here: GL and renderer failures
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        gl = os.environ.get("MUJOCO_GL")
        raise ConfigError(f"--video: rendering {env_id} failed ({type(exc).__name__}: {text}) with "
                          f"MUJOCO_GL={gl or '(unset)'}; set {GL_HELP}") from None


def _video_backend(policy, episodes: int, video_dir: str | Path, seed: int):
    """(GymBackend of ``episodes`` rgb_array copies, each recording its first episode into ``video_dir``, the
    mp4 files they write)."""
    import gymnasium

    from hpcrl.envs import make
    from hpcrl.policy.video import FirstEpisodeVideo
    from hpcrl.runtime.roles.env_backends import GymBackend

    env_id, kwargs = policy.cfg.env.id, dict(policy.cfg.env.kwargs)
    if policy.kind != "gym":
        what = "a batched tensor env, which does not render" if policy.kind == "batched" else \
            "a PettingZoo env, not a Gymnasium env"
        raise ConfigError(f"--video: {env_id} is {what}; videos are recorded for Gymnasium envs (e.g. CartPole-v1, "
                          f"Hopper-v5); run without --video")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame-drawn envs (classic control) need no display
    folder = Path(video_dir)
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", env_id)
    envs, videos = [], []
    for i in range(episodes):
        try:
            env = make(env_id, **{**kwargs, "render_mode": "rgb_array"})
        except TypeError as exc:
            raise ConfigError(f"--video: {env_id} does not take render_mode='rgb_array' ({exc})") from None
        videos.append(folder / f"{name}-seed{seed + i}-episode-0.mp4")
        try:
            envs.append(FirstEpisodeVideo(env, videos[-1]))
        except gymnasium.error.DependencyNotInstalled as exc:
            env.close()
            raise ConfigError(f"--video needs imageio with imageio-ffmpeg ({exc}); pip install 'hpcrl[video]'") from None
        except ValueError as exc:  # a render mode that gives no image
            env.close()
            raise ConfigError(f"--video: {env_id}: {exc}") from None
    return GymBackend(envs), videos


def is_mujoco(env_id: str) -> bool:
    """True for a Gymnasium id whose entry point is a MuJoCo env (read from the registry: nothing imported)."""
    try:
        import gymnasium

        entry = gymnasium.spec(env_id).entry_point
    except Exception:  # noqa: BLE001 - not a Gymnasium id (hpcrl's own, or unknown): not MuJoCo
        return False
    return "mujoco" in (entry if isinstance(entry, str) else getattr(entry, "__module__", "")).lower()


def prepare_rendering(env_id: str) -> str | None:
    """Before any env of ``env_id`` exists in this process: for a MuJoCo env with MUJOCO_GL unset, set it to the
    first of :data:`GL_CHOICES` that works here; the value in force (None: not a MuJoCo env).
    ConfigError (one line) when none works."""
    if not is_mujoco(env_id):
        return None
    if os.environ.get("MUJOCO_GL"):
        return os.environ["MUJOCO_GL"]
    tried = []
    for gl in GL_CHOICES:
        why = gl_context_error(gl)
        if why is None:
            os.environ["MUJOCO_GL"] = gl
            return gl
        tried.append(f"{gl}: {why}")
    raise ConfigError(f"--video: MuJoCo cannot render off-screen here ({'; '.join(tried)}); install EGL or OSMesa "
                      f"(e.g. apt-get install libegl1 or libosmesa6) or set {GL_HELP}")


def gl_context_error(gl: str, timeout: float = 60.0) -> str | None:
    """None when MuJoCo makes a GL context with MUJOCO_GL=gl (in a child process), else the last error line."""
    code = "import mujoco; c = mujoco.GLContext(16, 16); c.make_current(); c.free()"
    env = {**os.environ, "MUJOCO_GL": gl}
    try:
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no context after {timeout:.0f} s"
    if res.returncode == 0:
        return None
    lines = [line for line in res.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {res.returncode}"
