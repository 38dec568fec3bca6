"""Behaviour characterisations (BCs): what novelty search compares episodes by.

One rule on both sides of the wire: the master learns a run's BC size from the env before the
first task (`behaviour_size`), and workers take each episode's BC by the same rule at its end
(`behaviour_of`):

- Atari: the console's RAM (128 bytes as values 0-255), the choice of Uber's follow-up code;
- an env whose class declares `behaviour_size` puts the BC in `info["bc"]` at every step (e.g.
  neuro/DeceptiveMaze-v0: the robot's (x, y)); the last step's counts;
- any other env: its final observation, flattened.

Where the rule bounds a BC's values (`behaviour_range`: Atari RAM is 0-255), the master refuses
a reported BC outside them; elsewhere only finiteness is checked, and the novelty measure
(master.algorithms.novelty) keeps one extreme BC from masking the others.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

ATARI_RAM_SIZE = 128
ATARI_RAM_RANGE = (0.0, 255.0)
"""A RAM byte's values: every Atari BC lies in it, and the master refuses one that does not."""
MAX_BEHAVIOUR_SIZE = 4096
"""Largest BC a run may use: a master's task naming more is refused by workers, and a BC this
size keeps an archive of 10,000 within 160 MiB."""


def behaviour_size(env: gym.Env, atari: bool) -> int:
    """The BC size episodes of `env` have; ValueError naming it when over MAX_BEHAVIOUR_SIZE."""
    if atari:
        size = ATARI_RAM_SIZE
    else:
        declared = getattr(env.unwrapped, "behaviour_size", None)
        shape = getattr(env.observation_space, "shape", None)
        if declared is None and not shape:
            raise ValueError(
                f"env {env.spec.id if env.spec else env!r} has no behaviour characterisation: "
                "its observations are not an array and it declares no behaviour_size"
            )
        size = int(declared) if declared is not None else math.prod(shape)
    if not 1 <= size <= MAX_BEHAVIOUR_SIZE:
        raise ValueError(f"behaviour size must be in [1, {MAX_BEHAVIOUR_SIZE}], got {size}")
    return size


def behaviour_range(atari: bool) -> tuple[float, float] | None:
    """(low, high) every value of such an env's BCs lies in; None where no bound is known."""
    return ATARI_RAM_RANGE if atari else None


def behaviour_of(env: gym.Env, atari: bool, observation: Any, info: dict[str, Any]) -> np.ndarray:
    """The BC of an episode that just ended in `env` (before its next reset), float32, flat."""
    if atari:
        return env.unwrapped.ale.getRAM().astype(np.float32)
    if getattr(env.unwrapped, "behaviour_size", None) is not None:
        if "bc" not in info:
            raise ValueError("the env declares a behaviour_size but its info has no 'bc'")
        return np.asarray(info["bc"], dtype=np.float32).ravel()
    return np.asarray(observation, dtype=np.float32).ravel()
