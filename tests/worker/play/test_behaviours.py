"""What workers report beside returns: behaviour characterisations and observation sums.

Played through the one rollout loop with real envs, and compared with the same episodes
recorded by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from neuro.envs.behaviour import ATARI_RAM_SIZE, behaviour_size
from neuro.envs.make import make_env
from neuro.noise import NoiseTableSpec
from neuro.observation_stats import CLIP, ObservationStats, normalise
from worker.evaluation.evaluator import Evaluation, Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.inference.policy import build_policy
from worker.play.envs import VECTOR, EnvCache
from worker.play.rollout import FunctionActor, play
from worker.runners.per_genome import PerGenomeRunner


def _cartpole_policy(seed: int = 0):
    handle = make_env("CartPole-v1")
    policy = build_policy("mlp", handle.env.observation_space, handle.env.action_space, (8,))
    rng = np.random.default_rng(seed)
    policy.load_parameters(rng.normal(0, 0.5, policy.num_params).astype(np.float32))
    return handle, policy


def _by_hand(handle, act, episodes: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(final observation, observations fed to the actor) of each episode, played by hand."""
    finals, fed = [], []
    observation, _ = handle.env.reset(seed=seed)
    for _ in range(episodes):
        seen = []
        while True:
            seen.append(np.asarray(observation, dtype=np.float64))
            observation, _, terminated, truncated, _ = handle.env.step(act(observation))
            if terminated or truncated:
                break
        finals.append(np.asarray(observation, dtype=np.float32))
        fed.append(np.stack(seen))
        observation, _ = handle.env.reset()
    return finals, fed


def test_a_vector_env_episode_reports_its_final_observation_and_observation_sums() -> None:
    handle, policy = _cartpole_policy()
    episodes = play(policy, handle, 3, seed=11, behaviour_size=4, observation_sums=True)
    finals, fed = _by_hand(make_env("CartPole-v1"), policy.act, 3, seed=11)
    for episode, final, seen in zip(episodes, finals, fed, strict=True):
        assert episode.behaviour is not None and episode.behaviour.dtype == np.float32
        np.testing.assert_array_equal(episode.behaviour, final)
        stats = episode.observations
        assert stats is not None and stats.count == len(seen) == episode.steps
        np.testing.assert_allclose(stats.total, seen.sum(axis=0), rtol=1e-12)
        np.testing.assert_allclose(stats.squares, np.square(seen).sum(axis=0), rtol=1e-12)
    evaluation = Evaluation.of(episodes)
    assert evaluation.observations is not None
    assert evaluation.observations.count == sum(e.steps for e in episodes)
    assert evaluation.behaviours is not None and len(evaluation.behaviours) == 3


def test_nothing_extra_is_recorded_unless_asked() -> None:
    handle, policy = _cartpole_policy()
    [episode] = play(policy, handle, 1, seed=3)
    assert episode.behaviour is None and episode.observations is None
    evaluation = Evaluation.of([episode])
    assert evaluation.behaviours is None and evaluation.observations is None


def test_a_task_asking_for_another_behaviour_size_is_refused_before_it_plays() -> None:
    handle, policy = _cartpole_policy()
    with pytest.raises(ValueError, match="behaviours of 7 values; this env's have 4"):
        play(policy, handle, 1, seed=3, behaviour_size=7)


def test_an_env_that_declares_a_behaviour_reports_info_bc() -> None:
    class Walker:
        """A tiny env whose behaviour is a declared info["bc"], not its observation."""

        behaviour_size = 2

        def __init__(self) -> None:
            import gymnasium as gym

            self.observation_space = gym.spaces.Box(-1, 1, (3,))
            self.action_space = gym.spaces.Discrete(2)
            self.unwrapped = self
            self.position = 0

        def reset(self, seed=None):
            self.position = 0
            return np.zeros(3, np.float32), {"bc": [0.0, 0.0]}

        def step(self, action):
            self.position += 1 if action else -1
            done = abs(self.position) >= 3
            return np.ones(3, np.float32), 0.0, done, False, {"bc": [self.position, 7.0]}

    from neuro.envs.make import EnvHandle

    env = Walker()
    assert behaviour_size(env, atari=False) == 2
    handle = EnvHandle(env, atari=False, dynamics=None, frames_used=lambda steps: steps)
    [episode] = play(FunctionActor(lambda _: 1), handle, 1, behaviour_size=2)
    np.testing.assert_array_equal(episode.behaviour, [3.0, 7.0])


def test_an_atari_episode_reports_the_consoles_ram(noise_cache: Path) -> None:
    spec = EvaluationSpec(
        env_id="Frostbite-v4", seeds=(5,), mutation_power=0.002,
        noise_table=NoiseTableSpec(size=2**23), architecture="deepga", episodes=1,
        env_seed=4, max_episode_steps=30, behaviour_size=ATARI_RAM_SIZE,
    )  # fmt: skip
    # The vector engine is this worker's default; a task asking for RAM plays on gymnasium.
    runner = PerGenomeRunner(Evaluator(str(noise_cache), atari_backend=VECTOR), capacity=1)
    runner.start("t", spec)
    handle = runner._tasks["t"].handle
    assert getattr(handle.env, "group", None) is None
    done = []
    while runner.busy:
        done += runner.step()
    [(_, evaluation)] = done
    [ram] = evaluation.behaviours
    assert ram.shape == (ATARI_RAM_SIZE,) and ram.dtype == np.float32
    np.testing.assert_array_equal(ram, handle.env.unwrapped.ale.getRAM().astype(np.float32))
    assert ram.max() <= 255 and ram.any()


