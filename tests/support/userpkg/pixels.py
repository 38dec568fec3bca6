"""Sides-v0: a small image task that is not Atari. Each step shows one lit pixel on an 8x8
frame; the agent says which half it is in (0: left, 1: right). +1 per right answer, STEPS
steps, so a return of STEPS is perfect; the pixels are drawn from the reset's seed."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

SIDES = "Sides-v0"


class Sides(gym.Env):
    """One (1, 8, 8) uint8 frame per step with one pixel at 255; Discrete(2) answers."""

    STEPS = 16
    SIZE = 8

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0, 255, (1, self.SIZE, self.SIZE), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self._step = 0
        self._column = 0

    def _frame(self) -> np.ndarray:
        self._column = int(self.np_random.integers(self.SIZE))
        frame = np.zeros((1, self.SIZE, self.SIZE), np.uint8)
        frame[0, int(self.np_random.integers(self.SIZE)), self._column] = 255
        return frame

    def reset(self, *, seed: int | None = None, options: Any = None):
        super().reset(seed=seed)
        self._step = 0
        return self._frame(), {}

    def step(self, action: Any):
        right = int(action) == int(self._column >= self.SIZE // 2)
        self._step += 1
        done = self._step >= self.STEPS
        return self._frame(), float(right), done, False, {}
