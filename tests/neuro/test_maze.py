"""The deceptive maze: its id, spaces, reward, walls, and the dead end that makes it deceptive."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from neuro.envs import MAZE_ID, DeceptiveMaze, maze, register_envs
from neuro.envs.make import inspect_env_id, make_env
from tests.support.processes import REPO, worker_env
from worker.inference.policy import build_policy
from worker.play.rollout import run_episode

register_envs()

UP, DOWN, LEFT, RIGHT, STAY = (0, 1), (0, -1), (-1, 0), (1, 0), (0, 0)
# Down out of the cup's open bottom, left under its side wall, up the outside, right over the
# roof, up into the goal: 0.02 per step along each leg.
AROUND_THE_CUP = [DOWN] * 15 + [LEFT] * 20 + [UP] * 35 + [RIGHT] * 20 + [UP] * 10


def play(env: gym.Env, actions, seed: int | None = 0) -> dict:
    """Plays `actions` (padded with STAY) until the episode ends; what each step gave."""
    observation, info = env.reset(seed=seed)
    steps = {"observations": [observation], "rewards": [], "bcs": [info["bc"]], "infos": []}
    for t in range(10_000):
        action = np.array(actions[t] if t < len(actions) else STAY, dtype=np.float32)
        observation, reward, terminated, truncated, info = env.step(action)
        steps["observations"].append(observation)
        steps["rewards"].append(reward)
        steps["bcs"].append(info["bc"])
        steps["infos"].append(info)
        if terminated or truncated:
            steps.update(terminated=terminated, truncated=truncated, steps=t + 1)
            return steps
    raise AssertionError("the episode never ended")


def test_the_id_is_registered_with_its_time_limit_and_goal_threshold():
    spec = gym.spec(MAZE_ID)
    assert spec.max_episode_steps == maze.EPISODE_STEPS
    assert spec.reward_threshold == -maze.GOAL_RADIUS
    assert isinstance(gym.make(MAZE_ID).unwrapped, DeceptiveMaze)
    # neuro's own envs are deterministic: the master then plays one elite episode, not 30.
    kind = inspect_env_id(MAZE_ID)
    assert kind.deterministic and not kind.atari and kind.reward_threshold == -maze.GOAL_RADIUS


def test_gymnasiums_env_checker_passes_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make(MAZE_ID).unwrapped)


def test_spaces_dtypes_and_the_behaviour_characterisation():
    env = gym.make(MAZE_ID)
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (2 + maze.N_SENSORS,), np.float32)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    rng = np.random.default_rng(0)
    steps = play(env, rng.uniform(-1, 1, (maze.EPISODE_STEPS, 2)))
    assert steps["steps"] == maze.EPISODE_STEPS
    for observation, bc in zip(steps["observations"], steps["bcs"], strict=True):
        assert observation.dtype == np.float32 and env.observation_space.contains(observation)
        assert bc.dtype == np.float32 and bc.shape == (DeceptiveMaze.behaviour_size,)
        assert np.array_equal(bc, observation[:2])  # x and y are observed unscaled
    assert np.array_equal(steps["bcs"][-1], env.unwrapped.position.astype(np.float32))
    assert len({bc.tobytes() for bc in steps["bcs"]}) > 50  # the robot did move about


def test_range_finders_measure_the_distance_to_the_nearest_wall_in_each_direction():
    observation, _ = DeceptiveMaze().reset()
    x, y = maze.START
    east, north, west, south = (maze.CUP_RIGHT - x, maze.CUP_ROOF - y, x - maze.CUP_LEFT, y)
    diagonal = (maze.CUP_ROOF - y) * np.sqrt(2)  # north-east and north-west meet the roof
    expected = [east, diagonal, north, diagonal, west, 1.0, south, 1.0]  # SW, SE: out of range
    readings = observation[2:]
    assert readings == pytest.approx(np.minimum(np.array(expected) / maze.SENSOR_RANGE, 1.0))
    # The diagonals below pass under the cup's sides to the floor, beyond the sensors' range.
    assert y * np.sqrt(2) > maze.SENSOR_RANGE


def test_the_task_is_deterministic_whatever_the_reset_seed():
    actions = np.random.default_rng(1).uniform(-1, 1, (maze.EPISODE_STEPS, 2))
    runs = [play(gym.make(MAZE_ID), actions, seed) for seed in (0, 1, 123456, None)]
    for run in runs[1:]:
        assert np.array_equal(np.stack(run["observations"]), np.stack(runs[0]["observations"]))
        assert run["rewards"] == runs[0]["rewards"]


def test_reward_is_zero_until_the_last_step_which_pays_minus_the_final_distance():
    env = gym.make(MAZE_ID)
    steps = play(env, [DOWN] * 15 + [LEFT] * 20)  # out of the cup, then standing still
    assert steps["steps"] == maze.EPISODE_STEPS
    assert (steps["terminated"], steps["truncated"]) == (False, True)
    assert steps["rewards"][:-1] == [0.0] * (maze.EPISODE_STEPS - 1)
    final = np.array(maze.START) + 0.02 * np.array([-20, -15])
    distance = float(np.hypot(*(final - np.array(maze.GOAL))))
    assert steps["rewards"][-1] == pytest.approx(-distance)
    assert steps["infos"][-1]["distance"] == pytest.approx(distance)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(np.zeros(2, dtype=np.float32))


def test_the_way_around_the_cup_reaches_the_goal_and_ends_the_episode_there():
    steps = play(gym.make(MAZE_ID), AROUND_THE_CUP)
    assert (steps["terminated"], steps["truncated"]) == (True, False)
    assert steps["steps"] < len(AROUND_THE_CUP)  # ended on entering the goal
    assert steps["rewards"][:-1] == [0.0] * (steps["steps"] - 1)
    distance = steps["infos"][-1]["distance"]
    assert distance <= maze.GOAL_RADIUS
    assert sum(steps["rewards"]) == -distance >= gym.spec(MAZE_ID).reward_threshold
    assert np.hypot(*(steps["bcs"][-1] - np.array(maze.GOAL))) <= maze.GOAL_RADIUS + 1e-6


def test_going_straight_up_ends_under_the_roof_and_the_way_out_first_scores_worse():
    env = gym.make(MAZE_ID)
    straight_up = play(env, [UP] * maze.EPISODE_STEPS)
    x, y = straight_up["bcs"][-1]
    assert x == pytest.approx(maze.START[0])
    assert maze.CUP_ROOF - maze.CLEARANCE - 0.02 < y < maze.CUP_ROOF - maze.CLEARANCE
    dead_end = sum(straight_up["rewards"])
    assert dead_end < -maze.GOAL_RADIUS  # the goal is not reached...
    assert dead_end > sum(play(env, AROUND_THE_CUP[:15])["rewards"])  # ...yet it beats going out,
    assert dead_end > sum(play(env, AROUND_THE_CUP[:35])["rewards"])  # out and aside,
    assert dead_end > sum(play(env, AROUND_THE_CUP[:70])["rewards"])  # and up the outside
    assert dead_end < sum(play(env, AROUND_THE_CUP[:90])["rewards"])  # until over the roof


def test_walls_are_sticky_a_blocked_step_does_not_slide():
    env = DeceptiveMaze()
    env.reset()
    for _ in range(20):
        env.step(np.array(UP, dtype=np.float32))
    under_roof = env.position
    for action in ((1.0, 1.0), (-0.3, 1.0), UP):
        env.step(np.array(action, dtype=np.float32))
        assert np.array_equal(env.position, under_roof)
    env.step(np.array(RIGHT, dtype=np.float32))  # a step that stays clear moves
    assert env.position == pytest.approx(under_roof + np.array([maze.MAX_SPEED, 0.0]))


def crossings(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """(P, W): whether the move before -> after touches or crosses each wall segment."""

    def orientation(a, b, c):
        return np.sign((b[..., 0] - a[..., 0]) * (c[..., 1] - a[..., 1])
                       - (b[..., 1] - a[..., 1]) * (c[..., 0] - a[..., 0]))  # fmt: skip

    p, q = before[:, None, :], after[:, None, :]
    w0, w1 = maze.WALLS[None, :, :2], maze.WALLS[None, :, 2:]
    return ((orientation(p, q, w0) * orientation(p, q, w1) <= 0)
            & (orientation(w0, w1, p) * orientation(w0, w1, q) <= 0))  # fmt: skip


def test_crossings_sees_a_move_through_a_wall():
    through_roof = crossings(np.array([[0.5, 0.55]]), np.array([[0.5, 0.65]]))
    assert through_roof[0].tolist() == [False, False, False, False, True, False, False]
    assert not crossings(np.array([[0.5, 0.55]]), np.array([[0.5, 0.58]])).any()


def test_the_robot_never_crosses_a_wall_nor_comes_within_its_clearance():
    rng = np.random.default_rng(2)
    positions = rng.uniform(0, 1, (4000, 2))
    positions = positions[~maze.blocked(positions)][:2000]
    refused = 0
    for _ in range(150):
        # Full-speed pushes, mostly diagonal, so that every wall is met at every angle.
        actions = np.sign(rng.uniform(-1, 1, positions.shape)) * rng.uniform(0.5, 1.5, (1, 1))
        moved = maze.move(positions, actions)
        assert not crossings(positions, moved).any()
        assert not maze.blocked(moved).any()
        refused += int(np.all(moved == positions, axis=1).sum())
        positions = moved
    assert refused > 10_000  # the walls were met, and often
    # The env's own robot, pushed about at random, never leaves the arena nor enters the cup's
    # walls either.
    steps = play(gym.make(MAZE_ID), rng.uniform(-1, 1, (maze.EPISODE_STEPS, 2)) * 3)
    bcs = np.stack(steps["bcs"]).astype(np.float64)
    assert not crossings(bcs[:-1], bcs[1:]).any()


def test_bad_actions_and_render_modes_are_refused():
    env = DeceptiveMaze()
    env.reset()
    for action in (np.zeros(3), np.array([np.nan, 0.0]), 1.0):
        with pytest.raises(ValueError, match="action must be 2 finite numbers"):
            env.step(action)
    with pytest.raises(ValueError, match="cannot render; got render_mode='human'"):
        DeceptiveMaze(render_mode="human")


def test_the_workers_mlp_policy_plays_it():
    handle = make_env(MAZE_ID)
    env = handle.env
    policy = build_policy("mlp", env.observation_space, env.action_space, (64, 64))
    # Zero parameters: tanh(0) maps to the middle of the action box, so the robot stays put.
    result = run_episode(policy.act, handle, seed=3)
    start_distance = float(np.hypot(*(np.array(maze.START) - np.array(maze.GOAL))))
    assert (result.steps, result.total_reward) == (maze.EPISODE_STEPS, -start_distance)


@pytest.mark.slow
def test_the_search_benchmark_runs_at_a_tiny_size(tmp_path, noise_cache):
    out = tmp_path / "maze.json"
    command = [sys.executable, "-m", "bench.maze_search", "--seeds", "1",
               "--generations", "2", "--population", "12", "--truncation", "3",
               "--noise-table-size", str(2**16), "--json", str(out)]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ga-ns: goal reached in" in done.stdout
    results = json.loads(out.read_text())
    assert [(r["arm"], r["seed"]) for r in results] == [("ga", 1), ("ga-ns", 1)]
    for result in results:
        # The batch and the worker's own rollout score the best genome the same.
        assert result["replay_return"] == pytest.approx(-result["best_distance"], abs=1e-6)


@pytest.mark.slow
def test_novelty_escapes_the_maze_where_the_ga_is_deceived(noise_cache):
    """The comparison of the README at a smaller budget (60 generations, not 100): the same
    algorithms, decoder and dynamics, the population stepped in lockstep in process."""
    from bench import maze_search

    results = maze_search.main(["--generations", "60", "--seeds", "1", "2", "3", "4", "5"])
    reached = {arm: sum(r.reached_at is not None for r in results if r.arm == arm)
               for arm in ("ga", "ga-ns")}  # fmt: skip
    assert reached["ga-ns"] >= 4 and reached["ga"] <= 1, reached
