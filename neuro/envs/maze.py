"""A deceptive maze: a point robot rewarded by closeness to a goal that a wall hides.

The arena is the unit square. The robot starts inside an upside-down cup: a roof above it, a
side wall left and right, open only at the bottom. The goal lies straight above, beyond the
roof. Going up ends under the roof, the reachable point nearest the goal; the way out leads
down first, away from the goal, then around a side of the cup and over its roof:

    y=1    +----------------------------------------+
           |                  (G)                   |  G: goal (0.5, 0.9), radius 0.05
    y=0.6  |       +------------------------+       |  roof: y=0.6, x from 0.2 to 0.8
           |       |           S            |       |  S: start (0.5, 0.4)
           |       |                        |       |  sides: x=0.2 and x=0.8,
    y=0.2  |       |                        |       |         y from 0.2 to 0.6
           |                                        |
    y=0    +----------------------------------------+
          x=0     x=0.2                   x=0.8    x=1

Reward 0 on every step but the episode's last, which gives -(distance to the goal): the return
is minus the final distance. The episode ends (terminated) as soon as the robot is within the
goal's radius, else after EPISODE_STEPS steps (truncated); so the goal was reached exactly when
the return is >= -GOAL_RADIUS, the registered reward_threshold. Under the roof the distance is
0.315 at best, and every point outside the cup scores worse until it is over the roof: a
search that follows the return is drawn into the dead end; the way to the goal is found by
novelty.

The task is deterministic: the start is fixed, the reset seed is ignored, and the return is a
function of the actions alone. Every step's info["bc"] is the robot's (x, y) as float32, so
after the last step it is the behaviour characterisation novelty search compares: the final
position.

Observation (float32, all in [0, 1]): x, y, then N_SENSORS range-finder readings along fixed
compass directions (east first, counter-clockwise), each the distance to the nearest wall over
SENSOR_RANGE, capped at 1. Action: Box(-1, 1, (2,)), the velocity along x and y as a fraction
of MAX_SPEED per step (clipped to [-1, 1]).

Walls are sticky: a step that would end within CLEARANCE of a wall is refused and the robot
stays put. Its observation is then unchanged, so a memoryless policy (the project's mlp) stays
against that wall for the rest of the episode. That is what makes the maze deceptive for a
GA: a robot that slid along walls would follow the arena's boundary round the cup to the top
by chance, and the GA would stumble on the way out; with sticky walls the way out is a path the
policy has to steer itself. bench/maze_search.py measures both searches on this layout.

The batched functions (observe, move, goal_distance) take (P, 2) positions and are what the
env steps with, so a search can step a whole population in lockstep on the same dynamics.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

START = (0.5, 0.4)
GOAL = (0.5, 0.9)
GOAL_RADIUS = 0.05
CUP_LEFT, CUP_RIGHT, CUP_BOTTOM, CUP_ROOF = 0.2, 0.8, 0.2, 0.6
"""The cup's side walls stand at x = CUP_LEFT and CUP_RIGHT, from CUP_BOTTOM up to CUP_ROOF."""
EPISODE_STEPS = 200
MAX_SPEED = 0.02
"""Largest move along each axis per step, in arena units (the arena is 1 x 1)."""
CLEARANCE = 0.015
"""Closest the robot may come to a wall along either axis. A step is at most
MAX_SPEED * sqrt(2) long, less than twice this, so a step from a clear point that crossed a
wall would end within CLEARANCE of it: checking where steps end is enough to keep the robot
from ever passing through a wall."""
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
        (CUP_LEFT, CUP_ROOF, CUP_RIGHT, CUP_ROOF),
        (CUP_LEFT, CUP_ROOF, CUP_LEFT, CUP_BOTTOM),
        (CUP_RIGHT, CUP_ROOF, CUP_RIGHT, CUP_BOTTOM),
    ],
    dtype=np.float64,
)
"""Wall segments (x0, y0, x1, y1), read-only: the dynamics' constants are derived from them."""
WALLS.flags.writeable = False

assert MAX_SPEED * math.sqrt(2) < 2 * CLEARANCE, "a step could jump over a wall"

_START = np.array(START, dtype=np.float64)
_GOAL = np.array(GOAL, dtype=np.float64)


