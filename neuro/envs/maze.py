"""A deceptive maze: a point robot rewarded by closeness to a goal that a wall hides.

The arena is the unit square. The robot starts inside an upside-down cup: a wall above it, a
wall on each side, open only at the bottom. The goal lies straight above, beyond the cup's
roof. Going up ends against the roof, the reachable point nearest the goal; the way out leads
down first, away from the goal, then around a side of the cup and over its roof:

    y=1  +------------------------------+
         |             (G)              |   G: goal (0.5, 0.9), radius 0.05
    0.6  |     +------------------+     |   roof: y=0.6, x in [0.2, 0.8]
         |     |                  |     |   sides: x=0.2 and x=0.8, y in [0.15, 0.6]
         |     |        S         |     |   S: start (0.5, 0.3)
    0.15 |     |                  |     |
    y=0  +------------------------------+
        x=0                            x=1

Reward 0 on every step but the episode's last, which gives -(distance to the goal): the return
is minus the final distance. The episode ends (terminated) as soon as the robot is within the
goal's radius, else after EPISODE_STEPS steps (truncated); so the goal was reached exactly when
the return is >= -GOAL_RADIUS, the registered reward_threshold. A greedy search on that return
is drawn to the roof, at distance ~0.3, and anything outside the cup scores worse until it is
over the roof: the task is deceptive, and the way to the goal is found by novelty, not reward.

The task is deterministic: the start is fixed, the reset seed is ignored, and the return is a
function of the actions alone. Every step's info["bc"] is the robot's (x, y) as float32, so
after the last step it is the behaviour characterisation novelty search compares: the final
position.

Observation (float32, all in [0, 1]): x, y, then N_SENSORS range-finder readings along fixed
compass directions (east first, counter-clockwise), each the distance to the nearest wall over
SENSOR_RANGE, clipped at 1. Action: Box(-1, 1, (2,)), the velocity in x and y as a fraction of
MAX_SPEED per step. A step that would bring the robot within CLEARANCE of a wall slides along
it (only the x or only the y part of the step) or, failing that, does not happen.

The batched functions (observe, move, goal_distance) take (P, 2) positions and are what the
env steps with, so a search can step a whole population in lockstep on the same dynamics.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

START = (0.5, 0.3)
GOAL = (0.5, 0.9)
GOAL_RADIUS = 0.05
EPISODE_STEPS = 200
MAX_SPEED = 0.02
"""Largest move along each axis per step, in arena units (the arena is 1 x 1)."""
CLEARANCE = 0.015
"""Closest the robot may come to a wall. A step is at most MAX_SPEED * sqrt(2) long, less
than twice this, so a step that crossed a wall would end within CLEARANCE of it: checking
where steps end is enough to keep the robot from ever passing through a wall."""
N_SENSORS = 8
SENSOR_RANGE = 0.5
WALLS = np.array(
    [
        # The arena's boundary.
        (0.0, 0.0, 1.0, 0.0),
        (1.0, 0.0, 1.0, 1.0),
        (1.0, 1.0, 0.0, 1.0),
        (0.0, 1.0, 0.0, 0.0),
        # The cup: its roof, then its sides; open at the bottom.
        (0.2, 0.6, 0.8, 0.6),
        (0.2, 0.6, 0.2, 0.15),
        (0.8, 0.6, 0.8, 0.15),
    ],
    dtype=np.float64,
)
"""Wall segments (x0, y0, x1, y1)."""
_WALLS = WALLS.copy()  # the dynamics read this copy, so editing WALLS cannot change them

assert MAX_SPEED * math.sqrt(2) < 2 * CLEARANCE, "a step could jump over a wall"

_STEP_PARTS = np.array([(1.0, 1.0), (1.0, 0.0), (0.0, 1.0)])
"""The moves a step tries, in order: all of it, its x part, its y part."""
_START = np.array(START, dtype=np.float64)
_GOAL = np.array(GOAL, dtype=np.float64)
_W0X, _W0Y = _WALLS[:, 0], _WALLS[:, 1]
_EX, _EY = _WALLS[:, 2] - _W0X, _WALLS[:, 3] - _W0Y
_EDGE_INV_LEN2 = 1.0 / (_EX * _EX + _EY * _EY)
_ANGLES = np.arange(N_SENSORS) * 2 * np.pi / N_SENSORS
_DX, _DY = np.cos(_ANGLES)[:, None], np.sin(_ANGLES)[:, None]  # (K, 1)

# A ray p + t d meets a wall w0 + u e where t = (w0 - p) x e / (d x e) and
# u = (w0 - p) x d / (d x e); the directions are fixed, so all but the p terms are constants.
# t is counted in units of SENSOR_RANGE, so that a reading is t itself.
with np.errstate(divide="ignore"):
    _RAY_INV_DENOM = 1.0 / (_DX * _EY - _DY * _EX)  # (K, W)
_RAY_INV_DENOM[~np.isfinite(_RAY_INV_DENOM)] = np.nan  # a ray parallel to a wall never hits it
_T_SCALE = _RAY_INV_DENOM / SENSOR_RANGE
_W0_CROSS_EDGE = _W0X * _EY - _W0Y * _EX  # (W,)
_W0_CROSS_DIRECTION = _W0X * _DY - _W0Y * _DX  # (K, W)


def range_readings(positions: np.ndarray) -> np.ndarray:
    """(P, N_SENSORS) distances to the nearest wall along each sensor's ray / SENSOR_RANGE."""
    x, y = positions[:, 0:1], positions[:, 1:2]
    # (w0 - p) x e per (P, 1, W), and (w0 - p) x d per (P, K, W).
    t = (_W0_CROSS_EDGE - x * _EY + y * _EX)[:, None, :] * _T_SCALE
    u = (_W0_CROSS_DIRECTION - (x * _DY.T - y * _DX.T)[:, :, None]) * _RAY_INV_DENOM
    hits = np.where((t >= 0) & (np.abs(u - 0.5) <= 0.5), t, 1.0)
    return np.minimum(hits.min(axis=2), 1.0)


