"""A lease holder's observation sums and behaviours that are each finite but poison a run.

A real grpc.aio master on loopback, with this test as the worker that holds the leases: the
attacks of issue 34 are refused at the edge, naming the value, change nothing, and the run goes
on to its end with honest results and a usable normaliser.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from master.config import inspect_env_id, preset
from master.run.checkpoint import load_checkpoint
from neuro.observation_stats import ObservationStats
from neuro.v1 import evolution_pb2 as pb
from tests.support.fleet_calls import (
    ACCEPTED,
    CALL_S,
    TEST_S,
    aborted,
    counters,
    lease_some,
    report,
)
from tests.support.harness import live_master

PENDULUM = 3
PENDULUM_STEPS = 200
"""Pendulum-v1's time limit: an episode feeds its policy at most 200 + 1 observations."""
GENERATIONS = 2


def drive(scenario, tmp_path, config) -> None:
    async def main():
        async with live_master(config, tmp_path / "run") as live:
            await asyncio.wait_for(scenario(live.stub(), live.master, live.training), TEST_S)

    asyncio.run(main())


def es_normalised():
    return preset(inspect_env_id("Pendulum-v1"), algorithm="es", observation_norm=True, pairs=2,
                  eval_episodes=1, hidden_sizes=(8,), noise_table_size=2**16,
                  generations=GENERATIONS, target_score=None)  # fmt: skip


def sums(count: float, total: float, squares: float) -> pb.ObservationSums:
    return pb.ObservationSums(count=count, sum=[total] * PENDULUM,
                              sum_of_squares=[squares] * PENDULUM)  # fmt: skip


def result(task: pb.Task, observations: pb.ObservationSums | None = None, steps: int = 10,
           **fields) -> pb.TaskResult:  # fmt: skip
    message = pb.TaskResult(
        task_id=task.task_id, run_id=task.run_id, episode_returns=[-1.0] * task.episodes,
        episode_frames=[steps] * task.episodes, frames=steps * task.episodes, **fields,
    )  # fmt: skip
    if observations is None:  # honest: `steps` observations of mean 0.5, variance 1
        count = float(steps * task.episodes)
        observations = sums(count, 0.5 * count, 1.25 * count)
    message.observation_sums.CopyFrom(observations)
    return message


async def refused(stub, bad: pb.TaskResult, *details: str) -> None:
    before = await counters(stub)
    error = await aborted(report(stub, [bad]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    for detail in (bad.task_id, *details):
        assert detail in error.details(), (detail, error.details())
    assert await counters(stub) == before


ATTACKS = {
    # (a) Two of these overflowed the phase's sum: the master died at the phase's end.
    "squares past float64 together": (lambda t: result(t, sums(1, 0, 1.7e308)), "mean square"),
    # (b) Accepted, it made the next version's mean and std inf, for good.
    "a mean past float32": (lambda t: result(t, sums(1, 1e45, 1e90)), "mean 1e+45"),
    # The count was bounded by the worker's own frames: one task outweighed the run.
    "a count its frames allow but the step limit does not": (
        lambda t: result(t, sums(4e9, 4e9, 8e9), steps=2**32 - 1),
        f"at most {PENDULUM_STEPS + 1} observations",
    ),
}  # fmt: skip


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_sums_that_would_poison_the_normaliser_are_refused_and_the_run_goes_on(
    tmp_path, attack: str
) -> None:
    make_bad, detail = ATTACKS[attack]

    async def scenario(stub, master, training):
        tasks = await lease_some(stub, max_tasks=256)
        for task in tasks[:2]:  # two tasks' worth: (a) needs both
            await refused(stub, make_bad(task), detail)
        for generation in range(GENERATIONS):  # each ES generation is one phase
            if generation:
                tasks = await lease_some(stub, max_tasks=256)
            assert await report(stub, [result(t) for t in tasks]) == [ACCEPTED] * len(tasks)
        records = await asyncio.wait_for(training, CALL_S)
        assert [r.generation for r in records] == list(range(GENERATIONS))
        mean, std = master.trainer.algorithm.observation_norm()
        assert np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()
        # Only honest observations were counted: 10 per episode, 5 episodes a generation.
        state = load_checkpoint(master.trainer.run_dir.path)["algorithm"]["state"]
        counted = ObservationStats.from_json(state["observations"])
        assert counted.count == pytest.approx(0.01 + 10 * 5 * GENERATIONS)

    drive(scenario, tmp_path, es_normalised())


def test_a_result_may_count_as_many_observations_as_its_episodes_can_have(tmp_path) -> None:
    async def scenario(stub, master, training):
        [task] = await lease_some(stub, max_tasks=1)
        most = PENDULUM_STEPS + 1
        frames = 2 * most
        await refused(stub, result(task, sums(most + 1, 0, 1), steps=frames),
                      f"observation count {most + 1}")  # fmt: skip
        assert await report(stub, [result(task, sums(most, 0, 1), steps=frames)]) == [ACCEPTED]

    drive(scenario, tmp_path, es_normalised())


def ga_ns_on_atari():
    return preset(inspect_env_id("Frostbite-v4"), algorithm="ga-ns", population_size=4,
                  truncation=2, elite_candidates=1, elite_episodes=1, generations=1,
                  target_score=None)  # fmt: skip


def test_atari_behaviours_outside_a_ram_byte_are_refused(tmp_path) -> None:
    """Atari BCs are the console's RAM, 0-255: anything else is no BC an honest worker sends."""

    async def scenario(stub, master, training):
        [task] = await lease_some(stub, max_tasks=1)
        assert task.behaviour_size == 128
        ram = [float(i % 256) for i in range(128)]
        for value in (256.0, -1.0, 1e6):  # float32 values, as the wire carries them
            values = [*ram[:-1], value]
            message = pb.TaskResult(task_id=task.task_id, run_id=task.run_id,
                                    episode_returns=[0.0], episode_frames=[4], frames=4,
                                    behaviours=values)  # fmt: skip
            await refused(stub, message, f"behaviour value {value!r}", "[0, 255]")
        ram[0], ram[1] = 0.0, 255.0
        message = pb.TaskResult(task_id=task.task_id, run_id=task.run_id, episode_returns=[0.0],
                                episode_frames=[4], frames=4, behaviours=ram)  # fmt: skip
        assert await report(stub, [message]) == [ACCEPTED]

    drive(scenario, tmp_path, ga_ns_on_atari())
