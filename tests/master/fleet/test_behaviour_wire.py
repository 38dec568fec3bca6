"""Behaviours and observation sums on the wire: asked for by tasks, checked before anything counts.

A real grpc.aio master on loopback, with this test as the (possibly broken) worker.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from master.config import inspect_env_id, preset
from neuro.v1 import evolution_pb2 as pb
from tests.support.fleet_calls import (
    ACCEPTED,
    CALL_S,
    CURRENT,
    TEST_S,
    aborted,
    counters,
    lease_some,
    report,
)
from tests.support.harness import live_master
from tests.support.tiny import tiny_cartpole

CARTPOLE_OBSERVATION = 4
PENDULUM_OBSERVATION = 3


def drive(scenario, tmp_path, config) -> None:
    async def main():
        async with live_master(config, tmp_path / "run") as live:
            await asyncio.wait_for(scenario(live.stub(), live.master, live.training), TEST_S)

    asyncio.run(main())


def ga_ns():
    return tiny_cartpole(algorithm="ga-ns", archive_probability=0.5, k=2)


def es_normalised():
    return preset(inspect_env_id("Pendulum-v1"), algorithm="es", observation_norm=True, pairs=2,
                  eval_episodes=1, hidden_sizes=(8,), noise_table_size=2**16,
                  generations=2)  # fmt: skip


def result(task: pb.Task, steps: int = 10, **fields) -> pb.TaskResult:
    message = pb.TaskResult(
        task_id=task.task_id, run_id=task.run_id, episode_returns=[1.0] * task.episodes,
        episode_frames=[steps] * task.episodes, frames=steps * task.episodes,
    )  # fmt: skip
    for name, value in fields.items():
        if name == "observation_sums":
            message.observation_sums.CopyFrom(value)
        else:
            getattr(message, name).extend(value)
    return message


def behaviours(task: pb.Task, value: float = 0.5) -> list[float]:
    return [value] * (task.episodes * task.behaviour_size)


def sums(size: int, count: float = 10.0, mean: float = 0.5) -> pb.ObservationSums:
    return pb.ObservationSums(count=count, sum=[count * mean] * size,
                              sum_of_squares=[count * mean * mean + 1.0] * size)  # fmt: skip


async def refused(stub, bad: pb.TaskResult, detail: str) -> None:
    before = await counters(stub)
    error = await aborted(report(stub, [bad]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in error.details() and bad.task_id in error.details()
    assert await counters(stub) == before


def test_novelty_tasks_ask_for_behaviours_and_a_run_trains_on_them(tmp_path) -> None:
    async def scenario(stub, master, training):
        while not training.done():
            response = await stub.Lease(
                pb.LeaseRequest(protocol_version=CURRENT, worker_id="w", max_tasks=256),
                timeout=CALL_S,
            )
            tasks = list(response.tasks)
            if not tasks:
                await asyncio.sleep(0.005)
                continue
            if tasks[0].behaviour_size != CARTPOLE_OBSERVATION:
                raise AssertionError(f"behaviour_size {tasks[0].behaviour_size}")
            rng = np.random.default_rng(len(tasks))
            results = [result(t, behaviours=rng.normal(size=4 * t.episodes).tolist())
                       for t in tasks]  # fmt: skip
            assert await report(stub, results) == [ACCEPTED] * len(tasks)
        records = training.result()
        assert len(records) == 2
        assert records[-1].extra["archive_size"] > 0
        assert records[0].extra["novelty_mean"] > 0

    drive(scenario, tmp_path, ga_ns())


@pytest.mark.parametrize(
    ("make_bad", "detail"),
    [
        (lambda t: result(t, behaviours=behaviours(t)[:-1]), "behaviour values, the run expects"),
        (lambda t: result(t), "0 behaviour values"),
        (lambda t: result(t, behaviours=[float("nan")] * 4), "must be finite"),
        (lambda t: result(t, behaviours=behaviours(t), observation_sums=sums(4)),
         "run without normalisation"),
    ],
)  # fmt: skip
def test_a_novelty_run_refuses_results_whose_behaviours_do_not_fit(tmp_path, make_bad, detail):
    async def scenario(stub, master, training):
        [task] = await lease_some(stub, max_tasks=1)
        await refused(stub, make_bad(task), detail)
        assert await report(stub, [result(task, behaviours=behaviours(task))]) == [ACCEPTED]

    drive(scenario, tmp_path, ga_ns())


def test_a_ga_run_asks_for_no_behaviours_and_refuses_them(tmp_path) -> None:
    async def scenario(stub, master, training):
        [task] = await lease_some(stub, max_tasks=1)
        assert task.behaviour_size == 0
        await refused(stub, result(task, behaviours=[1.0] * 4), "the run expects 0")

    drive(scenario, tmp_path, tiny_cartpole())


def test_normalised_es_tasks_carry_the_normaliser_and_need_plausible_sums(tmp_path) -> None:
    async def scenario(stub, master, training):
        [task] = await lease_some(stub, max_tasks=1)
        es = task.perturbation
        assert es.observation_size == PENDULUM_OBSERVATION
        request = pb.ParametersRequest(protocol_version=CURRENT, worker_id="w",
                                       version=es.version)  # fmt: skip
        chunks = [c async for c in stub.FetchParameters(request, timeout=CALL_S)]
        data = b"".join(c.data for c in chunks)
        assert len(data) == 4 * (es.num_params + 2 * PENDULUM_OBSERVATION)
        std = np.frombuffer(data, "<f4")[-PENDULUM_OBSERVATION:]
        assert np.all(std > 0)
        size = PENDULUM_OBSERVATION
        await refused(stub, result(task), "needs observation sums of 3 values")
        await refused(stub, result(task, observation_sums=sums(2)), "needs observation sums")
        await refused(stub, result(task, observation_sums=sums(size, count=12.0)),
                      "not in [1, frames + episodes]")  # fmt: skip
        impossible = pb.ObservationSums(count=2, sum=[10.0] * size, sum_of_squares=[1.0] * size)
        await refused(stub, result(task, observation_sums=impossible), "no set of observations")
        negative = sums(size)
        negative.sum_of_squares[0] = -1.0
        await refused(stub, result(task, observation_sums=negative), "sums of squares >= 0")
        good = result(task, observation_sums=sums(size, count=11.0))
        assert await report(stub, [good]) == [ACCEPTED]

    drive(scenario, tmp_path, es_normalised())
