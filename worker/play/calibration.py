"""The frames an int8-static policy is calibrated on: the game itself, played by seeded random
actions. Here rather than beside the quantiser (worker/inference/int8_static.py), which takes
frames as data: playing a game is play's business."""

from __future__ import annotations

import functools

import numpy as np

from neuro.inference import INT8_STATIC
from worker.play.envs import build_env

CALIBRATION_SEED = 0
CALIBRATION_STEPS = 240
CALIBRATION_EVERY = 16
"""Calibration plays CALIBRATION_STEPS agent steps of the game with seeded random actions
and keeps every CALIBRATION_EVERY-th observation (the reset's first included): 16 frames."""


@functools.lru_cache(maxsize=8)
def calibration_observations(env_id: str, dynamics: str) -> np.ndarray:
    """The frames an int8-static policy of this env is calibrated on: the env (its gymnasium
    build, whichever engine plays the episodes) reset with CALIBRATION_SEED and stepped with
    seeded random actions, every CALIBRATION_EVERY-th observation kept. The emulator is
    deterministic, so every worker calibrates on the same frames. Read-only."""
    handle = build_env(env_id, dynamics)
    env = handle.env
    try:
        rng = np.random.default_rng(CALIBRATION_SEED)
        seed = CALIBRATION_SEED
        observation, _ = env.reset(seed=seed)
        frames = []
        for step in range(CALIBRATION_STEPS + 1):
            if step % CALIBRATION_EVERY == 0:
                frames.append(np.array(observation, dtype=np.uint8))
            action = int(rng.integers(env.action_space.n))
            observation, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                seed += 1
                observation, _ = env.reset(seed=seed)
    finally:
        env.close()
    stacked = np.stack(frames)
    stacked.flags.writeable = False
    return stacked


def calibration_for(inference_dtype: str, env_id: str, dynamics: str) -> np.ndarray | None:
    """calibration_observations for an int8-static policy of this env; None for other dtypes."""
    return calibration_observations(env_id, dynamics) if inference_dtype == INT8_STATIC else None
