"""The per-genome runner plays every task, alone or in lockstep with others, as the protocol
played by hand does; play_spec (replay's and bench's path) is that runner with one slot."""

from __future__ import annotations

import dataclasses

import pytest

import worker.play.envs as envs_module
from neuro.noise import NoiseTableSpec
from tests.support.runners import played_by_hand, run_all
from worker.evaluation.evaluator import Evaluation, Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.play.envs import EnvBuildError
from worker.runners.per_genome import PerGenomeRunner, play_spec

TABLE = NoiseTableSpec(seed=123, size=2**16)


def cartpole_task(seeds, episodes, env_seed):
    return EvaluationSpec(env_id="CartPole-v1", seeds=tuple(seeds), mutation_power=0.05,
                          noise_table=TABLE, architecture="mlp", hidden_sizes=(16,),
                          episodes=episodes, env_seed=env_seed)  # fmt: skip


@pytest.mark.parametrize("capacity", [1, 3, 8])
def test_slots_in_lockstep_play_each_task_as_the_protocol_by_hand(tmp_path, capacity):
    elite = (7, 8, 9)
    specs = {f"elite/{i}": cartpole_task(elite, 1, 100 + i) for i in range(6)}  # one genome
    specs |= {f"child/{i}": cartpole_task((7, 8, 20 + i), 2, 200 + i) for i in range(5)}
    evaluator = Evaluator(str(tmp_path))
    runner = PerGenomeRunner(evaluator, capacity)
    batched = run_all(runner, specs)
    by_hand = Evaluator(str(tmp_path))
    for task_id, spec in specs.items():
        reference = played_by_hand(spec, by_hand)
        assert batched[task_id] == (reference.returns, reference.frames), task_id
    assert len({returns[0] for returns, _ in batched.values()}) > 1  # distinct tasks
    timers = runner.timers
    assert timers.episodes == 6 + 5 * 2
    assert timers.steps == sum(sum(f) for _, f in batched.values())
    if capacity > 1:
        # Slots of the elite shared forward passes: fewer calls than agent steps.
        assert timers.forward_calls < timers.steps
    assert not runner.busy and runner.free == capacity


def test_play_spec_is_a_task_played_alone_and_raises_what_its_env_raised(tmp_path, monkeypatch):
    spec = cartpole_task((7, 8), 3, 5)
    evaluator = Evaluator(str(tmp_path))
    played = play_spec(evaluator, spec)
    assert played == played_by_hand(spec, evaluator) and len(played.returns) == 3
    assert play_spec(evaluator, spec) == played  # a second play: nothing of the first stays
    runner = PerGenomeRunner(evaluator, 2)
    other = cartpole_task((7, 9), 1, 6)
    assert [runner.play(s) for s in (spec, other, spec)] == [played, play_spec(evaluator, other),
                                                            played]  # fmt: skip
    assert len(runner._spare_policies[spec.network_key]) == 1  # one policy served all three
    runner.start("busy", other)
    with pytest.raises(RuntimeError, match="idle runner"):
        runner.play(spec)

    real_build = envs_module.build_env

    def breaks_on_the_fifth_step(env_id, dynamics):
        handle = real_build(env_id, dynamics)
        steps, real_step = 0, handle.env.step

        def step(action):
            nonlocal steps
            steps += 1
            if steps == 5:
                raise RuntimeError("simulation became unstable")
            return real_step(action)

        handle.env.step = step
        return handle

    monkeypatch.setattr(envs_module, "build_env", breaks_on_the_fifth_step)
    # Not an Evaluation naming the error, as a worker reports it: replay fails loudly.
    with pytest.raises(RuntimeError, match="simulation became unstable"):
        play_spec(evaluator, spec)
    with pytest.raises(EnvBuildError, match="NoSuchEnv-v0"):
        play_spec(evaluator, dataclasses.replace(spec, env_id="NoSuchEnv-v0"))
    assert isinstance(played, Evaluation) and not played.error


