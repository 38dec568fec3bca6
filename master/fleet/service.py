"""The gRPC edge: converts messages to plain values, validates them, and calls the Fleet.

The Task messages a lease hands out are built by master.fleet.tasks, the edge's other half,
from the template of the run each task is of: one for a single run, one per run of a study
(serve_run), whose task ids the Fleet qualifies with the run's key.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from master.fleet.fleet import Fleet
from master.fleet.leases import Disposition
from master.fleet.phases import TaskOutcome
from master.fleet.presence import MAX_ATTACHED
from master.fleet.roster import WorkerStats
from master.fleet.tasks import TaskTemplate
from neuro.observation_stats import ObservationStats
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from neuro.wire import MAX_ERROR_CHARS, MAX_MESSAGE_BYTES, MAX_TASKS_PER_LEASE, worker_id_problem
from neuro.wire import MAX_TASK_ID_LENGTH as MAX_ID_LENGTH

MAX_TASK_IDS_PER_CALL = 4096
"""Task ids one Heartbeat or Release may name, and results one Report may carry: far more than
a worker holds (slots + prefetch), few enough that no single call stalls the master."""
MAX_EPISODE_FRAMES = 2**32 - 1
"""Far above any real episode; keeps cumulative frame counts inside Status's uint64."""
MAX_EPISODE_RETURN = float(2**53)
"""The largest episode return taken, either sign. An env's returns have no bound the master
knows (a game's scores are its own; gymnasium declares no reward range), so any finite score a
worker holding the task reports is its word, as the token makes it; but past 2**53 a float64
no longer holds every integer score, and a generation's sums and means of returns this large
stay finite (1e308 twice is inf, which no statistic or target can use). Atari's highest scores
are below 1e7."""
MAX_REQUEST_BYTES = MAX_MESSAGE_BYTES
"""The server's receive limit (grpc's default); a larger request gets RESOURCE_EXHAUSTED."""
PARAMETER_CHUNK_BYTES = 2**20
"""FetchParameters streams a version in pieces this big, well under any message limit."""
PRESENCE_PING_S = 10.0
PRESENCE_PING_TIMEOUT_S = 10.0
"""The server pings each connection this often and closes it when a ping goes unanswered this
long: a worker whose host or network vanished (no TCP reset ever comes) is known to be gone
within about 20 s, and its Attach call ends. A busy worker answers: gRPC's own threads do."""
PRESENCE_OPTIONS = (
    ("grpc.keepalive_time_ms", int(PRESENCE_PING_S * 1000)),
    ("grpc.keepalive_timeout_ms", int(PRESENCE_PING_TIMEOUT_S * 1000)),
    # What actually closes an unanswered connection: every ping's own timeout (60 s by
    # default); the keepalive timeout above is not armed for these pings.
    ("grpc.http2.ping_timeout_ms", int(PRESENCE_PING_TIMEOUT_S * 1000)),
    # Keep pinging a connection over which only the Attach call's rare updates travel.
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # gRPC cancels calls that arrive beyond what the server has yet asked for (1,000 soft,
    # 3,000 hard by default): a fleet that connects at once (a run's start, a master's
    # restart) would see part of its Attach and Lease calls cancelled and retry them.
    ("grpc.server.max_pending_requests", MAX_ATTACHED),
    ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_ATTACHED),
)
"""The server options that make a vanished worker's Attach call end and let a whole fleet
attach at once."""
REFUSED_RETRY_MS = 5000
"""How often a worker that refuses the run's tasks asks again: its refusal stays current, and
it hears when the run ends."""
ATTACH_UPDATE_S = 30.0
"""An Attach call carries a message at least this often: idle connections that nothing
crosses are closed by some NATs and load balancers, and the worker would reconnect."""


