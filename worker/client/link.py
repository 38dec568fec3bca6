"""The link thread: the worker's calls to the master. It leases ahead, fetches ES parameters,
reports results, heartbeats while tasks run, reconnects with backoff and hands back on stop."""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import numpy as np

from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from neuro.wire import MAX_ERROR_CHARS, MAX_TASK_ID_LENGTH, open_channel
from worker.client.held import HeldTasks
from worker.client.stats import WorkerCounters
from worker.client.wire import CALL_TIMEOUT_S, FIRST_BACKOFF_S, LeasedTask, back_off, leased_task
from worker.limits import MAX_PARAMS

log = logging.getLogger(__name__)
HEARTBEAT_MIN_S = 0.5
HEARTBEAT_MAX_S = 300.0
"""A heartbeat goes every quarter lease, kept in this range whatever the master says."""
HEARTBEAT_FALLBACK_S = 5.0
"""The interval when no held task names a usable lease_seconds."""
RETRY_AFTER_RANGE_S = (0.05, 60.0)
"""An empty lease's retry_after_ms, kept in this range: 0 would spin, 2**32 ms is 50 days."""
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}  # fmt: skip


def heartbeat_interval(lease_seconds: Iterable[float]) -> float:
    """Seconds between heartbeats for leases of these lengths (as the master sent them).

    A quarter of the shortest lease, within [HEARTBEAT_MIN_S, HEARTBEAT_MAX_S]: the value comes
    from the master, and NaN would stop heartbeats (and spin the link thread) while 0 would
    send thousands a second. Values that are not positive and finite are ignored.
    """
    usable = [s for s in lease_seconds if math.isfinite(s) and s > 0]
    if not usable:
        return HEARTBEAT_FALLBACK_S
    return min(max(min(usable) / 4.0, HEARTBEAT_MIN_S), HEARTBEAT_MAX_S)


class ParametersUnavailable(Exception):
    """The master no longer serves this parameter version (its update is over)."""


def fetch_parameters(
    stub: pb_grpc.EvolutionStub,
    worker_id: str,
    version: int,
    sha256: str,
    num_params: int | None = None,
    run_id: str = "",
) -> np.ndarray:
    """Streams one ES parameter version in chunks and checks it against its sha256.

    `num_params` (the task's values: parameters plus any observation statistics) fixes the
    size; the stream's declared size is checked against it and MAX_PARAMS values before anything
    accumulates. `run_id`: the run the version is of (a master may serve several).
    """
    request = pb.ParametersRequest(protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                                   worker_id=worker_id, version=version,
                                   run_id=run_id)  # fmt: skip
    data, total = bytearray(), None
    limit = 4 * MAX_PARAMS
    try:
        for chunk in stub.FetchParameters(request, timeout=CALL_TIMEOUT_S * 6):
            if chunk.offset != len(data) or chunk.version != version:
                raise ValueError(f"parameter chunk at {chunk.offset} out of order")
            if chunk.total_bytes > limit:
                raise ValueError(
                    f"parameters of version {version} declare {chunk.total_bytes} bytes, "
                    f"more than the limit of {limit}"
                )
            if num_params is not None and chunk.total_bytes != 4 * num_params:
                raise ValueError(
                    f"parameters of version {version} declare {chunk.total_bytes} bytes, "
                    f"the task's {num_params} parameters are {4 * num_params}"
                )
            if len(data) + len(chunk.data) > chunk.total_bytes:
                raise ValueError(
                    f"parameters of version {version} overrun their declared "
                    f"{chunk.total_bytes} bytes"
                )
            data += chunk.data
            total, digest = chunk.total_bytes, chunk.sha256
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.NOT_FOUND:
            raise ParametersUnavailable(error.details()) from None
        raise
    if total is None or len(data) != total or hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"parameters of version {version} arrived incomplete or altered")
    if digest != sha256:
        raise ParametersUnavailable(f"version {version} changed on the master")
    return np.frombuffer(bytes(data), dtype="<f4").astype(np.float32)


