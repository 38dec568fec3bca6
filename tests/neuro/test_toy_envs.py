"""neuro's memorisation toy tasks: the envs, their ids, and a GA run that learns one."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from master.config import inspect_env_id, preset
from neuro.envs import Memorize, MemorizeUntilMistake, memorize_dataset, register_envs
from neuro.envs.make import make_env
from tests.support.processes import REPO, worker_env
from worker.inference.policy import build_policy
from worker.play.rollout import run_episode

register_envs()


def lookup_policy(env: gym.Env, wrong_at: int | None = None):
    """Answers every example right from the dataset, except the `wrong_at`-th one asked."""
    unwrapped = env.unwrapped
    answers = {x.tobytes(): int(y) for x, y in zip(unwrapped.inputs, unwrapped.labels, strict=True)}
    asked = 0

    def act(observation: np.ndarray) -> int:
        nonlocal asked
        label = answers[observation.tobytes()]
        asked += 1
        return (label + 1) % 10 if asked - 1 == wrong_at else label

    return act


def play(env: gym.Env, act, seed: int | None = 0) -> tuple[float, int, list[np.ndarray]]:
    """(return, steps, observations shown) of one episode."""
    observation, _ = env.reset(seed=seed)
    total, shown = 0.0, []
    for steps in range(1, 10_001):
        shown.append(observation)
        observation, reward, terminated, truncated, _ = env.step(act(observation))
        total += reward
        if terminated or truncated:
            return total, steps, shown
    raise AssertionError("the episode never ended")


@pytest.mark.parametrize("env_id", ["neuro/Memorize-v0", "neuro/MemorizeUntilMistake-v0"])
def test_gymnasiums_env_checker_passes_without_a_warning(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make(env_id).unwrapped)
        check_env(gym.make(env_id, num_examples=3, obs_dim=2, task_seed=9).unwrapped)


def test_the_dataset_is_the_task_not_the_reset_seed():
    a, b = gym.make("neuro/Memorize-v0"), gym.make("neuro/Memorize-v0", task_seed=0)
    seen_a = play(a, lookup_policy(a), seed=1)[2]
    seen_b = play(b, lookup_policy(b), seed=987654)[2]
    assert len(seen_a) == 64 and all(map(np.array_equal, seen_a, seen_b))
    assert np.array_equal(np.stack(seen_a), a.unwrapped.inputs)  # in dataset order
    assert np.array_equal(a.unwrapped.labels, b.unwrapped.labels)
    other = gym.make("neuro/Memorize-v0", task_seed=1).unwrapped
    assert not np.array_equal(other.inputs, a.unwrapped.inputs)
    assert not np.array_equal(other.labels, a.unwrapped.labels)
    both = gym.make("neuro/MemorizeUntilMistake-v0").unwrapped
    assert np.array_equal(both.inputs, a.unwrapped.inputs)


def test_the_dataset_is_pinned_across_releases():
    # Saved genomes are scored on this exact data; NumPy's legacy stream is frozen.
    inputs, labels = memorize_dataset()
    assert inputs.shape == (64, 16) and inputs.dtype == np.float32 and labels.dtype == np.int64
    assert labels[:12].tolist() == [6, 7, 4, 7, 2, 0, 1, 6, 5, 9, 4, 8]
    digest = hashlib.sha256(inputs.tobytes() + labels.tobytes()).hexdigest()
    assert digest == "d8740aa2c42424347596ea84db6c6a42bc879952c7ab2a439bc9f3fd8637b0a4"
    assert not inputs.flags.writeable and not labels.flags.writeable


def test_memorize_returns_minus_the_number_wrong():
    env = gym.make("neuro/Memorize-v0", num_examples=40, obs_dim=5, task_seed=4)
    labels = env.unwrapped.labels
    assert play(env, lookup_policy(env))[:2] == (0.0, 40)
    assert play(env, lookup_policy(env, wrong_at=17))[:2] == (-1.0, 40)
    always_0 = play(env, lambda _: 0)
    assert always_0[:2] == (-float(40 - np.count_nonzero(labels == 0)), 40)
    assert 0 < np.count_nonzero(labels == 0) < 40  # the check above counts something


def test_until_mistake_ends_at_the_first_mistake_with_one_point_per_right_answer():
    env = gym.make("neuro/MemorizeUntilMistake-v0", num_examples=40, obs_dim=5, task_seed=4)
    assert play(env, lookup_policy(env))[:2] == (40.0, 40)
    assert play(env, lookup_policy(env, wrong_at=17))[:2] == (17.0, 18)
    assert play(env, lookup_policy(env, wrong_at=0))[:2] == (0.0, 1)
    first_non_zero = int(np.flatnonzero(env.unwrapped.labels != 0)[0])
    assert play(env, lambda _: 0)[:2] == (float(first_non_zero), first_non_zero + 1)


@pytest.mark.parametrize("task", [Memorize, MemorizeUntilMistake])
def test_returns_do_not_depend_on_the_reset_seed_even_when_shuffled(task):
    env = task(num_examples=30, obs_dim=3, task_seed=2, shuffle=True)
    orders = {seed: np.stack(play(env, lookup_policy(env), seed)[2]).tobytes() for seed in (0, 1)}
    assert orders[0] != orders[1]  # shuffled by the reset seed...
    assert np.stack(play(env, lookup_policy(env), 0)[2]).tobytes() == orders[0]  # ...reproducibly
    if task is Memorize:  # a stateless policy scores the same whatever the order
        scores = {play(env, lambda obs: int(obs[0] > 0) * 3, seed)[0] for seed in range(5)}
        assert len(scores) == 1
    plain = task(num_examples=30, obs_dim=3, task_seed=2)
    scores = {play(plain, lambda obs: int(obs[1] > 0) * 6, seed)[0] for seed in range(5)}
    assert len(scores) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_examples": 0}, "num_examples must be >= 1, got 0"),
        ({"obs_dim": 0}, "obs_dim must be >= 1, got 0"),
        ({"obs_dim": -3}, "obs_dim must be >= 1, got -3"),
        ({"task_seed": -1}, r"task_seed must be in \[0, 4294967295\], got -1"),
        ({"num_examples": 2.5}, "num_examples must be an integer, got 2.5"),
        ({"obs_dim": True}, "obs_dim must be an integer, got True"),
        ({"shuffle": "yes"}, "shuffle must be True or False, got 'yes'"),
        ({"render_mode": "rgb_array"}, "cannot render; got render_mode='rgb_array'"),
    ],
)
@pytest.mark.filterwarnings("ignore:.*render_mode='rgb_array'")  # gymnasium's, before ours
def test_bad_settings_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gym.make("neuro/MemorizeUntilMistake-v0", **kwargs)


def test_bad_actions_and_steps_after_the_end_are_refused():
    env = Memorize(num_examples=1, obs_dim=2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action must be a class in 0\.\.9, got 10"):
        env.step(10)
    env.step(0)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)


def test_sized_ids_are_registered_on_first_use_with_their_limits_and_thresholds():
    register_envs("neuro/MemorizeUntilMistake-K12-D5-S3-v0")
    register_envs("neuro/MemorizeUntilMistake-K12-D5-S3-v0")  # idempotent
    spec = gym.spec("neuro/MemorizeUntilMistake-K12-D5-S3-v0")
    assert spec.kwargs == {"num_examples": 12, "obs_dim": 5, "task_seed": 3}
    assert (spec.max_episode_steps, spec.reward_threshold) == (12, 12.0)
    default = gym.spec("neuro/Memorize-v0")
    assert (default.max_episode_steps, default.reward_threshold) == (64, 0.0)
    register_envs("neuro/Memorize-D7-v0")
    assert gym.spec("neuro/Memorize-D7-v0").kwargs == {
        "num_examples": 64, "obs_dim": 7, "task_seed": 0}  # fmt: skip
    env = gym.make("neuro/Memorize-v0", num_examples=100, obs_dim=2, max_episode_steps=100)
    assert play(env, lambda _: 0)[1] == 100  # a larger K through kwargs, with its time limit
    with pytest.raises(ValueError, match="'neuro/Memorize-K0-D3-v0': num_examples must be >= 1"):
        register_envs("neuro/Memorize-K0-D3-v0")
    with pytest.raises(ValueError, match=r"neuro/Memorize-D0-v0.*obs_dim must be >= 1, got 0"):
        inspect_env_id("neuro/Memorize-D0-v0")
    with pytest.raises(ValueError, match=r"neuro/Memorize-K0-v0.*num_examples must be >= 1"):
        make_env("neuro/Memorize-K0-v0")


def test_the_master_knows_the_ids_and_gives_them_the_vector_preset():
    config = preset(inspect_env_id("neuro/Memorize-K10-v0"))
    assert (config.architecture, config.hidden_sizes, config.atari) == ("mlp", (64, 64), False)
    assert (config.ga.population_size, config.ga.truncation) == (100, 10)
    assert config.ga.mutation_power == 0.05
    # Deterministic returns: one elite episode says all that thirty would; the target is 0 wrong.
    assert (config.ga.elite_episodes, config.target_score) == (1, 0.0)
    assert preset(inspect_env_id("neuro/MemorizeUntilMistake-K10-v0")).target_score == 10.0
    assert preset(inspect_env_id("CartPole-v1")).ga.elite_episodes == 30


def test_the_workers_mlp_policy_plays_them():
    handle = make_env("neuro/Memorize-K20-D6-S5-v0")
    env = handle.env
    policy = build_policy("mlp", env.observation_space, env.action_space, (64, 64))
    # Zero parameters tie every logit, and argmax breaks ties to class 0.
    result = run_episode(policy.act, handle, seed=11)
    wrong = np.count_nonzero(env.unwrapped.labels != 0)
    assert (result.total_reward, result.steps, result.frames) == (-float(wrong), 20, 20)


@pytest.mark.slow
def test_a_ga_run_learns_to_memorise(noise_cache, tmp_path):
    env_id = "neuro/Memorize-K32-S1-v0"
    command = [sys.executable, "-m", "master", "--env", env_id, "--local-workers", "1",
               "--generations", "8", "--population", "50", "--seed", "0", "--port", "0",
               "--quiet", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert [m["generation"] for m in metrics] == list(range(8))
    assert all(m["generation_evaluations"] == 50 + 3 * 1 for m in metrics)
    elite = [m["elite_score"] for m in metrics]
    assert elite[-1] > elite[0], elite
    assert all(-32 <= score <= 0 for score in elite)
    # The fitness is deterministic: a replay scores the elite's score on any env seed.
    from worker.offline.replay import evaluate_policy

    best = json.loads((tmp_path / "run" / "best_genome.json").read_text())
    assert (best["env_id"], best["elite_score"]) == (env_id, elite[-1])
    replays = evaluate_policy(tmp_path / "run" / "best_genome.json", episodes=2, env_seed=99)
    assert replays == [elite[-1], elite[-1]]
