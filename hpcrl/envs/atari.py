"""Atari 2600 games with the standard preprocessing, as Stellaris' three Atari workloads use them.

The Arcade Learning Environment comes from the ``ale-py`` package (it ships the ROMs; the
resize needs ``opencv``); Gymnasium's wrappers do the rest: no-op starts (up to ``noop_max``
random no-ops after a reset), ``frame_skip`` repeats of each action with the maximum of the last
two frames, grey 84x84 frames (AtariPreprocessing), then the last ``frame_stack`` frames stacked
(FrameStackObservation). Observations are uint8 [frame_stack, 84, 84] and stay uint8 in
fragments and trajectory files; the network scales them (hpcrl.models.ScaleUint8).

The emulator runs at every frame (``frameskip=1``) so that the wrapper's max-pooling sees the
skipped frames; sticky actions are off by default (``repeat_action_probability=0``, the
DeepMind/RLlib setting of the Stellaris era; 0.25 gives Machado et al.'s v5 protocol).
Episode returns are the game score; a lost life does not end the episode unless asked.
"""
from __future__ import annotations

from typing import Any

from hpcrl.errors import ConfigError


def make_atari(game: str, frame_skip: int = 4, screen_size: int = 84, frame_stack: int = 4, noop_max: int = 30,
               repeat_action_probability: float = 0.0, terminal_on_life_loss: bool = False,
               full_action_space: bool = False, **kwargs: Any):
    """``ALE/{game}-v5`` with the preprocessing above; extra ``kwargs`` go to ``gymnasium.make``."""
    try:
        import ale_py
        import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError as exc:
        raise ConfigError(f"env.id: Atari games need the ale-py and opencv packages ({exc.name} is missing): "
                          "pip install ale-py opencv-python-headless") from None
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env_id = f"ALE/{game}-v5"
    if env_id not in gym.registry:
        raise ConfigError(f"env.kwargs.game: unknown Atari game {game!r} (no {env_id} in ale-py)")
    env = gym.make(env_id, frameskip=1, repeat_action_probability=repeat_action_probability,
                   full_action_space=full_action_space, **kwargs)
    env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
                             terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True, scale_obs=False)
    return FrameStackObservation(env, frame_stack)


def space_invaders(**kwargs: Any):
    return make_atari("SpaceInvaders", **kwargs)


def qbert(**kwargs: Any):
    return make_atari("Qbert", **kwargs)


def gravitar(**kwargs: Any):
    return make_atari("Gravitar", **kwargs)