class StatusFigures(Protocol):
    """What the Status answer reads of where the run stands.

    master.observe.events.RunSnapshot is one; it is declared here because the snapshot is the
    loop's type, in a room above the fleet, and this edge only copies its fields into protobuf.
    A study's figures may also have StudyFigures' runs() and utilisation(), which Status lists;
    a single run's have neither, and Status lists no runs.
    """

    @property
    def run_id(self) -> str: ...
    @property
    def env_id(self) -> str: ...
    @property
    def generation(self) -> int: ...
    @property
    def phase(self) -> str: ...
    @property
    def frames(self) -> int: ...
    @property
    def evaluations(self) -> int: ...
    @property
    def elite_score(self) -> float: ...
    @property
    def elite_seeds(self) -> Sequence[int]: ...
    @property
    def tasks_pending(self) -> int: ...
    @property
    def tasks_leased(self) -> int: ...
    @property
    def tasks_done(self) -> int: ...
    @property
    def workers(self) -> int: ...
    @property
    def leases_reissued(self) -> int: ...
    @property
    def run_complete(self) -> bool: ...


class RunFigures(Protocol):
    """One run of a study as Status lists it: master.observe.events.RunView is one."""

    @property
    def name(self) -> str: ...
    @property
    def env_id(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def snapshot(self) -> StatusFigures | None: ...
    @property
    def error(self) -> str: ...


class StudyFigures(StatusFigures, Protocol):
    """The figures of a master serving a study: the fleet's, each run's, how busy the fleet is."""

    def runs(self) -> Sequence[RunFigures]:
        """Every run of the study, in its file's order."""
        ...

    def utilisation(self) -> float | None:
        """The fleet's busy fraction over a recent window; None when unknown."""
        ...


_DISPOSITIONS = {
    Disposition.ACCEPTED: pb.RESULT_DISPOSITION_ACCEPTED,
    Disposition.DUPLICATE: pb.RESULT_DISPOSITION_DUPLICATE,
    Disposition.STALE: pb.RESULT_DISPOSITION_STALE,
    Disposition.REJECTED: pb.RESULT_DISPOSITION_REJECTED,
}


UNSUPPORTED_RETRY_MS = 5000
"""How often a worker that cannot build the run's env asks again (it may serve another run)."""


class EvolutionService(pb_grpc.EvolutionServicer):
    """Thin adapter: every decision is the Fleet's; this class only speaks protobuf.

    `template`: a single run's (the Fleet's run of key ""); None for a study, whose runs are
    served with serve_run() as they start.
    """

    def __init__(
        self,
        fleet: Fleet,
        template: TaskTemplate | None,
        status: Callable[[], StatusFigures],
    ) -> None:
        self._fleet = fleet
        self._single = template
        self._templates: dict[str, TaskTemplate] = {} if template is None else {"": template}
        """Each run's template by its key in the fleet."""
        self._status = status

    def serve_run(self, key: str, template: TaskTemplate) -> None:
        """A study's run (the Fleet's run of this key) is served: its tasks are built from
        `template`."""
        self._templates[key] = template

    def stop_serving_run(self, key: str) -> None:
        """A study's run is no longer served: its results and parameters are no longer taken."""
        self._templates.pop(key, None)

    async def Lease(
        self, request: pb.LeaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.LeaseResponse:
        await _check_common(request, context)
        if not 1 <= request.max_tasks <= MAX_TASKS_PER_LEASE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_tasks must be in [1, {MAX_TASKS_PER_LEASE}], got {request.max_tasks}",
            )
        run_id = self._single.run_id if self._single is not None else ""
        if self._fleet.tell_complete(request.worker_id):
            return pb.LeaseResponse(run_complete=True, run_id=run_id)
        if self._refused(request) and self._single is not None:
            return pb.LeaseResponse(retry_after_ms=REFUSED_RETRY_MS, run_id=run_id)
        unsupported = set(request.unsupported_env_ids)
        # A run whose env this worker cannot build goes to other workers.
        excluded = [key for key, template in self._templates.items()
                    if template.env.env_id in unsupported] if unsupported else []  # fmt: skip
        if excluded and self._single is not None:
            # This worker cannot build the run's env; let it wait for another run.
            return pb.LeaseResponse(retry_after_ms=UNSUPPORTED_RETRY_MS, run_id=run_id)
        granted = self._fleet.lease_runs(request.worker_id, request.max_tasks, excluded)
        response = pb.LeaseResponse(run_id=run_id)
        for run, tasks in granted:
            template = self._templates.get(run)
            if template is not None:  # else its leases lapse: the run is no longer served
                template.add_tasks(response, tasks)
        if not response.tasks:
            response.retry_after_ms = self._fleet.retry_after_ms()
        elif self._single is None and len(granted) == 1:
            response.run_id = self._templates[granted[0].run].run_id
        return response

    def _refused(self, request: pb.LeaseRequest) -> bool:
        """Whether this worker refuses a run's tasks (a module it cannot import), which the
        fleet then records; a request without a refusal of a run served withdraws any it made."""
        refusal = request.refusal if request.HasField("refusal") else None
        key = self._run_key(refusal.run_id) if refusal is not None else None
        if key is None:
            self._fleet.withdraw_refusal(request.worker_id)
            return False
        assert refusal is not None
        reason = refusal.reason[:MAX_ERROR_CHARS] or "no reason given"
        self._fleet.refuse(request.worker_id, reason, key)
        return True

    def _run_key(self, run_id: str) -> str | None:
        """The key of the run served with this run id; None if none is."""
        if not run_id:
            return None
        for key, template in self._templates.items():
            if template.run_id == run_id:
                return key
        return None

    async def Report(
        self, request: pb.ReportRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportResponse:
        await _check_common(request, context)
        if len(request.results) > MAX_TASK_IDS_PER_CALL:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a Report carries at most {MAX_TASK_IDS_PER_CALL} results, got "
                f"{len(request.results)}",
            )
        # Validate and convert the whole batch first, so a bad message changes nothing. Each
        # field is read once: every read of a protobuf field makes a new Python object.
        outcomes, this_run = [], []
        for result in request.results:
            task_id, error, returns = result.task_id, result.error, tuple(result.episode_returns)
            template = self._template_of(task_id)
            ours = template is not None and result.run_id == template.run_id
            problem = _result_problem(result, task_id, error, returns)
            if not problem and template is not None:
                # Held to the template of the run it says it is of (another's is not recorded).
                problem = _extras_problem(result, task_id, error, len(returns), template)
            if problem:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            behaviours = observations = None
            if ours and not error and template.behaviour_size:
                behaviours = np.array(result.behaviours, dtype=np.float32).reshape(
                    len(returns), template.behaviour_size
                )
            if ours and not error and template.observation_size:
                sums = result.observation_sums
                observations = ObservationStats(
                    sums.count, np.array(sums.sum), np.array(sums.sum_of_squares)
                )
            # Bounded by the task's lease age where it is recorded (master.fleet.phases).
            busy = result.busy_seconds
            outcomes.append(TaskOutcome(task_id, returns, result.frames, error, behaviours,
                                        observations, busy))  # fmt: skip
            this_run.append(ours)
        ours = [outcome for outcome, ok in zip(outcomes, this_run, strict=True) if ok]
        try:
            recorded = iter(self._fleet.report_many(request.worker_id, ours))
        except ValueError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        response = pb.ReportResponse()
        add = response.acks.add
        for outcome, ok in zip(outcomes, this_run, strict=True):
            disposition = next(recorded) if ok else Disposition.STALE
            add(task_id=outcome.task_id, disposition=_DISPOSITIONS[disposition])
        return response

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatResponse:
        await _check_common(request, context)
        task_ids = await _checked_task_ids(request, context)
        dropped = self._fleet.heartbeat(request.worker_id, task_ids)
        complete = self._fleet.tell_complete(request.worker_id)
        return pb.HeartbeatResponse(dropped_task_ids=dropped, run_complete=complete)

    async def Release(
        self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseResponse:
        await _check_common(request, context)
        task_ids = await _checked_task_ids(request, context)
        return pb.ReleaseResponse(released=self._fleet.release(request.worker_id, task_ids))

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        figures = self._status()
        status = with_worker_status(status_response(figures), self._fleet.worker_stats())
        with_study(status, figures)
        status.workers_tracked = self._fleet.workers_tracked()
        refusals = self._fleet.refusals()
        for worker in status.worker_status if refusals else ():
            worker.refusal = refusals.get(worker.worker_id, "")
        return status

    async def FetchParameters(
        self, request: pb.ParametersRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ParametersChunk]:
        await _check_common(request, context)
        run_id = request.run_id
        # No run named: a worker from before the field, which only a single run can answer.
        key = self._run_key(run_id) if run_id else ("" if self._single is not None else None)
        template = self._templates.get(key) if key is not None else None
        store = template.parameters if template is not None else None
        current = store.get(request.version) if store is not None else None
        if current is None:
            of_run = f" of run {run_id[:80]!r}" if run_id else ""
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"parameters of version {request.version}{of_run} are not served (the run is "
                "not ES or not served here, or the update is over)",
            )
        version, data, sha256 = current
        for offset in range(0, max(len(data), 1), PARAMETER_CHUNK_BYTES):
            yield pb.ParametersChunk(
                version=version, offset=offset, total_bytes=len(data), sha256=sha256,
                data=data[offset : offset + PARAMETER_CHUNK_BYTES],
            )  # fmt: skip

    async def Attach(
        self, request: pb.AttachRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.AttachUpdate]:
        await _check_common(request, context)
        token = self._fleet.attach(request.worker_id)
        if token is None:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"more than {MAX_ATTACHED} workers attached; this one's leases lapse as usual",
            )
        try:
            # At once, not with the first update: the worker (or a benchmark) sees it is watched.
            await context.send_initial_metadata(())
            while not self._fleet.run_complete and not self._fleet.presence_closed:
                try:
                    async with asyncio.timeout(ATTACH_UPDATE_S):
                        await self._fleet.until_complete_or_closed()
                except TimeoutError:
                    yield pb.AttachUpdate()
            if self._fleet.run_complete:
                yield pb.AttachUpdate(run_complete=True)
            # Else the master is stopping: the call ends with OK and the worker calls again,
            # finding the master gone (it retries) or restarted.
        finally:
            if self._fleet.run_complete:
                # The call ended after the run did: the worker heard it and left (it may not
                # call again, and the master's linger would wait its whole grace for it), or
                # it is gone. One that is frozen or slow keeps its call open: still untold.
                self._fleet.tell_complete(request.worker_id)
            # The worker's connection closed (grpc cancels this call), or the run is over.
            self._fleet.detach(request.worker_id, token)

    def _template_of(self, task_id: str) -> TaskTemplate | None:
        """The template of the run a (wire) task id is of; None if no run served has it."""
        if self._single is not None:
            return self._single
        key = self._fleet.run_key(task_id)
        return self._templates.get(key) if key is not None else None