class MasterLink:
    """The link thread's calls, paced against each other: report first, then heartbeat, lease
    and the stats file when each is due; sleeps on the held tasks' Condition in between."""

    def __init__(
        self,
        address: str,
        worker_id: str,
        held: HeldTasks,
        stop: threading.Event,
        counters: WorkerCounters,
        evaluator: Any,
        give_up_after_s: float = 0.0,
        token: str | None = None,
        root_certificates: bytes | None = None,
        write_stats: Callable[[], object] | None = None,
        stats_interval_s: float = 5.0,
    ) -> None:
        self.address = address
        self.worker_id = worker_id
        self.give_up_after_s = give_up_after_s
        self._held = held
        self._stop = stop
        self._counters = counters
        self._evaluator = evaluator
        """Holds the ES parameter versions fetched here (has_parameters, set_parameters)."""
        self._token = token  # private and out of any repr: it must never reach a log line
        self._root_certificates = root_certificates
        self._write_stats = write_stats
        self._stats_interval_s = stats_interval_s

    def run(self) -> None:
        """The thread's body: returns once it has handed back on stop, or the worker failed."""
        channel = open_channel(self.address, self._token, self._root_certificates)
        stub = pb_grpc.EvolutionStub(channel)
        held, write_stats = self._held, self._write_stats
        backoff = FIRST_BACKOFF_S
        unavailable_since: float | None = None
        next_lease = next_heartbeat = next_stats = 0.0
        try:
            while True:
                stopping = self._stop.is_set()
                try:
                    if stopping:
                        self._settle_current()
                    if self.report(stub) and held.idle():
                        # It just ran out of work: ask now, not when an earlier empty lease
                        # said to (the master keeps a phase's last tasks for idle workers).
                        next_lease = 0.0
                    if stopping:
                        self.hand_back(stub)
                        return
                    self.give_back_refused(stub)
                    now = time.monotonic()
                    if now >= next_heartbeat:
                        next_heartbeat = now + self.heartbeat(stub)
                    if now >= next_lease and self._room() > 0:
                        next_lease = now + self.lease(stub)
                    if write_stats is not None and now >= next_stats:
                        write_stats()
                        next_stats = now + self._stats_interval_s
                    backoff, unavailable_since = FIRST_BACKOFF_S, None
                except grpc.RpcError as error:
                    if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                        # Retrying cannot fix a token; exit so the operator sees it at once.
                        held.fail(
                            "master refused the token (UNAUTHENTICATED): check --token-file, "
                            "NEURO_TOKEN_FILE or NEURO_TOKEN"
                        )
                        return
                    if error.code() not in _RETRYABLE:
                        held.fail(f"master refused: {error.code().name}: {error.details()}")
                        return
                    now = time.monotonic()
                    unavailable_since = unavailable_since or now
                    if self.give_up_after_s and now - unavailable_since > self.give_up_after_s:
                        held.fail(
                            f"master {self.address} unreachable for {self.give_up_after_s:.0f}s"
                        )
                        return
                    if stopping:
                        return  # nobody to hand tasks back to; their leases will lapse
                    self._counters.reconnects += 1
                    log.info(
                        "master unavailable (%s); retrying in %.1fs", error.code().name, backoff
                    )
                    backoff = back_off(self._stop, backoff)
                    continue
                with held.wake:
                    deadline = min(
                        next_heartbeat, next_stats if write_stats is not None else next_heartbeat
                    )
                    if held.room() > 0:
                        deadline = min(deadline, next_lease)
                    timeout = deadline - time.monotonic()
                    if not self._stop.is_set() and not held.outbox and timeout > 0:
                        held.wake.wait(timeout)
        finally:
            channel.close()

    def _room(self) -> int:
        with self._held.wake:
            return self._held.room()

    def _settle_current(self) -> None:
        """On stop, let the main thread abandon (or finish) its episode before handing back."""
        held = self._held
        deadline = time.monotonic() + CALL_TIMEOUT_S
        with held.wake:
            while held.running and time.monotonic() < deadline:
                held.wake.wait(0.05)

    def report(self, stub: pb_grpc.EvolutionStub) -> bool:
        """Reports what finished; True if there was anything."""
        held = self._held
        with held.wake:
            batch = list(held.outbox)
        if not batch:
            return False
        request = pb.ReportRequest(
            protocol_version=pb.PROTOCOL_VERSION_CURRENT, worker_id=self.worker_id, results=batch
        )
        try:
            stub.Report(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            # Retrying the same bytes cannot help; the master re-issues the tasks.
            log.error("master rejected results: %s", error.details())
        with held.wake:
            del held.outbox[: len(batch)]
        return True

    def lease(self, stub: pb_grpc.EvolutionStub) -> float:
        """Tops up the inbox; returns seconds until the next lease attempt."""
        held = self._held
        with held.wake:
            wanted = held.room()
            unsupported = sorted(held.unsupported_envs)
            refusal = held.refusal
        if wanted <= 0:
            return 0.0
        request = pb.LeaseRequest(
            protocol_version=pb.PROTOCOL_VERSION_CURRENT,
            worker_id=self.worker_id,
            max_tasks=wanted,
            unsupported_env_ids=unsupported,
        )
        if refusal is not None:
            run_id, reason = refusal
            request.refusal.run_id, request.refusal.reason = run_id, reason[:MAX_ERROR_CHARS]
        reply = stub.Lease(request, timeout=CALL_TIMEOUT_S)
        # Converted once, here: nothing past this holds the wire's Task.
        tasks = [leased_task(task) for task in self._acceptable(reply.tasks, wanted)]
        tasks = self._with_parameters(stub, tasks)
        with held.wake:
            held.inbox.extend(tasks)
            held.run_complete = reply.run_complete
            held.wake.notify_all()
        if reply.tasks:
            return 0.0
        low, high = RETRY_AFTER_RANGE_S
        return min(max(reply.retry_after_ms / 1000.0, low), high)

    def _acceptable(self, tasks: Any, wanted: int) -> list[pb.Task]:
        """The granted tasks this worker takes on; the others' leases lapse on the master."""
        kept = []
        for task in tasks:
            if len(kept) == wanted:
                # More than asked for: holding them would only delay them.
                log.warning("worker %s: master granted %d tasks, %d asked; extra ones skipped",
                            self.worker_id, len(tasks), wanted)  # fmt: skip
                break
            if len(task.task_id) > MAX_TASK_ID_LENGTH:
                # Every report naming it would exceed what the master accepts, and be resent
                # forever.
                log.warning("worker %s: task id of %d characters skipped", self.worker_id,
                            len(task.task_id))  # fmt: skip
                continue
            kept.append(task)
        return kept

    def _with_parameters(
        self, stub: pb_grpc.EvolutionStub, tasks: list[LeasedTask]
    ) -> list[LeasedTask]:
        """ES tasks whose parameter version is here (fetched once per version); others as is."""
        kept = []
        for task in tasks:
            wanted = task.parameters
            if wanted is not None and not self._evaluator.has_parameters(
                wanted.version, wanted.run_id
            ):
                try:
                    theta = fetch_parameters(stub, self.worker_id, wanted.version, wanted.sha256,
                                             wanted.values, wanted.run_id)  # fmt: skip
                except ParametersUnavailable:
                    continue  # a finished update: the master no longer wants this task
                except ValueError as error:
                    # A damaged transfer must not end the worker: the lease lapses and the
                    # master re-issues the task, to this worker or another.
                    log.warning("worker %s: %s; task %s skipped", self.worker_id, error,
                                task.task_id)  # fmt: skip
                    continue
                self._evaluator.set_parameters(wanted.version, theta, wanted.run_id)
            kept.append(task)
        return kept

    def heartbeat(self, stub: pb_grpc.EvolutionStub) -> float:
        """Extends held leases; returns seconds until the next heartbeat."""
        held = self._held
        with held.wake:
            tasks = held.held_tasks()
        if not tasks:
            return 1.0
        reply = stub.Heartbeat(
            pb.HeartbeatRequest(
                protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                worker_id=self.worker_id,
                task_ids=[t.task_id for t in tasks],
            ),
            timeout=CALL_TIMEOUT_S,
        )
        dropped = set(reply.dropped_task_ids)
        if dropped or reply.run_complete:
            with held.wake:
                held.inbox = deque(t for t in held.inbox if t.task_id not in dropped)
                held.cancelled.extend(t for t in dropped if t in held.running)
                held.run_complete = held.run_complete or reply.run_complete
                held.wake.notify_all()
        return heartbeat_interval(t.lease_seconds for t in tasks)

    def give_back_refused(self, stub: pb_grpc.EvolutionStub) -> None:
        """Releases the tasks of a run this worker refuses, so the master re-issues them now."""
        held = self._held
        with held.wake:
            task_ids = list(held.abandoned)
        if not task_ids:
            return
        stub.Release(
            pb.ReleaseRequest(
                protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                worker_id=self.worker_id,
                task_ids=task_ids,
            ),
            timeout=CALL_TIMEOUT_S,
        )
        with held.wake:  # handed back: a failed call keeps them for the next try
            del held.abandoned[: len(task_ids)]

    def hand_back(self, stub: pb_grpc.EvolutionStub) -> None:
        """Releases every task held, waiting or abandoned, so the master re-issues it at once."""
        held = self._held
        with held.wake:
            task_ids = [t.task_id for t in held.inbox] + held.abandoned + list(held.running)
            held.inbox.clear()
            held.abandoned = []
        if task_ids:
            stub.Release(
                pb.ReleaseRequest(
                    protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                    worker_id=self.worker_id,
                    task_ids=task_ids,
                ),
                timeout=CALL_TIMEOUT_S,
            )
            log.info("handed back %d task(s)", len(task_ids))
