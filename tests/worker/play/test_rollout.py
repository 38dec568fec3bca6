"""One rollout loop: the fleet's slots, replay and single episodes play the same episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from neuro.envs.make import make_env
from neuro.noise import NoiseTableSpec
from tests.support.runners import played_by_hand
from worker.evaluation.evaluator import Evaluation, Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.offline.replay import evaluate_policy
from worker.play.rollout import FunctionActor, Rollout, StepTimers, play
from worker.runners.per_genome import PerGenomeRunner, play_spec

CARTPOLE = EvaluationSpec(env_id="CartPole-v1", seeds=(7, 8, 9), mutation_power=0.05,
                          noise_table=NoiseTableSpec(seed=123, size=2**16), architecture="mlp",
                          hidden_sizes=(16,), episodes=5, env_seed=100)  # fmt: skip
# Capped well short of an episode's end, so the cap is what ends each of them.
FROSTBITE = EvaluationSpec(env_id="Frostbite-v4", seeds=(3, 4, 5), mutation_power=0.002,
                           noise_table=NoiseTableSpec(size=2**24), architecture="deepga",
                           episodes=3, env_seed=3, max_episode_steps=60)  # fmt: skip


def with_(spec: EvaluationSpec, **changes) -> EvaluationSpec:
    return EvaluationSpec(**{**spec.__dict__, **changes})


def fleet(spec: EvaluationSpec, cache: Path) -> Evaluation:
    """The spec as one task among others in a worker's slots, sharing forward passes."""
    runner = PerGenomeRunner(Evaluator(str(cache)), capacity=3)
    runner.start("other-genome", with_(spec, seeds=(*spec.seeds, 1), episodes=1))
    runner.start("same-genome", with_(spec, env_seed=spec.env_seed + 1))
    runner.start("task", spec)
    done = {}
    while runner.busy:
        done.update({task_id: evaluation for task_id, evaluation in runner.step()})
    assert runner.timers.forward_calls < runner.timers.steps  # same-genome slots batched
    return done["task"]


@pytest.mark.parametrize(
    "spec",
    [CARTPOLE, pytest.param(FROSTBITE, marks=pytest.mark.slow)],
    ids=["cartpole", "frostbite"],
)
def test_fleet_and_replay_paths_give_the_same_episodes(spec, noise_cache: Path) -> None:
    replay = play_spec(Evaluator(str(noise_cache)), spec)
    assert len(set(replay.returns)) > 1  # distinct episodes: the continued RNG is exercised
    if spec is CARTPOLE:  # as scored before the fleet and replay loops became one
        assert replay == Evaluation([10.0, 12.0, 12.0, 11.0, 12.0], [10, 12, 12, 11, 12])
    assert fleet(spec, noise_cache) == replay
    assert played_by_hand(spec, Evaluator(str(noise_cache))) == replay
    settings = dict(architecture=spec.architecture, hidden_sizes=spec.hidden_sizes,
                    mutation_power=spec.mutation_power, noise_table=spec.noise_table,
                    max_episode_steps=spec.max_episode_steps)  # fmt: skip
    returns = evaluate_policy(spec.env_id, spec.seeds, spec.episodes, env_seed=spec.env_seed,
                              evaluator=Evaluator(str(noise_cache)), **settings)  # fmt: skip
    assert returns == replay.returns
    if spec.max_episode_steps:
        assert replay.frames == [4 * spec.max_episode_steps] * spec.episodes


def test_runs_in_lockstep_keep_their_own_episodes_and_timers() -> None:
    def random_actor(seed: int) -> FunctionActor:
        rng = np.random.default_rng(seed)
        return FunctionActor(lambda _: int(rng.integers(2)))

    alone = {
        seed: play(random_actor(seed), make_env("CartPole-v1"), 3, 40, seed) for seed in (1, 2)
    }
    timers = StepTimers()
    rollout = Rollout(timers)
    for seed in (1, 2):
        rollout.add(seed, make_env("CartPole-v1"), random_actor(seed), 3, 40, seed)
    together = rollout.run()
    assert together == alone and len(rollout) == 0
    assert timers.episodes == 6 and timers.steps == sum(
        e.steps for episodes in together.values() for e in episodes
    )
    assert all(e.frames == e.steps <= 40 for episodes in together.values() for e in episodes)


def test_a_run_refuses_no_episodes_and_a_key_twice() -> None:
    rollout = Rollout()
    actor = FunctionActor(lambda _: 0)
    with pytest.raises(ValueError, match="episodes must be >= 1, got 0"):
        rollout.add("a", make_env("CartPole-v1"), actor, episodes=0)
    rollout.add("a", make_env("CartPole-v1"), actor)
    with pytest.raises(ValueError, match="'a' is already playing"):
        rollout.add("a", make_env("CartPole-v1"), actor)
    assert rollout.remove("a") and not rollout.remove("a") and len(rollout) == 0
