"""What the link thread takes from a master and sends back: it does not trust lease_seconds, takes
only the tasks it asked for, asks within the master's bound, and bounds what it says about
failures."""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any

import pytest

from neuro.v1 import evolution_pb2 as pb
from neuro.wire import MAX_TASKS_PER_LEASE
from worker.client import WorkerClient
from worker.client.held import HeldTasks
from worker.client.link import MasterLink
from worker.client.stats import WorkerCounters
from worker.client.wire import leased_task
from worker.play.envs import EnvBuildError


def _link(held: HeldTasks) -> MasterLink:
    """A link to no master: each test hands its calls a stub."""
    return MasterLink("127.0.0.1:1", "w", held, threading.Event(), WorkerCounters(), None)


class _LeaseStub:
    def __init__(self, response: pb.LeaseResponse) -> None:
        self.response = response
        self.requests: list[pb.LeaseRequest] = []

    def Lease(self, request: pb.LeaseRequest, timeout: float) -> pb.LeaseResponse:
        self.requests.append(request)
        return self.response


@pytest.mark.parametrize("lease_seconds", [math.nan, 0.0, -5.0, math.inf, 1e300, 1e-9])
def test_heartbeat_pacing_ignores_absurd_lease_seconds(lease_seconds: float) -> None:
    class Stub:
        calls = 0

        def Heartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> Any:
            Stub.calls += 1
            return pb.HeartbeatResponse()

    held = HeldTasks(slots=1, prefetch=1, batched=False)
    held.inbox.append(leased_task(pb.Task(task_id="t", lease_seconds=lease_seconds)))
    interval = _link(held).heartbeat(Stub())  # type: ignore[arg-type]
    assert Stub.calls == 1
    assert math.isfinite(interval) and 0.5 <= interval <= 300.0


def test_a_heartbeat_drops_what_the_master_took_back() -> None:
    class Stub:
        def Heartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> Any:
            return pb.HeartbeatResponse(dropped_task_ids=["waiting", "running"])

    held = HeldTasks(slots=2, prefetch=1, batched=False)
    for task_id in ("waiting", "kept"):
        held.inbox.append(leased_task(pb.Task(task_id=task_id)))
    held.running["running"] = leased_task(pb.Task(task_id="running"))
    _link(held).heartbeat(Stub())  # type: ignore[arg-type]
    # A waiting task is forgotten at once; a running one is the main thread's to abandon.
    assert [t.task_id for t in held.inbox] == ["kept"] and held.cancelled == ["running"]


def test_the_worker_takes_only_what_it_asked_for_and_paces_empty_leases() -> None:
    held = HeldTasks(slots=1, prefetch=1, batched=False)
    link = _link(held)
    tasks = [pb.Task(task_id="x" * 300, run_id="r")]
    tasks += [pb.Task(task_id=f"t{i}", run_id="r") for i in range(5)]
    stub = _LeaseStub(pb.LeaseResponse(tasks=tasks))
    assert link.lease(stub) == 0.0  # type: ignore[arg-type]
    assert stub.requests[0].max_tasks == 2
    assert [t.task_id for t in held.inbox] == ["t0", "t1"]
    held.inbox.clear()
    for retry_after_ms, expected in ((2**32 - 1, 60.0), (0, 0.05)):
        empty = _LeaseStub(pb.LeaseResponse(retry_after_ms=retry_after_ms))
        assert link.lease(empty) == expected  # type: ignore[arg-type]


def test_a_batched_worker_of_more_env_slots_than_one_lease_allows_asks_within_the_bound() -> None:
    # A GPU worker's --envs may exceed what one Lease may ask for; the master refuses a
    # request over the bound (INVALID_ARGUMENT), which would stop the worker before its first task.
    held = HeldTasks(slots=MAX_TASKS_PER_LEASE + 44, prefetch=1, batched=True)
    stub = _LeaseStub(pb.LeaseResponse())
    _link(held).lease(stub)  # type: ignore[arg-type]
    assert stub.requests[0].max_tasks == MAX_TASKS_PER_LEASE


def test_the_worker_bounds_what_it_sends_about_failures() -> None:
    """Each task whose env cannot be built is reported with a bounded error, and the next lease
    names a bounded number of the envs that failed here, the latest among them."""
    client = WorkerClient("127.0.0.1:1", "w", evaluator=None)  # type: ignore[arg-type]

    class Runner:
        def start(self, task_id: str, spec: Any) -> None:
            raise EnvBuildError("cannot build: " + "y" * (1 << 20))

    for i in range(100):
        task = pb.Task(task_id=f"t{i}", run_id="r", episodes=1, env=pb.EnvSpec(env_id=f"Env{i}-v0"),
                       genome=pb.Genome(noise_table=pb.NoiseTableSpec(size=2**16)))  # fmt: skip
        leased = leased_task(task)
        assert leased.spec is not None, leased.refusal
        with contextlib.suppress(Exception):
            client._start(Runner(), leased)
    assert len(client.held.outbox) == 100
    assert all(0 < len(result.error) <= 512 for result in client.held.outbox)
    assert client.counters.tasks_failed == 100
    stub = _LeaseStub(pb.LeaseResponse())
    _link(client.held).lease(stub)  # type: ignore[arg-type]
    named = list(stub.requests[0].unsupported_env_ids)
    assert len(named) <= 16 and "Env99-v0" in named