def _blocked_region(walls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(2, 4W) weights and (4W,) offsets: points @ weights + offsets are, per wall, the margins
    x - left, right - x, y - bottom, top - y of the wall grown by CLEARANCE on every side; a
    point is blocked by a wall when all four are positive.

    Growing the walls into boxes needs axis-aligned walls; it turns the distance check into
    one matrix product.
    """
    if not np.all((walls[:, 0] == walls[:, 2]) | (walls[:, 1] == walls[:, 3])):
        raise ValueError("maze walls must be horizontal or vertical segments")
    left = np.minimum(walls[:, 0], walls[:, 2]) - CLEARANCE
    right = np.maximum(walls[:, 0], walls[:, 2]) + CLEARANCE
    bottom = np.minimum(walls[:, 1], walls[:, 3]) - CLEARANCE
    top = np.maximum(walls[:, 1], walls[:, 3]) + CLEARANCE
    ones, zeros = np.ones(len(walls)), np.zeros(len(walls))
    weights = np.array([np.concatenate([ones, -ones, zeros, zeros]),
                        np.concatenate([zeros, zeros, ones, -ones])])  # fmt: skip
    return weights, np.concatenate([-left, right, -bottom, top])


def _ray_coefficients(walls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(2, 2KW) weights and (2KW,) offsets: positions @ weights + offsets are, for every
    sensor k and wall w, t (the ray's length to the wall's line, in units of SENSOR_RANGE)
    then 2u - 1 (where on the wall it lands: within [-1, 1] on the segment).

    A ray p + t d meets the wall w0 + u e at t = (w0 - p) x e / (d x e) and
    u = (w0 - p) x d / (d x e): both are affine in p, as the directions are fixed.
    """
    angles = np.arange(N_SENSORS) * 2 * np.pi / N_SENSORS
    dx, dy = np.cos(angles)[:, None], np.sin(angles)[:, None]  # (K, 1)
    w0x, w0y = walls[:, 0], walls[:, 1]
    ex, ey = walls[:, 2] - w0x, walls[:, 3] - w0y  # (W,)
    denominator = dx * ey - dy * ex  # (K, W)
    parallel = np.abs(denominator) < 1e-12
    inverse = np.where(parallel, 0.0, 1.0 / np.where(parallel, 1.0, denominator))
    # t = (w0 x e - x ey + y ex) / denominator; a parallel wall gets t = -1: never a hit.
    t_weights = np.stack([-ey * inverse, ex * inverse]) / SENSOR_RANGE
    t_offset = np.where(parallel, -1.0, (w0x * ey - w0y * ex) * inverse / SENSOR_RANGE)
    # 2u - 1 = 2 (w0 x d - x dy + y dx) / denominator - 1
    u_weights = 2 * np.stack([-dy * inverse, dx * inverse])
    u_offset = 2 * (w0x * dy - w0y * dx) * inverse - 1
    weights = np.concatenate([t_weights.reshape(2, -1), u_weights.reshape(2, -1)], axis=1)
    return weights, np.concatenate([t_offset.ravel(), u_offset.ravel()])


_MARGIN_WEIGHTS, _MARGIN_OFFSETS = _blocked_region(WALLS)
_RAY_WEIGHTS, _RAY_OFFSETS = _ray_coefficients(WALLS)
_RAYS = N_SENSORS * len(WALLS)


def range_readings(positions: np.ndarray) -> np.ndarray:
    """(P, N_SENSORS) distances to the nearest wall along each sensor's ray / SENSOR_RANGE."""
    coefficients = positions @ _RAY_WEIGHTS + _RAY_OFFSETS
    t, u = coefficients[:, :_RAYS], coefficients[:, _RAYS:]
    hit = (t >= 0) & (np.abs(u) <= 1)
    shape = (len(positions), N_SENSORS, len(WALLS))
    return np.min(t.reshape(shape), axis=2, where=hit.reshape(shape), initial=1.0)


def observe(positions: np.ndarray) -> np.ndarray:
    """(P, 2 + N_SENSORS) float32 observations of robots at (P, 2) positions."""
    return np.concatenate([positions, range_readings(positions)], axis=1).astype(np.float32)


def blocked(points: np.ndarray) -> np.ndarray:
    """Whether each point of (..., 2) lies within CLEARANCE of a wall (per axis)."""
    margins = points @ _MARGIN_WEIGHTS + _MARGIN_OFFSETS
    depth = margins.reshape(*points.shape[:-1], 4, len(WALLS)).min(axis=-2)
    return depth.max(axis=-1) > 0


def move(positions: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """(P, 2) positions after one step of (P, 2) actions (clipped to [-1, 1]).

    A step that would end within CLEARANCE of a wall does not happen (walls are sticky).
    """
    moved = positions + np.minimum(np.maximum(actions, -1.0), 1.0) * MAX_SPEED
    return np.where(blocked(moved)[:, None], positions, moved)


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
