"""The C++ vector env path plays the paper's protocol as the gymnasium path does."""

from __future__ import annotations

import numpy as np
import pytest

from neuro.envs.make import PAPER, EnvHandle, _paper_atari, paper_frames
from neuro.noise import NoiseTableSpec
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.play.atari_vector import VectorGroup
from worker.play.envs import EnvCache
from worker.play.rollout import Rollout
from worker.runners.per_genome import PerGenomeRunner, play_spec

STEPS = 600


class Scripted:
    """Plays a fixed action sequence, one position per lane and step."""

    def __init__(self, actions: np.ndarray) -> None:
        self.actions = actions
        self.t = 0
        self.observations: list[np.ndarray] = []

    def act_batch(self, observations: np.ndarray) -> list[int]:
        self.observations.append(observations[0].copy())
        action = int(self.actions[self.t % len(self.actions)])
        self.t += 1
        return [action] * len(observations)


def play_scripted(handle: EnvHandle, seed: int, actions: np.ndarray, episodes: int = 1):
    actor = Scripted(actions)
    rollout = Rollout()
    rollout.add("run", handle, actor, episodes=episodes, max_steps=STEPS, seed=seed)
    return rollout.run()["run"], actor.observations


def vector_handle(group: VectorGroup) -> EnvHandle:
    return EnvHandle(group.take(), atari=True, dynamics=PAPER, frames_used=paper_frames)


@pytest.mark.slow  # seconds of emulation
@pytest.mark.parametrize("seed", [3, 11])
def test_no_noops_matches_gymnasium_frame_for_frame(seed):
    """Without the no-ops (drawn by different RNGs), rewards, ends and observations agree."""
    actions = np.random.default_rng(seed).integers(0, 18, STEPS)
    gym_handle = EnvHandle(_paper_atari("frostbite", noop_max=0), True, PAPER, paper_frames)
    gym_episodes, gym_obs = play_scripted(gym_handle, seed, actions, episodes=2)
    vec_episodes, vec_obs = play_scripted(
        vector_handle(VectorGroup("frostbite", 2, noop_max=0)), seed, actions, episodes=2
    )
    assert vec_episodes == gym_episodes
    assert len(vec_obs) == len(gym_obs)
    for t, (a, b) in enumerate(zip(gym_obs, vec_obs, strict=True)):
        assert np.array_equal(a, b), f"observation {t} differs"


@pytest.mark.slow  # seconds of emulation
def test_same_task_seed_same_episodes_with_noops():
    """The C++ path's no-ops come from the task's seed: the same seed replays, others differ."""
    actions = np.random.default_rng(0).integers(0, 18, STEPS)
    group = VectorGroup("frostbite", 3)
    runs = [play_scripted(vector_handle(group), seed, actions, episodes=3) for seed in (5, 5, 6)]
    assert runs[0][0] == runs[1][0]
    assert all(np.array_equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(runs[0][1], runs[2][1], strict=False))


@pytest.mark.slow  # seconds of emulation
def test_lanes_of_one_group_do_not_disturb_each_other():
    """A lane plays the same episodes alone or beside others that start and end around it."""
    actions = np.random.default_rng(1).integers(0, 18, STEPS)
    alone, _ = play_scripted(vector_handle(VectorGroup("frostbite", 1)), 7, actions, episodes=2)
    group = VectorGroup("frostbite", 3)
    rollout = Rollout()
    rollout.add("main", vector_handle(group), Scripted(actions), 2, STEPS, seed=7)
    rollout.add("short", vector_handle(group), Scripted(actions[::-1]), 1, 50, seed=8)
    done = {}
    for _ in range(60):
        done.update(rollout.step())
    assert done["short"][0].steps == 50
    rollout.add("late", vector_handle(group), Scripted(actions), 1, 30, seed=9)
    done.update(rollout.run())
    assert done["main"] == alone