def status_response(snapshot: StatusFigures) -> pb.StatusResponse:
    """The Status answer for a snapshot of the run (the per-worker table is added apart)."""
    response = pb.StatusResponse(
        run_id=snapshot.run_id,
        env_id=snapshot.env_id,
        generation=snapshot.generation,
        phase=snapshot.phase,
        frames=snapshot.frames,
        evaluations=snapshot.evaluations,
        elite_score=snapshot.elite_score,
        tasks_pending=snapshot.tasks_pending,
        tasks_leased=snapshot.tasks_leased,
        tasks_done=snapshot.tasks_done,
        workers=snapshot.workers,
        leases_reissued=snapshot.leases_reissued,
        run_complete=snapshot.run_complete,
    )
    if snapshot.elite_seeds:  # no elite: the field stays unset, as before the first one
        response.elite.seeds.extend(snapshot.elite_seeds)
    return response


def with_study(status: pb.StatusResponse, figures: StatusFigures) -> pb.StatusResponse:
    """Adds a study's runs and the fleet's utilisation, where `figures` has them (StudyFigures)."""
    runs = getattr(figures, "runs", None)
    add = status.runs.add
    for run in runs() if callable(runs) else ():
        snapshot = run.snapshot
        add(
            name=run.name,
            env_id=run.env_id,
            seed=run.seed,
            label=run.label,
            state=run.state,
            generation=0 if snapshot is None else snapshot.generation,
            frames=0 if snapshot is None else snapshot.frames,
            elite_score=math.nan if snapshot is None else snapshot.elite_score,
            error=run.error[:MAX_ERROR_CHARS],
        )
    utilisation = getattr(figures, "utilisation", None)
    busy = utilisation() if callable(utilisation) else None
    if busy is not None and math.isfinite(busy):  # unknown: the field stays unset
        status.utilisation = busy
    return status


