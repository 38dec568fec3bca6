"""One episode of a policy in an env: pure apart from the env itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuro.envs.make import EnvHandle


@dataclass(frozen=True)
class EpisodeResult:
    total_reward: float
    steps: int
    frames: int


def run_episode(
    act: Callable[[Any], Any],
    handle: EnvHandle,
    max_steps: int = 0,
    seed: int | None = None,
) -> EpisodeResult:
    """Plays until the env ends the episode or `max_steps` agent steps (0: no cap) pass.

    `seed` seeds the reset; None continues the env's RNG, so a sequence of episodes started
    from one seeded reset is reproducible.
    """
    observation, _ = handle.env.reset(seed=seed)
    total = 0.0
    steps = 0
    while True:
        observation, reward, terminated, truncated, _ = handle.env.step(act(observation))
        total += float(reward)
        steps += 1
        if terminated or truncated or steps == max_steps:
            return EpisodeResult(total, steps, handle.frames_used(steps))
