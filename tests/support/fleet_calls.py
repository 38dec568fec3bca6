"""A test as the worker: lease, report and status calls against a live master on loopback."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from neuro.v1 import evolution_pb2 as pb
from tests.support.harness import live_master
from tests.support.tiny import tiny_cartpole

CURRENT = pb.PROTOCOL_VERSION_CURRENT
ACCEPTED, DUPLICATE, STALE = (pb.RESULT_DISPOSITION_ACCEPTED, pb.RESULT_DISPOSITION_DUPLICATE,
                              pb.RESULT_DISPOSITION_STALE)  # fmt: skip
CALL_S = 5.0
TEST_S = 20.0
POPULATION, CANDIDATES, EPISODES = 6, 2, 3
PER_GENERATION = POPULATION + CANDIDATES * EPISODES


def drive(scenario, tmp_path, **overrides) -> None:
    """Runs one scenario against a fresh master, bounded in time, and always stops it."""

    async def main():
        config = tiny_cartpole(**({"elite_episodes": EPISODES} | overrides))
        async with live_master(config, tmp_path / "run") as live:
            await asyncio.wait_for(scenario(live.stub(), live.master, live.training), TEST_S)

    asyncio.run(main())


async def lease(stub, worker="w", max_tasks=256, **fields) -> pb.LeaseResponse:
    request = pb.LeaseRequest(
        protocol_version=CURRENT, worker_id=worker, max_tasks=max_tasks, **fields
    )
    return await stub.Lease(request, timeout=CALL_S)


async def lease_some(stub, worker="w", max_tasks=256) -> list[pb.Task]:
    """Leases until tasks come (the trainer may not have opened the phase yet)."""
    while not (response := await lease(stub, worker, max_tasks)).tasks:
        assert not response.run_complete
        await asyncio.sleep(0.005)
    return list(response.tasks)


def result(task: pb.Task, score: float | None = None, frames_each: int | None = None):
    seed = task.genome.seeds[-1]
    score = float(seed % 100) if score is None else score  # below CartPole's 475 target
    frames_each = 10 + seed % 7 if frames_each is None else frames_each
    return pb.TaskResult(
        task_id=task.task_id,
        run_id=task.run_id,
        episode_returns=[score] * task.episodes,
        episode_frames=[frames_each] * task.episodes,
        frames=frames_each * task.episodes,
    )


async def report(stub, results, worker="w") -> list[int]:
    request = pb.ReportRequest(protocol_version=CURRENT, worker_id=worker, results=results)
    response = await stub.Report(request, timeout=CALL_S)
    assert [a.task_id for a in response.acks] == [r.task_id for r in results]
    return [a.disposition for a in response.acks]


async def status(stub) -> pb.StatusResponse:
    return await stub.Status(pb.StatusRequest(), timeout=CALL_S)


async def counters(stub) -> tuple[int, ...]:
    s = await status(stub)
    return (s.tasks_pending, s.tasks_leased, s.tasks_done, s.leases_reissued, s.frames)


async def until_phase(stub, generation: int, phase: str) -> None:
    while (s := await status(stub)).generation != generation or s.phase != phase:
        await asyncio.sleep(0.005)


async def finish_phase(stub, worker="w") -> list[pb.Task]:
    tasks = await lease_some(stub, worker)
    assert await report(stub, [result(t) for t in tasks], worker) == [ACCEPTED] * len(tasks)
    return tasks


async def aborted(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value