def with_worker_status(
    status: pb.StatusResponse, workers: Sequence[WorkerStats]
) -> pb.StatusResponse:
    """Adds the per-worker table to a (fresh) StatusResponse and returns it."""
    add = status.worker_status.add
    for worker in workers:
        add(
            worker_id=worker.worker_id,
            tasks_leased=worker.tasks_leased,
            evaluations=worker.evaluations,
            frames=worker.frames,
            frames_per_second=worker.frames_per_second,
            seconds_since_contact=worker.seconds_since_contact,
            tasks_failed=worker.tasks_failed,
            held_off_seconds=worker.held_off_s,
        )
    return status


def add_to_server(service: EvolutionService, server: grpc.aio.Server) -> None:
    """Registers the service; a request that does not parse is refused with INVALID_ARGUMENT.

    Use this rather than the generated add_EvolutionServicer_to_server: with its parser, bytes
    that are not a valid message fail before any handler runs and grpc.aio answers UNKNOWN.
    """
    descriptor = pb.DESCRIPTOR.services_by_name["Evolution"]
    handlers = {}
    for method in descriptor.methods:
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        if method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _refusing_malformed_stream(getattr(service, method.name)),
                request_deserializer=_parser(request_type),
                response_serializer=response_type.SerializeToString,
            )
            continue
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _refusing_malformed(getattr(service, method.name)),
            request_deserializer=_parser(request_type),
            response_serializer=response_type.SerializeToString,
        )
    generic = grpc.method_handlers_generic_handler(descriptor.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))
    server.add_registered_method_handlers(descriptor.full_name, handlers)


