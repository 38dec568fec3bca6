"""Env ids as users type them; the paper's Atari protocol; frame counting; rollouts."""

from __future__ import annotations

import numpy as np
import pytest

from neuro.envs.make import PAPER, REGISTERED, is_atari, make_env
from neuro.noise import NoiseTableSpec
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.play.envs import EnvBuildError
from worker.play.rollout import run_episode
from worker.runners.per_genome import play_spec


@pytest.mark.parametrize("env_id", ["Frostbite-v4", "FrostbiteNoFrameskip-v4", "ALE/Frostbite-v5"])
def test_every_spelling_of_an_atari_id_runs_the_papers_protocol(env_id):
    handle = make_env(env_id, PAPER)
    observation, _ = handle.env.reset(seed=3)
    assert observation.shape == (4, 84, 84) and observation.dtype == np.uint8
    assert handle.env.action_space.n == 18
    unwrapped = handle.env.unwrapped
    assert unwrapped._frameskip == 1  # the preprocessing skips 4 with a max-pool
    assert unwrapped.ale.getFloat("repeat_action_probability") == 0.0  # no sticky actions


def test_paper_protocol_is_deterministic_given_the_seed_and_counts_four_frames_a_step():
    def play(seed):
        handle = make_env("Frostbite-v4", PAPER)
        rng = np.random.default_rng(0)
        return run_episode(lambda _: int(rng.integers(18)), handle, max_steps=300, seed=seed)

    first, again = play(11), play(11)
    assert first == again
    assert first.frames == 4 * first.steps
    assert first.steps <= 300


def test_registered_dynamics_keep_the_envs_own_frame_skip():
    handle = make_env("Frostbite-v4", REGISTERED)
    observation, _ = handle.env.reset(seed=1)
    assert observation.shape == (4, 84, 84)
    result = run_episode(lambda _: 0, handle, max_steps=50, seed=1)
    # Frostbite-v4 skips a random 2-4 frames per step: frames come from the emulator's counter.
    assert 2 * result.steps <= result.frames <= 4 * result.steps + 200


def test_vector_envs_count_one_frame_per_step_and_the_cap_applies():
    handle = make_env("CartPole-v1")
    assert not handle.atari and not is_atari("CartPole-v1") and is_atari("ALE/Pong-v5")
    result = run_episode(lambda _: 0, handle, max_steps=5, seed=0)
    assert result.steps <= 5 and result.frames == result.steps


def test_an_unknown_env_id_is_a_clear_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="Frostbyte-v4"):
        make_env("Frostbyte-v4")
    spec = EvaluationSpec(env_id="Frostbyte-v4", seeds=(1,), mutation_power=0.01,
                          noise_table=NoiseTableSpec(size=2**16), architecture="mlp")  # fmt: skip
    with pytest.raises(EnvBuildError, match="Frostbyte-v4"):
        play_spec(Evaluator(str(tmp_path)), spec)


def test_evaluator_is_deterministic_for_a_genome_and_env_seed(tmp_path):
    spec = EvaluationSpec(env_id="CartPole-v1", seeds=(5, 6, 7), mutation_power=0.05,
                          noise_table=NoiseTableSpec(size=2**16), architecture="mlp",
                          hidden_sizes=(8,), episodes=3, env_seed=42)  # fmt: skip
    first = play_spec(Evaluator(str(tmp_path)), spec)
    second = play_spec(Evaluator(str(tmp_path)), spec)
    assert first == second
    assert len(first.returns) == 3 and first.frames == [int(r) for r in first.returns]
