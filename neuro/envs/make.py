"""Env factory: gymnasium ids as users type them (neuro.envs.ids), Atari under the paper's
protocol by default."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym

from neuro.envs import ENTRY_POINT_PREFIX
from neuro.envs.ids import env_spec
from neuro.policy_spec import ModuleUnavailable

PAPER = "paper"
REGISTERED = "registered"
ATARI_DYNAMICS = (PAPER, REGISTERED)
PAPER_FRAME_SKIP = 4
PAPER_NOOP_MAX = 30
SCREEN_SIZE = 84
FRAME_STACK = 4


@dataclass
class EnvHandle:
    """A built env and how to count the emulator frames an episode consumed."""

    env: gym.Env
    atari: bool
    dynamics: str | None
    frames_used: Callable[[int], int]
    """Agent steps of the finished episode -> emulator frames."""


class FireOnReset(gym.Wrapper):
    """Presses FIRE after reset in games that wait for it (the paper's protocol)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        self._fire = meanings.index("FIRE") if "FIRE" in meanings else None

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        if self._fire is not None:
            observation, _, terminated, truncated, info = self.env.step(self._fire)
            if terminated or truncated:
                observation, info = self.env.reset()
        return observation, info


def register_atari() -> None:
    """Makes ale-py's ids (Frostbite-v4, ALE/Frostbite-v5, ...) known to gymnasium."""
    import ale_py

    gym.register_envs(ale_py)


@dataclass(frozen=True)
class EnvKind:
    """What the master knows of an env id without building it."""

    env_id: str
    atari: bool
    reward_threshold: float | None
    deterministic: bool = False
    """The return depends on the policy alone (neuro's toy tasks): one elite episode is enough."""


def inspect_env_id(env_id: str) -> EnvKind:
    """Resolves an id through gymnasium's registry (with ale-py's and neuro's ids registered,
    a `module:Env-id`'s module imported); ValueError naming the id (ModuleUnavailable naming
    the module) where it cannot be."""
    register_atari()
    spec = env_spec(env_id)
    atari = str(spec.entry_point).startswith("ale_py")
    deterministic = str(spec.entry_point).startswith(ENTRY_POINT_PREFIX)
    return EnvKind(env_id, atari, spec.reward_threshold, deterministic)


def is_atari(env_id: str) -> bool:
    register_atari()
    return str(env_spec(env_id).entry_point).startswith("ale_py")


def make_env(env_id: str, dynamics: str = PAPER, render_mode: str | None = None) -> EnvHandle:
    """Builds an env; raises ValueError naming the id when it cannot.

    `render_mode="rgb_array"` lets a replay record video; it leaves the dynamics unchanged.
    """
    register_atari()
    try:
        spec = env_spec(env_id)  # neuro's toy tasks, a module:Env-id's module, entry points
    except ModuleUnavailable:
        raise
    except ValueError as error:
        raise ValueError(f"cannot build env {env_id!r}: {error}") from None
    if not str(spec.entry_point).startswith("ale_py"):
        # Only when asked: a user's env need not take render_mode.
        recording = {} if render_mode is None else {"render_mode": render_mode}
        env = gym.make(spec, **recording)
        return EnvHandle(env, atari=False, dynamics=None, frames_used=lambda s: s)
    if dynamics == PAPER:
        return EnvHandle(_paper_atari(spec.kwargs["game"], render_mode), True, PAPER, paper_frames)
    if dynamics == REGISTERED:
        env = _registered_atari(env_id, render_mode)
        return EnvHandle(env, True, REGISTERED, lambda _: _episode_frame_number(env))
    raise ValueError(f"atari dynamics must be {PAPER!r} or {REGISTERED!r}, got {dynamics!r}")


def atari_game(env_id: str) -> str:
    """The ROM name behind an Atari id (Frostbite-v4 -> "frostbite")."""
    register_atari()
    return env_spec(env_id).kwargs["game"]


def paper_frames(steps: int) -> int:
    """Agent steps -> emulator frames under the paper's protocol (skip 4)."""
    return steps * PAPER_FRAME_SKIP


def _paper_atari(
    game: str, render_mode: str | None = None, noop_max: int = PAPER_NOOP_MAX
) -> gym.Env:
    """No sticky actions, skip 4 with max-pool, 1-30 no-ops, FIRE, 84x84 gray, stack of 4.

    The game is rebuilt from its name, so Frostbite-v4 (random 2-4 frame skip),
    FrostbiteNoFrameskip-v4 and ALE/Frostbite-v5 (sticky actions) all train the same way.
    Rewards are the raw game score; losing a life does not end the episode.
    """
    from ale_py.env import AtariEnv

    base = AtariEnv(
        game=game,
        obs_type="rgb",
        frameskip=1,
        repeat_action_probability=0.0,
        full_action_space=False,
        render_mode=render_mode,
    )
    # Gymnasium's wrappers check the spec for a frameskip; give the raw env one.
    base.spec = gym.envs.registration.EnvSpec(
        f"{game}-paper", entry_point="ale_py.env:AtariEnv", kwargs={"frameskip": 1}
    )
    env = gym.wrappers.AtariPreprocessing(
        base,
        noop_max=noop_max,  # 0 only in tests that compare engines frame for frame
        frame_skip=PAPER_FRAME_SKIP,
        screen_size=SCREEN_SIZE,
        terminal_on_life_loss=False,
        grayscale_obs=True,
        scale_obs=False,
    )
    return gym.wrappers.FrameStackObservation(FireOnReset(env), FRAME_STACK)


def _registered_atari(env_id: str, render_mode: str | None = None) -> gym.Env:
    """The registered env's own dynamics, with only the observation preprocessing."""
    env = gym.make(env_id, obs_type="grayscale", render_mode=render_mode)
    env = gym.wrappers.ResizeObservation(env, (SCREEN_SIZE, SCREEN_SIZE))
    return gym.wrappers.FrameStackObservation(env, FRAME_STACK)


def _episode_frame_number(env: gym.Env) -> int:
    return int(env.unwrapped.ale.getEpisodeFrameNumber())