def test_a_vector_engine_sub_env_cannot_give_a_behaviour() -> None:
    handle = EnvCache(VECTOR).take("Frostbite-v4")
    policy = build_policy("deepga", handle.env.observation_space, handle.env.action_space)
    with pytest.raises(ValueError, match="vector env"):
        play(policy, handle, 1, max_steps=2, behaviour_size=ATARI_RAM_SIZE)


def test_observation_sums_from_several_workers_combine_exactly() -> None:
    # Dyadic values (k / 8): every sum is exact in float64, so any split must agree bit for bit.
    rng = np.random.default_rng(0)
    observations = rng.integers(-800, 800, size=(1000, 11)) / 8.0
    whole = ObservationStats.of(observations)
    for trial in range(5):
        cuts = np.sort(rng.choice(np.arange(1, 1000), size=trial + 2, replace=False))
        parts = [ObservationStats.of(part) for part in np.split(observations, cuts)]
        order = rng.permutation(len(parts))  # reports arrive in any order
        combined = ObservationStats.zeros(11)
        for i in order:
            combined = combined + parts[i]
        assert combined.count == whole.count
        assert np.array_equal(combined.total, whole.total)
        assert np.array_equal(combined.squares, whole.squares)
        assert all(np.array_equal(a, b) for a, b in zip(combined.normaliser(), whole.normaliser(),
                                                           strict=True))  # fmt: skip
    mean, std = whole.normaliser()
    np.testing.assert_allclose(mean, observations.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(std, observations.std(axis=0), rtol=1e-5)


def test_the_prior_normaliser_is_defined_and_a_constant_input_is_not_blown_up() -> None:
    mean, std = ObservationStats.prior(3).normaliser()
    assert np.all(mean == 0) and np.all(std > 0)
    constant = ObservationStats.of(np.full((50, 3), 2.5)) + ObservationStats.prior(3)
    mean, std = constant.normaliser()
    np.testing.assert_allclose(mean, 2.5, rtol=1e-3)
    assert np.all(std >= 1e-2 - 1e-9)
    out = normalise(np.array([[2.5, 2.5, 1e6]]), mean, std)
    assert out[0, 2] == CLIP


@pytest.mark.parametrize(
    "bad",
    [
        dict(count=-1.0, total=np.zeros(2), squares=np.zeros(2)),
        dict(count=1.0, total=np.zeros(2), squares=np.zeros(3)),
        dict(count=1.0, total=np.array([np.nan, 0]), squares=np.zeros(2)),
        dict(count=1.0, total=np.zeros(2), squares=np.array([-1.0, 0])),
    ],
)
def test_impossible_observation_sums_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="observation"):
        ObservationStats(**bad)


def test_the_policy_feeds_normalised_observations_when_given_a_normaliser() -> None:
    _, policy = _cartpole_policy(seed=5)
    observations = np.random.default_rng(1).normal(0, 3, (64, 4)).astype(np.float32)
    mean = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    std = np.array([2.0, 0.5, 1.0, 4.0], np.float32)
    plain = policy.act_batch(normalise(observations, mean, std))
    policy.observation_norm = (mean, std)
    assert np.array_equal(policy.act_batch(observations), plain)
    policy.observation_norm = None
    assert not np.array_equal(policy.act_batch(observations), plain)


def test_es_parameters_carry_the_normaliser_and_wrong_sizes_are_refused(noise_cache) -> None:
    _, policy = _cartpole_policy()
    n = policy.num_params
    spec = EvaluationSpec(
        env_id="CartPole-v1", seeds=(), mutation_power=0.1,
        noise_table=NoiseTableSpec(seed=123, size=2**16), architecture="mlp",
        hidden_sizes=(8,), perturbation=(3, 17, 0, 0.1), observation_size=4,
    )  # fmt: skip
    theta = np.random.default_rng(2).normal(size=n).astype(np.float32)
    mean, std = np.arange(4, dtype=np.float32), np.full(4, 2.0, np.float32)
    evaluator = Evaluator(str(noise_cache))
    evaluator.set_parameters(3, np.concatenate([theta, mean, std]))
    evaluator.load(spec, policy)
    np.testing.assert_array_equal(policy.flat_parameters, theta)
    assert policy.observation_norm is not None
    np.testing.assert_array_equal(policy.observation_norm[0], mean)
    np.testing.assert_array_equal(policy.observation_norm[1], std)
    evaluator.set_parameters(4, np.concatenate([theta, mean]))  # the std is missing
    short = EvaluationSpec(**{**spec.__dict__, "perturbation": (4, 17, 0, 0.1)})
    with pytest.raises(ValueError, match="2 x 4 observation statistics"):
        evaluator.load(short, policy)
    evaluator.set_parameters(5, np.concatenate([theta, mean, np.zeros(4, np.float32)]))
    zero_std = EvaluationSpec(**{**spec.__dict__, "perturbation": (5, 17, 0, 0.1)})
    with pytest.raises(ValueError, match="std > 0"):
        evaluator.load(zero_std, policy)