def observe(positions: np.ndarray) -> np.ndarray:
    """(P, 2 + N_SENSORS) float32 observations of robots at (P, 2) positions."""
    return np.concatenate([positions, range_readings(positions)], axis=1).astype(np.float32)


def wall_distances(points: np.ndarray) -> np.ndarray:
    """(..., W) distance from each point of (..., 2) to each wall segment."""
    return np.sqrt(_wall_distances_squared(points))


def _wall_distances_squared(points: np.ndarray) -> np.ndarray:
    ox = points[..., 0:1] - _W0X
    oy = points[..., 1:2] - _W0Y
    along = np.clip((ox * _EX + oy * _EY) * _EDGE_INV_LEN2, 0.0, 1.0)
    gx = ox - along * _EX
    gy = oy - along * _EY
    return gx * gx + gy * gy


def move(positions: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """(P, 2) positions after one step of (P, 2) actions in [-1, 1] (clipped), walls obeyed.

    The full step if it keeps CLEARANCE from every wall, else its x part alone, else its
    y part alone (sliding along the wall), else no move.
    """
    step = np.clip(actions, -1.0, 1.0) * MAX_SPEED
    candidates = positions[:, None, :] + step[:, None, :] * _STEP_PARTS  # (P, 3, 2)
    clear = _wall_distances_squared(candidates).min(axis=2) >= CLEARANCE**2  # (P, 3)
    # The first clear candidate; argmax says 0 when none is, which then keeps the robot put.
    choice = np.argmax(clear, axis=1)
    moved = candidates[np.arange(len(positions)), choice]
    return np.where(clear.any(axis=1)[:, None], moved, positions)


def goal_distance(positions: np.ndarray) -> np.ndarray:
    """(P,) distance from each position to the goal's centre."""
    return np.hypot(positions[:, 0] - _GOAL[0], positions[:, 1] - _GOAL[1])


def start_positions(count: int) -> np.ndarray:
    """(count, 2) copies of the start position."""
    return np.tile(_START, (count, 1))


class DeceptiveMaze(gym.Env):
    """Reach the goal behind the cup's roof; return = -(final distance to the goal)."""

    metadata: dict[str, Any] = {"render_modes": []}
    behaviour_size = 2
    """Length of info["bc"]: the robot's (x, y)."""

    def __init__(self, render_mode: str | None = None) -> None:
        if render_mode is not None:
            raise ValueError(
                f"{type(self).__name__} cannot render; got render_mode={render_mode!r}"
            )
        self.render_mode = None
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2 + N_SENSORS,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._position = start_positions(1)
        self._steps = 0
        self._done = True

    @property
    def position(self) -> np.ndarray:
        """The robot's (x, y), float64 (a copy)."""
        return self._position[0].copy()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Puts the robot back at the start; the seed changes nothing (the task is fixed)."""
        super().reset(seed=seed)
        self._position = start_positions(1)
        self._steps = 0
        self._done = False
        return observe(self._position)[0], {"bc": self._bc()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Moves the robot; the last step of the episode pays -(distance to the goal)."""
        if self._done:
            raise RuntimeError("the episode has ended; call reset() before step()")
        velocity = np.asarray(action, dtype=np.float64)
        if velocity.shape != (2,) or not np.all(np.isfinite(velocity)):
            raise ValueError(f"action must be 2 finite numbers, got {action!r}")
        self._position = move(self._position, velocity[None])
        self._steps += 1
        distance = float(goal_distance(self._position)[0])
        terminated = distance <= GOAL_RADIUS
        truncated = not terminated and self._steps == EPISODE_STEPS
        self._done = terminated or truncated
        reward = -distance if self._done else 0.0
        info = {"bc": self._bc(), "distance": distance}
        return observe(self._position)[0], reward, terminated, truncated, info

    def _bc(self) -> np.ndarray:
        return self._position[0].astype(np.float32)