class _Malformed(NamedTuple):
    """What the parser hands on instead of a request it could not parse."""

    problem: str


def _parser(message_type: Any) -> Callable[[bytes], Any]:
    name = message_type.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError as error:
            return _Malformed(f"request is not a valid {name} ({len(data)} bytes): {error}")

    return parse


def _refusing_malformed(
    method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    @functools.wraps(method)
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.problem)
        return await method(request, context)

    return handle


def _refusing_malformed_stream(
    method: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
    @functools.wraps(method)
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.problem)
        async for item in method(request, context):
            yield item

    return handle


async def _check_common(request, context: grpc.aio.ServicerContext) -> None:
    if request.protocol_version != pb.PROTOCOL_VERSION_CURRENT:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"protocol_version {request.protocol_version} is not supported; this master speaks "
            f"{pb.PROTOCOL_VERSION_CURRENT}",
        )
    problem = worker_id_problem(request.worker_id)
    if problem is not None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)


async def _checked_task_ids(request, context: grpc.aio.ServicerContext) -> list[str]:
    if len(request.task_ids) > MAX_TASK_IDS_PER_CALL:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"at most {MAX_TASK_IDS_PER_CALL} task_ids per call, got {len(request.task_ids)}",
        )
    task_ids = list(request.task_ids)
    for task_id in task_ids:
        if not task_id or len(task_id) > MAX_ID_LENGTH:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"task_id must be 1-{MAX_ID_LENGTH} characters, got {task_id[:80]!r}",
            )
    return task_ids