@pytest.mark.slow  # seconds of emulation
def test_seeded_resets_deferred_to_one_call_play_the_same_episodes():
    """With several emulator threads, tasks' seeded resets wait for the next step and run in
    one call; every lane still plays what it plays alone on a group that resets at once."""
    # lane: (task seed, its action script's rng seed, episodes, script length)
    plans = {"a": (7, 0, 2, 300), "b": (5, 1, 1, 200), "c": (6, 2, 2, 150)}
    alone = {}
    for key, (seed, script, episodes, steps) in plans.items():
        actions = np.random.default_rng(script).integers(0, 18, steps)
        immediate = VectorGroup("frostbite", 1)
        assert not immediate._defer_seeded
        alone[key] = play_scripted(vector_handle(immediate), seed, actions, episodes)
    group = VectorGroup("frostbite", 3, threads=2)
    assert group._defer_seeded
    calls = []
    reset = group.env.reset
    group.env.reset = lambda *a, **k: calls.append(k["seed"].tolist()) or reset(*a, **k)
    rollout, actors = Rollout(), {}
    for key, (seed, script, episodes, steps) in plans.items():
        actors[key] = Scripted(np.random.default_rng(script).integers(0, 18, steps))
        rollout.add(key, vector_handle(group), actors[key], episodes, STEPS, seed=seed)
    done = rollout.run()
    assert calls[0] == [7, 5, 6]  # the three tasks' seeded resets: one call
    for key, (episodes, observations) in alone.items():
        assert done[key] == episodes
        pairs = zip(actors[key].observations, observations, strict=True)
        assert all(np.array_equal(a, b) for a, b in pairs)


def spec(env_seed: int, episodes: int = 2) -> EvaluationSpec:
    table = NoiseTableSpec(seed=123, size=2**23)
    return EvaluationSpec(env_id="Frostbite-v4", seeds=(17, 4), mutation_power=0.002,
                          noise_table=table, architecture="deepga", episodes=episodes,
                          max_episode_steps=100, env_seed=env_seed)  # fmt: skip


def run_slots(runner: PerGenomeRunner, specs: dict[str, EvaluationSpec]) -> dict:
    for task_id, task_spec in specs.items():
        runner.start(task_id, task_spec)
    results = {}
    while runner.busy:
        for task_id, evaluation in runner.step():
            results[task_id] = evaluation
    return results


@pytest.mark.slow  # seconds of emulation
def test_slot_runner_on_the_vector_engine_is_reproducible(tmp_path):
    """Frostbite, the paper network, 100-step episodes: the same results twice, 4 frames a step."""
    specs = {"a": spec(1), "b": spec(2), "c": spec(1, episodes=1)}
    first = run_slots(PerGenomeRunner(Evaluator(str(tmp_path), atari_backend="vector"), 4), specs)
    second = run_slots(PerGenomeRunner(Evaluator(str(tmp_path), atari_backend="vector"), 4), specs)
    assert first == second
    for evaluation in first.values():
        assert evaluation.frames == [400] * len(evaluation.frames)  # capped at 100 steps
    assert first["c"].returns == first["a"].returns[:1]
    single = play_spec(Evaluator(str(tmp_path), atari_backend="vector"), spec(1))
    assert single == first["a"]


def test_engine_choice_keeps_gymnasium_where_it_must():
    pool = EnvCache("vector", 2)
    assert hasattr(pool.take("Frostbite-v4").env, "group")
    assert not hasattr(pool.take("Frostbite-v4", "registered").env, "group")
    assert not hasattr(pool.take("CartPole-v1").env, "group")
    with pytest.raises(ValueError, match="atari engine"):
        EnvCache("emulator")


def test_worker_flag_and_env_var_choose_the_engine(monkeypatch):
    from worker.cli import worker_parser, worker_settings

    monkeypatch.delenv("NEURO_ATARI_BACKEND", raising=False)
    monkeypatch.delenv("NEURO_ATARI_ENGINE", raising=False)
    parser = worker_parser()
    assert worker_settings(parser, parser.parse_args([])).atari_backend == "vector"
    flagged = parser.parse_args(["--atari-backend", "gym"])
    assert worker_settings(parser, flagged).atari_backend == "gym"
    monkeypatch.setenv("NEURO_ATARI_BACKEND", "bogus")
    parser = worker_parser()
    with pytest.raises(SystemExit):
        worker_settings(parser, parser.parse_args([]))
