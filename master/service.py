"""The gRPC edge: converts messages to plain values, validates them, and calls the Fleet."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from master.fleet import Fleet
from master.leases import Disposition, PhaseTask
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc

MAX_TASKS_PER_LEASE = 256
MAX_ID_LENGTH = 256

_DISPOSITIONS = {
    Disposition.ACCEPTED: pb.RESULT_DISPOSITION_ACCEPTED,
    Disposition.DUPLICATE: pb.RESULT_DISPOSITION_DUPLICATE,
    Disposition.STALE: pb.RESULT_DISPOSITION_STALE,
}


@dataclass(frozen=True)
class TaskTemplate:
    """The parts of every task that are fixed for the whole run."""

    run_id: str
    env: pb.EnvSpec
    policy: pb.PolicySpec
    noise_table: pb.NoiseTableSpec
    mutation_power: float
    max_episode_steps: int
    lease_seconds: float

    def task(self, phase_task: PhaseTask) -> pb.Task:
        genome = pb.Genome(
            seeds=phase_task.genome.seeds,
            mutation_power=self.mutation_power,
            noise_table=self.noise_table,
        )
        return pb.Task(
            task_id=phase_task.task_id,
            run_id=self.run_id,
            genome=genome,
            env=self.env,
            policy=self.policy,
            episodes=phase_task.episodes,
            max_episode_steps=self.max_episode_steps,
            env_seed=phase_task.env_seed,
            lease_seconds=self.lease_seconds,
        )


class EvolutionService(pb_grpc.EvolutionServicer):
    """Thin adapter: every decision is the Fleet's; this class only speaks protobuf."""

    def __init__(
        self,
        fleet: Fleet,
        template: TaskTemplate,
        status: Callable[[], pb.StatusResponse],
    ) -> None:
        self._fleet = fleet
        self._template = template
        self._status = status

    async def Lease(
        self, request: pb.LeaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.LeaseResponse:
        await _check_common(request, context)
        if not 1 <= request.max_tasks <= MAX_TASKS_PER_LEASE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_tasks must be in [1, {MAX_TASKS_PER_LEASE}], got {request.max_tasks}",
            )
        run_id = self._template.run_id
        if self._fleet.run_complete:
            return pb.LeaseResponse(run_complete=True, run_id=run_id)
        if self._template.env.env_id in request.unsupported_env_ids:
            # This worker cannot build the run's env; let it wait for another run.
            return pb.LeaseResponse(retry_after_ms=5000, run_id=run_id)
        granted = self._fleet.lease(request.worker_id, request.max_tasks)
        if not granted:
            return pb.LeaseResponse(
                retry_after_ms=self._fleet.settings.retry_after_ms, run_id=run_id
            )
        return pb.LeaseResponse(tasks=[self._template.task(t) for t in granted], run_id=run_id)

    async def Report(
        self, request: pb.ReportRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportResponse:
        await _check_common(request, context)
        # Validate the whole batch first, so a bad message changes nothing.
        for result in request.results:
            problem = _result_problem(result) or self._episodes_problem(result)
            if problem:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        acks = []
        for result in request.results:
            if result.run_id != self._template.run_id:
                disposition = Disposition.STALE
            elif result.error:
                disposition = self._fleet.report_failure(
                    request.worker_id, result.task_id, result.error
                )
            else:
                try:
                    disposition = self._fleet.report(
                        request.worker_id,
                        result.task_id,
                        list(result.episode_returns),
                        result.frames,
                    )
                except ValueError as error:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            acks.append(pb.TaskAck(task_id=result.task_id, disposition=_DISPOSITIONS[disposition]))
        return pb.ReportResponse(acks=acks)

    def _episodes_problem(self, result: pb.TaskResult) -> str | None:
        if result.error or result.run_id != self._template.run_id:
            return None
        expected = self._fleet.episodes_of(result.task_id)
        if expected is not None and expected != len(result.episode_returns):
            return (
                f"task {result.task_id[:80]}: {len(result.episode_returns)} episode_returns, "
                f"the task has {expected} episodes"
            )
        return None

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatResponse:
        await _check_common(request, context)
        dropped = self._fleet.heartbeat(request.worker_id, list(request.task_ids))
        return pb.HeartbeatResponse(dropped_task_ids=dropped)

    async def Release(
        self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseResponse:
        await _check_common(request, context)
        return pb.ReleaseResponse(
            released=self._fleet.release(request.worker_id, list(request.task_ids))
        )

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        return self._status()


async def _check_common(request, context: grpc.aio.ServicerContext) -> None:
    if request.protocol_version != pb.PROTOCOL_VERSION_CURRENT:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"protocol_version {request.protocol_version} is not supported; this master speaks "
            f"{pb.PROTOCOL_VERSION_CURRENT}",
        )
    if not request.worker_id or len(request.worker_id) > MAX_ID_LENGTH:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"worker_id must be 1-{MAX_ID_LENGTH} characters, got {request.worker_id[:40]!r}",
        )


def _result_problem(result: pb.TaskResult) -> str | None:
    """Why a reported result cannot be recorded, or None."""
    tid = result.task_id[:80]
    if not result.task_id or len(result.task_id) > MAX_ID_LENGTH:
        return f"task_id must be 1-{MAX_ID_LENGTH} characters, got {tid!r}"
    if result.error:
        return None
    returns = list(result.episode_returns)
    if not returns:
        return f"task {tid}: no episode_returns and no error"
    for value in returns:
        if not math.isfinite(value):
            return f"task {tid}: episode return {value!r} is not finite"
    if len(result.episode_frames) != len(returns):
        return (
            f"task {tid}: {len(returns)} episode_returns but "
            f"{len(result.episode_frames)} episode_frames"
        )
    if sum(result.episode_frames) != result.frames:
        return (
            f"task {tid}: frames {result.frames} != sum of episode_frames "
            f"{sum(result.episode_frames)}"
        )
    return None
