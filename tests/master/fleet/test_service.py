"""The gRPC edge against a real grpc.aio master on loopback, with this test as the worker."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from neuro.v1 import evolution_pb2 as pb
from neuro.wire import SERVICE_NAME
from tests.support.fleet_calls import (
    ACCEPTED,
    CALL_S,
    CURRENT,
    DUPLICATE,
    PER_GENERATION,
    POPULATION,
    STALE,
    aborted,
    counters,
    drive,
    finish_phase,
    lease,
    lease_some,
    report,
    result,
    status,
    until_phase,
)


def test_fake_workers_drive_a_whole_run(tmp_path):
    frames = Counter()
    duplicates = Counter()

    async def work(stub, worker, max_tasks):
        while not (response := await lease(stub, worker, max_tasks)).run_complete:
            results = [result(t) for t in response.tasks]
            for r, ack in zip(results, await report(stub, results, worker), strict=True):
                # A duplicate: the other copy of a task backed up at a phase's end came first.
                assert ack in (ACCEPTED, DUPLICATE)
                if ack == ACCEPTED:
                    frames[r.task_id.split("/")[0]] += r.frames
                else:
                    duplicates[r.task_id.split("/")[0]] += 1
            await asyncio.sleep(0 if response.tasks else 0.005)

    async def scenario(stub, master, training):
        await asyncio.gather(work(stub, "a", 4), work(stub, "b", 1))
        records = await asyncio.wait_for(training, CALL_S)
        assert [r.generation for r in records] == [0, 1]
        assert [r.generation_evaluations for r in records] == [PER_GENERATION] * 2
        assert [r.evaluations for r in records] == [PER_GENERATION, 2 * PER_GENERATION]
        assert [r.generation_frames for r in records] == [frames["g0"], frames["g1"]]
        assert records[-1].frames == master.trainer.frames == frames["g0"] + frames["g1"]
        assert [r.failed_evaluations for r in records] == [0, 0]
        # Every copy was reported: each backup made exactly one duplicate, and counted once.
        assert [r.backup_tasks for r in records] == [duplicates["g0"], duplicates["g1"]]
        assert all(r.backup_wins <= r.backup_tasks for r in records)
        s = await status(stub)
        trainer = master.trainer
        assert (s.generation, s.frames, s.evaluations) == (2, trainer.frames, 24)
        assert s.run_complete and s.run_id == master.trainer.fleet.settings.run_id
        assert s.elite_score == trainer.algorithm.elite_score and s.elite_score < 475
        assert list(s.elite.seeds) == list(trainer.algorithm.elite.seeds)
        response = await lease(stub, "late")
        assert response.run_complete and not response.tasks

    drive(scenario, tmp_path)


def test_duplicate_report_is_acked_and_changes_nothing(tmp_path):
    async def scenario(stub, master, training):
        [task] = await lease_some(stub, max_tasks=1)
        assert await report(stub, [result(task, score=42.0)]) == [ACCEPTED]
        before = await counters(stub)
        again = result(task, score=99.0, frames_each=1000)
        assert await report(stub, [again], "other") == [DUPLICATE]
        assert await counters(stub) == before
        await finish_phase(stub)
        await until_phase(stub, 0, "elite")
        index = int(task.task_id.split("/")[2])
        assert master.trainer.algorithm.state.scores[index] == 42.0

    drive(scenario, tmp_path)


def test_report_for_another_run_is_stale(tmp_path):
    async def scenario(stub, master, training):
        [task] = await lease_some(stub, max_tasks=1)
        before = await counters(stub)
        foreign = result(task)
        foreign.run_id = "another-run"
        assert await report(stub, [foreign]) == [STALE]
        assert await counters(stub) == before
        assert await report(stub, [result(task)]) == [ACCEPTED]

    drive(scenario, tmp_path)


def test_report_from_the_previous_phase_is_duplicate(tmp_path):
    async def scenario(stub, master, training):
        offspring = await finish_phase(stub)
        await until_phase(stub, 0, "elite")
        [elite_task] = await lease_some(stub, max_tasks=1)
        assert elite_task.task_id.startswith("g0/e/")
        before = await counters(stub)
        assert await report(stub, [result(offspring[0])]) == [DUPLICATE]
        assert await counters(stub) == before

    drive(scenario, tmp_path)


BAD_VERSION = 7


@pytest.mark.parametrize(
    ("method", "request_", "code", "detail"),
    [
        ("Lease", pb.LeaseRequest(protocol_version=BAD_VERSION, worker_id="w", max_tasks=1),
         grpc.StatusCode.FAILED_PRECONDITION, f"protocol_version {BAD_VERSION}"),
        ("Report", pb.ReportRequest(worker_id="w"),
         grpc.StatusCode.FAILED_PRECONDITION, "protocol_version 0"),
        ("Heartbeat", pb.HeartbeatRequest(protocol_version=BAD_VERSION, worker_id="w"),
         grpc.StatusCode.FAILED_PRECONDITION, f"protocol_version {BAD_VERSION}"),
        ("Release", pb.ReleaseRequest(protocol_version=BAD_VERSION, worker_id="w"),
         grpc.StatusCode.FAILED_PRECONDITION, f"protocol_version {BAD_VERSION}"),
        ("Lease", pb.LeaseRequest(protocol_version=CURRENT, worker_id="w", max_tasks=0),
         grpc.StatusCode.INVALID_ARGUMENT, "got 0"),
        ("Lease", pb.LeaseRequest(protocol_version=CURRENT, worker_id="w", max_tasks=257),
         grpc.StatusCode.INVALID_ARGUMENT, "got 257"),
        ("Lease", pb.LeaseRequest(protocol_version=CURRENT, max_tasks=1),
         grpc.StatusCode.INVALID_ARGUMENT, "worker_id"),
        ("Heartbeat", pb.HeartbeatRequest(protocol_version=CURRENT, worker_id="x" * 257),
         grpc.StatusCode.INVALID_ARGUMENT, "worker_id"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_with_a_status_code(tmp_path, method, request_, code, detail):
    async def scenario(stub, master, training):
        error = await aborted(getattr(stub, method)(request_, timeout=CALL_S))
        assert error.code() == code and detail in error.details()

    drive(scenario, tmp_path)


ONE_EPISODE = {"episode_returns": [1.0], "episode_frames": [10], "frames": 10}


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"episode_returns": [math.nan]}, "nan"),
        ({"episode_returns": [math.inf]}, "inf"),
        ({"episode_returns": [-math.inf]}, "-inf"),
        ({"frames": 11}, "sum of episode_frames"),
        ({"episode_frames": []}, "0 episode_frames"),
        ({"episode_returns": [1.0, 2.0], "episode_frames": [5, 5]}, "2 episode_returns"),
    ],
)
def test_a_batch_with_one_bad_result_changes_nothing(tmp_path, fields, detail):
    async def scenario(stub, master, training):
        good_task, bad_task = await lease_some(stub, max_tasks=2)
        ids = {"task_id": bad_task.task_id, "run_id": bad_task.run_id}
        bad = pb.TaskResult(**ids, **(ONE_EPISODE | fields))
        before = await counters(stub)
        for batch in ([bad], [result(good_task), bad]):
            error = await aborted(report(stub, batch))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert detail in error.details() and bad_task.task_id in error.details()
            assert await counters(stub) == before
        assert await report(stub, [result(good_task)]) == [ACCEPTED]

    drive(scenario, tmp_path)


def test_released_tasks_go_to_another_worker(tmp_path):
    async def scenario(stub, master, training):
        held = [t.task_id for t in await lease_some(stub, "a", max_tasks=2)]
        release = pb.ReleaseRequest(protocol_version=CURRENT, worker_id="b", task_ids=held)
        assert (await stub.Release(release, timeout=CALL_S)).released == 0  # not b's
        release.worker_id = "a"
        assert (await stub.Release(release, timeout=CALL_S)).released == 2
        assert (await status(stub)).tasks_leased == 0
        taken = [t.task_id for t in (await lease(stub, "b", max_tasks=2)).tasks]
        assert sorted(taken) == sorted(held)

    drive(scenario, tmp_path)


def test_heartbeat_names_finished_and_unknown_tasks(tmp_path):
    async def scenario(stub, master, training):
        done, running = await lease_some(stub, max_tasks=2)
        assert await report(stub, [result(done)]) == [ACCEPTED]
        ids = [done.task_id, running.task_id, "g9/o/0/0"]
        beat = pb.HeartbeatRequest(protocol_version=CURRENT, worker_id="w", task_ids=ids)
        response = await stub.Heartbeat(beat, timeout=CALL_S)
        assert list(response.dropped_task_ids) == [done.task_id, "g9/o/0/0"]
        beat.worker_id = "other"
        response = await stub.Heartbeat(beat, timeout=CALL_S)
        assert running.task_id in response.dropped_task_ids

    drive(scenario, tmp_path)


def test_lapsed_lease_goes_to_another_worker_and_first_report_wins(tmp_path):
    async def scenario(stub, master, training):
        [task] = await lease_some(stub, "slow", max_tasks=1)
        await asyncio.sleep(0.3)
        taken = {t.task_id: t for t in (await lease(stub, "fast")).tasks}
        assert task.task_id in taken and len(taken) == POPULATION
        assert (await status(stub)).leases_reissued >= 1
        assert await report(stub, [result(task, score=1.0)], "slow") == [ACCEPTED]
        assert await report(stub, [result(task, score=2.0)], "fast") == [DUPLICATE]

    drive(scenario, tmp_path, lease_seconds=0.2)


def test_status_tracks_the_trainer_mid_run(tmp_path):
    async def scenario(stub, master, training):
        await finish_phase(stub)
        await finish_phase(stub)
        await until_phase(stub, 1, "offspring")
        assert len(await lease_some(stub, "w2", max_tasks=1)) == 1
        s, trainer = await status(stub), master.trainer
        assert (s.generation, s.phase) == (1, "offspring")
        assert (s.frames, s.evaluations) == (trainer.frames, trainer.evaluations)
        assert s.evaluations == PER_GENERATION and s.frames == trainer.records[0].frames
        assert (s.tasks_pending, s.tasks_leased, s.tasks_done) == (POPULATION - 1, 1, 0)
        assert s.workers == 2 and not s.run_complete

    drive(scenario, tmp_path)


def test_health_service_reports_serving(tmp_path):
    async def scenario(stub, master, training):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{master.port}")
        try:
            health = health_pb2_grpc.HealthStub(channel)
            for service in (SERVICE_NAME, ""):
                request = health_pb2.HealthCheckRequest(service=service)
                response = await health.Check(request, timeout=CALL_S)
                assert response.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await channel.close()
        assert SERVICE_NAME == "neuro.v1.Evolution"

    drive(scenario, tmp_path)