def test_a_dropped_task_frees_its_slot_and_a_bad_env_is_reported(tmp_path):
    runner = PerGenomeRunner(Evaluator(str(tmp_path)), 2)
    runner.start("a", cartpole_task((1,), 1, 0))
    assert runner.drop("a") is not None and runner.drop("a") is None
    assert runner.free == 2
    bad = EvaluationSpec(env_id="NoSuchEnv-v0", seeds=(1,), mutation_power=0.05,
                         noise_table=TABLE, architecture="mlp")  # fmt: skip
    with pytest.raises(EnvBuildError, match="NoSuchEnv-v0"):
        runner.start("b", bad)
    assert runner.free == 2


def test_the_fleet_path_plays_each_task_in_its_inference_dtype(tmp_path):
    # A run's tasks carry its dtype; the slot runner must build (and reuse) networks by it, or
    # the fleet would score a genome with another policy than replay plays.
    evaluator = Evaluator(str(tmp_path))
    runner = PerGenomeRunner(evaluator, 2)
    bf16 = dataclasses.replace(cartpole_task((7, 8), 1, 1), inference_dtype="bfloat16")
    f32 = cartpole_task((7, 9), 1, 2)
    for task_id, spec in (("a", bf16), ("b", f32)):
        runner.start(task_id, spec)
    dtypes = {loaded.policy.inference_dtype for loaded in runner._loaded.values()}
    assert dtypes == {"bfloat16", "float32"}
    while runner.busy:
        runner.step()
    # Freed networks are reused only by tasks of the same dtype.
    runner.start("c", f32)
    assert [lp.policy.inference_dtype for lp in runner._loaded.values()] == ["float32"]


def test_a_task_whose_env_raises_mid_episode_fails_alone_and_frees_its_slot(tmp_path):
    runner = PerGenomeRunner(Evaluator(str(tmp_path)), capacity=2)
    runner.start("good", cartpole_task((7, 8), 1, 1))
    runner.start("bad", cartpole_task((7, 9), 1, 2))
    env = runner._tasks["bad"].handle.env
    steps = 0
    real_step = env.step

    def breaks_on_the_fifth_step(action):
        nonlocal steps
        steps += 1
        if steps == 5:
            raise RuntimeError("simulation became unstable")
        return real_step(action)

    env.step = breaks_on_the_fifth_step
    finished = {}
    while runner.busy:
        finished.update({task_id: evaluation for task_id, evaluation in runner.step()})
    assert finished["bad"].error == "RuntimeError: simulation became unstable"
    assert finished["bad"].returns == []
    assert not finished["good"].error and len(finished["good"].returns) == 1
    assert runner.free == 2  # the failed task's slot is free again
    # The runner goes on with new tasks, on a fresh env: the failed one was not kept.
    assert env not in [h.env for h in runner._envs._free[("CartPole-v1", "paper")]]
    runner.start("next", cartpole_task((7, 8), 1, 1))
    while runner.busy:
        finished.update({task_id: evaluation for task_id, evaluation in runner.step()})
    assert finished["next"].returns == finished["good"].returns


def test_each_task_is_charged_its_start_and_a_share_of_every_step_it_was_in(tmp_path):
    """busy_s: the time a task's start took, plus an equal share of each step among the tasks
    in it; the shares of every task add up to the runner's working time, never more."""
    import time

    specs = {f"t{i}": cartpole_task((7, 8, 30 + i), 2, 300 + i) for i in range(3)}
    runner = PerGenomeRunner(Evaluator(str(tmp_path)), 3)
    began = time.perf_counter()
    for task_id, spec in specs.items():
        runner.start(task_id, spec)
    finished: dict[str, Evaluation] = {}
    while runner.busy:
        finished.update(runner.step())
    elapsed = time.perf_counter() - began
    assert sorted(finished) == sorted(specs)
    assert all(evaluation.busy_s > 0 for evaluation in finished.values())
    assert sum(evaluation.busy_s for evaluation in finished.values()) <= elapsed
    # A dropped task's time is forgotten with it: the next task of that id starts from 0.
    runner.start("again", specs["t0"])
    runner.step()
    runner.drop("again")
    runner.start("again", specs["t0"])
    runner.drop("again")
    assert runner._busy == {}
