"""The action head: network outputs to the env's actions, the same for every engine."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def actions_from_outputs(out: np.ndarray, space: Any) -> np.ndarray:
    """argmax + start for Discrete (lowest index on ties), tanh squashed to [low, high] for
    Box; one action per row of the (batch, n_out) network outputs."""
    if isinstance(space, gym.spaces.Discrete):
        # np.argmax picks the lowest index on ties.
        actions = np.argmax(out, axis=1).astype(np.int64, copy=False)
        return actions + int(space.start) if space.start else actions
    low, high = space.low.astype(np.float32).ravel(), space.high.astype(np.float32).ravel()
    squashed = (np.tanh(out) + 1.0) * 0.5
    actions = low + squashed * (high - low)
    return actions.reshape(len(out), *space.shape).astype(space.dtype)