def _extras_problem(
    result: pb.TaskResult, task_id: str, error: str, episodes: int, template: TaskTemplate
) -> str | None:
    """Why a result's behaviours or observation sums (bounded by the run's sizes) are refused."""
    if error:
        return None
    name = task_id[:80]
    expected = episodes * template.behaviour_size
    if len(result.behaviours) != expected:
        return (
            f"task {name}: {len(result.behaviours)} behaviour values, the run expects "
            f"{template.behaviour_size} per episode x {episodes} episodes"
        )
    if expected:
        values = np.array(result.behaviours, dtype=np.float32)
        if not np.all(np.isfinite(values)):
            return f"task {name}: behaviour values must be finite"
        bounds = template.behaviour_range
        if bounds is not None and not np.all((values >= bounds[0]) & (values <= bounds[1])):
            outside = values[(values < bounds[0]) | (values > bounds[1])][0]
            return (
                f"task {name}: behaviour value {float(outside)!r} is outside this env's "
                f"[{bounds[0]:g}, {bounds[1]:g}]"
            )
    has_sums = result.HasField("observation_sums")
    if not template.observation_size:
        return f"task {name}: observation sums in a run without normalisation" if has_sums else None
    sums = result.observation_sums
    size = template.observation_size
    if not has_sums or len(sums.sum) != size or len(sums.sum_of_squares) != size:
        return (
            f"task {name}: the run needs observation sums of {size} values, got "
            f"{len(sums.sum)} and {len(sums.sum_of_squares)}"
        )
    count = sums.count
    # One observation per agent step and reset: at most frames + episodes of them.
    if not (math.isfinite(count) and 1 <= count <= result.frames + episodes):
        return f"task {name}: observation count {count} is not in [1, frames + episodes]"
    # Frames are the worker's word; the step limit is the master's own (the run's cap or the
    # env's time limit), so no result weighs more than its episodes could.
    most = template.observation_count_limit * episodes
    if most and count > most:
        return (
            f"task {name}: observation count {count} is more than {episodes} episode(s) of at "
            f"most {template.observation_count_limit} observations have"
        )
    total, squares = np.array(sums.sum), np.array(sums.sum_of_squares)
    if not (np.all(np.isfinite(total)) and np.all(np.isfinite(squares)) and np.all(squares >= 0)):
        return f"task {name}: observation sums must be finite, sums of squares >= 0"
    # Cauchy-Schwarz: sum^2 <= count * sum of squares for any real observations.
    with np.errstate(over="ignore"):  # a square past float64 is inf, which is refused too
        impossible = np.any(np.square(total) > count * squares * (1 + 1e-9) + 1e-9)
    if impossible:
        return f"task {name}: observation sums no set of observations could have"
    try:
        # The magnitudes every normaliser stays finite within, whatever sums join these.
        ObservationStats(count, total, squares)
    except ValueError as error:
        return f"task {name}: {error}"
    return None


def _result_problem(
    result: pb.TaskResult, task_id: str, error: str, returns: tuple[float, ...]
) -> str | None:
    """Why a reported result (whose fields named here are already read) cannot be recorded."""
    if not task_id or len(task_id) > MAX_ID_LENGTH:
        return f"task_id must be 1-{MAX_ID_LENGTH} characters, got {task_id[:80]!r}"
    if error:
        return None
    if not returns:
        return f"task {task_id[:80]}: no episode_returns and no error"
    for value in returns:
        if not math.isfinite(value):
            return f"task {task_id[:80]}: episode return {value!r} is not finite"
        if abs(value) > MAX_EPISODE_RETURN:
            return (
                f"task {task_id[:80]}: episode return {value!r} is beyond "
                f"+-{MAX_EPISODE_RETURN:.0f} (2**53), more than any env scores"
            )
        if value == 0.0 and math.copysign(1.0, value) < 0:
            # A sum of rewards that starts at 0.0 is never -0.0; only a broken client sends it.
            return f"task {task_id[:80]}: episode return {value!r} is negative zero"
    frames = tuple(result.episode_frames)
    if len(frames) != len(returns):
        return (
            f"task {task_id[:80]}: {len(returns)} episode_returns but {len(frames)} episode_frames"
        )
    longest = max(frames, default=0)
    if longest > MAX_EPISODE_FRAMES:
        return f"task {task_id[:80]}: episode_frames {longest} > {MAX_EPISODE_FRAMES}"
    if sum(frames) != result.frames:
        return f"task {task_id[:80]}: frames {result.frames} != sum of episode_frames {sum(frames)}"
    return None
