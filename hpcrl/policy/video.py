"""An env wrapper that records its first episode as an mp4: the reset's frame and one frame per step.

Gymnasium's RecordVideo writes through moviepy, whose clip length is frames / fps rounded down: at
CartPole's 50 fps an episode of 11 to 14 frames loses its last one. Here the frames go to imageio's
ffmpeg writer one by one, so the file holds every frame (``tests/test_eval_export.py`` counts them).
"""
from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np


class FirstEpisodeVideo(gymnasium.Wrapper):
    """Records the first episode of ``env`` (made with ``render_mode="rgb_array"``) into ``path``."""

    def __init__(self, env: gymnasium.Env, path: str | Path):
        super().__init__(env)
        try:
            import imageio.v2 as imageio
        except ImportError as exc:  # imageio-ffmpeg comes with it in hpcrl[video]
            raise gymnasium.error.DependencyNotInstalled(str(exc)) from None
        if env.render_mode != "rgb_array":
            raise ValueError(f"render_mode is {env.render_mode!r}; an mp4 needs 'rgb_array'")
        self.path = Path(path)
        self._imageio = imageio
        self._fps = int(env.metadata.get("render_fps", 30) or 30)
        self._frames: list[np.ndarray] | None = None  # the recording; None before the first reset and after it ends
        self._recorded = False

    def reset(self, **kwargs):
        out = super().reset(**kwargs)
        if self._frames is None and not self._recorded:
            self._frames = [self._frame()]
        return out

    def step(self, action):
        out = super().step(action)
        if self._frames is not None:
            self._frames.append(self._frame())
            if out[2] or out[3]:  # terminated or truncated: the episode is whole
                self._write()
        return out

    def close(self):
        self._write()  # an episode cut short by the caller is kept as far as it went
        super().close()

    def _frame(self) -> np.ndarray:
        frame = self.env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3:
            raise ValueError(f"render() gave {type(frame).__name__}, not an RGB image")
        return frame

    def _write(self) -> None:
        frames, self._frames = self._frames, None
        if not frames:
            return
        self._recorded = True
        # macro_block_size=1: keep the frame's own size (ffmpeg would pad it to a multiple of 16)
        with self._imageio.get_writer(self.path, fps=self._fps, codec="libx264", macro_block_size=1) as writer:
            for frame in frames:
                writer.append_data(frame)
