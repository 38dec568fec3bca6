"""Records a replay as video: the env's full-colour render frames (the `video` extra)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from neuro.envs.make import EnvHandle, make_env
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.play.rollout import play

VIDEO_EXTRA_HINT = "install the `video` extra: pip install 'neuro[video]'"
DEFAULT_FPS = 30.0


class VideoUnavailable(ImportError):
    """A package that recording needs is missing; the message names the extra to install."""


@dataclass
class Video:
    """Where to record a replay, and how many of its first episodes; filled in as it records."""

    path: str | os.PathLike
    episodes: int = 1
    fps: float | None = None
    """None: the env's metadata render_fps, or 30 where it has none."""
    frames: list[int] = field(default_factory=list)
    """Frames written per recorded episode: one after the reset and one after each step."""


def require_video_packages() -> None:
    """Raises VideoUnavailable unless imageio and its ffmpeg binary can be imported."""
    try:
        import imageio  # noqa: F401
        import imageio_ffmpeg  # noqa: F401
    except ImportError as error:
        raise VideoUnavailable(
            f"recording video needs imageio and imageio-ffmpeg ({error}); {VIDEO_EXTRA_HINT}"
        ) from None


class FrameRecorder(gym.Wrapper):
    """Passes every call through unchanged; sends the rendered frame after each reset and
    each step of the first `episodes` episodes to `write`.

    Rendering only reads the env's state, so a recorded episode plays exactly as an
    unrecorded one: an episode of n steps gives n + 1 frames.
    """

    def __init__(self, env: gym.Env, write: Callable[[np.ndarray], Any], episodes: int) -> None:
        super().__init__(env)
        self._write = write
        self._episodes = episodes
        self._episode = -1
        self.frames: list[int] = []
        """Frames written per recorded episode."""

    @property
    def recording(self) -> bool:
        return 0 <= self._episode < self._episodes

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        result = self.env.reset(**kwargs)
        self._episode += 1
        if self.recording:
            self.frames.append(0)
            self._capture()
        return result

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        result = self.env.step(action)
        if self.recording:
            self._capture()
        return result

    def _capture(self) -> None:
        try:
            frame = self.env.render()
        except gym.error.DependencyNotInstalled as error:  # e.g. pygame for classic control
            raise VideoUnavailable(f"cannot render the env: {error}; {VIDEO_EXTRA_HINT}") from None
        if frame is None:
            raise ValueError(f"env {self.env.spec and self.env.spec.id!r} rendered no frame")
        self._write(np.asarray(frame, dtype=np.uint8))
        self.frames[-1] += 1


def play_recorded(spec: EvaluationSpec, video: Video, evaluator: Evaluator) -> list[float]:
    """Plays spec's episodes and records the first `video.episodes` of them to `video.path`.

    The protocol is play_spec's (and the workers'): the first reset is seeded with
    spec.env_seed and later episodes continue the env's RNG, so the returns are the same as
    without recording. The file appears only once complete.
    """
    require_video_packages()
    path = Path(video.path)
    if path.suffix.lower() != ".mp4":
        raise ValueError(f"the video must be an .mp4 file, got {str(path)!r}")
    if not 1 <= video.episodes <= spec.episodes:
        raise ValueError(
            f"video episodes must be between 1 and the {spec.episodes} episodes played, "
            f"got {video.episodes}"
        )
    import imageio.v2 as imageio

    handle = make_env(spec.env_id, spec.atari_dynamics, render_mode="rgb_array")
    fps = float(video.fps or handle.env.metadata.get("render_fps") or DEFAULT_FPS)
    path.parent.mkdir(parents=True, exist_ok=True)
    # ffmpeg picks the container from the suffix, so the partial file keeps it.
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    # macro_block_size 2: keep the env's frame size (yuv420p only needs even sides).
    writer = imageio.get_writer(partial, format="FFMPEG", fps=fps, macro_block_size=2)
    recorder = FrameRecorder(handle.env, writer.append_data, video.episodes)
    try:
        # The recorder is the env the shared loop steps: recording needs no hook in the loop.
        recorded = EnvHandle(recorder, handle.atari, handle.dynamics, handle.frames_used)
        # The run's inference dtype and normaliser: the policy whose episodes scored.
        policy = evaluator.build_policy(spec, recorded)
        evaluator.load(spec, policy)
        episodes = play(policy, recorded, spec.episodes, spec.max_episode_steps, spec.env_seed)
        writer.close()
        os.replace(partial, path)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    finally:
        recorder.close()
    video.fps = fps
    video.frames = recorder.frames
    return [episode.total_reward for episode in episodes]
