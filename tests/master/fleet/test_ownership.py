"""Every result from its holder: lease ownership, and bounded input on both sides.

The fleet and the lease table are driven with an explicit clock; the edge is checked against a
real grpc.aio master on loopback. The worker's side (what it takes from a master and what it
sends back) is tests/worker/test_link.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from master.algorithms.ga import EvaluationRequest, Genome
from master.fleet.fleet import Fleet
from master.fleet.leases import Disposition
from master.fleet.pacing import IDLE_POLLS_PER_S
from master.fleet.phases import FleetSettings, PhaseOutcome, TaskOutcome
from master.fleet.roster import WorkerRoster
from master.observe.status import format_status
from neuro.observation_stats import ObservationStats
from neuro.v1 import evolution_pb2 as pb
from neuro.v1 import evolution_pb2_grpc as pb_grpc
from tests.support.clock import Clock
from tests.support.harness import live_master
from tests.support.tiny import tiny_cartpole

ACCEPTED = Disposition.ACCEPTED
LEASE_S = 10.0
CALL_S = 5.0
CURRENT = pb.PROTOCOL_VERSION_CURRENT
POPULATION = 6
TINY = {"generations": 1, "population_size": POPULATION, "truncation": 2,
        "elite_candidates": 2, "elite_episodes": 2, "target_score": None}  # fmt: skip
ERROR_CHARS, WORKERS_TRACKED, STATUS_WORKERS = 512, 4096, 256
"""The bounds the issue asks for: kept error text, remembered workers, Status's worker list."""


def run_phase(
    scenario: Callable[[Fleet, Clock], Awaitable[None]], tasks: int = 4, **settings: Any
) -> PhaseOutcome | None:
    """Opens one phase of `tasks` one-episode requests k0..., runs the scenario against it.

    Returns the phase's outcome if the scenario finished the phase, else None.
    """
    clock = Clock()
    fleet = Fleet(FleetSettings(run_id="r", run_seed=1, lease_seconds=LEASE_S, **settings), clock)

    async def main() -> PhaseOutcome | None:
        requests = [EvaluationRequest(f"k{i}", Genome((i + 1,)), 1) for i in range(tasks)]
        phase = asyncio.ensure_future(fleet.evaluate(requests))
        await asyncio.sleep(0)
        try:
            await scenario(fleet, clock)
            counters = fleet.counters()
            if counters.pending + counters.leased > 0:
                return None
            return await asyncio.wait_for(phase, 1.0)
        finally:
            phase.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await phase

    return asyncio.run(main())


def done(task_id: str, score: float = 1.0) -> TaskOutcome:
    return TaskOutcome(task_id, (score,), 10)


def failed(task_id: str, error: str = "env exploded") -> TaskOutcome:
    return TaskOutcome(task_id, (), 0, error)


# -- 1. results count only from a worker the task was leased to -------------------------------


def test_a_result_counts_only_from_a_worker_the_task_was_leased_to() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        [task] = fleet.lease("holder", 1)
        # k0/0 is leased to another worker, k1/0 was never leased: both ids are guessable.
        forged = [done(task.task_id, 1e15), done("k1/0", 1e15)]
        assert ACCEPTED not in fleet.report_many("intruder", forged)
        assert fleet.counters().done == 0 and fleet.frames_accepted == 0
        assert fleet.report_many("holder", [done(task.task_id, 7.0)]) == [ACCEPTED]
        rest = fleet.lease("holder", 8)
        assert fleet.report_many("holder", [done(t.task_id) for t in rest]) == [ACCEPTED] * 3

    outcome = run_phase(scenario)
    assert outcome is not None
    assert outcome.returns == {"k0": [7.0], "k1": [1.0], "k2": [1.0], "k3": [1.0]}


def test_a_late_result_from_an_earlier_holder_of_a_reissued_task_counts() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        [task] = fleet.lease("slow", 1)
        clock.now = LEASE_S + 1
        assert [t.task_id for t in fleet.lease("fast", 1)] == [task.task_id]  # re-issued
        assert fleet.report_many("slow", [done(task.task_id, 3.0)]) == [ACCEPTED]
        assert fleet.report_many("fast", [done(task.task_id, 3.0)]) == [Disposition.DUPLICATE]

    run_phase(scenario, tasks=1)


def test_who_may_report_stays_bounded_through_lease_and_release_cycles() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        for i in range(200):
            [task] = fleet.lease(f"cycler-{i}", 1)
            assert fleet.release(f"cycler-{i}", [task.task_id]) == 1
        # A worker that handed the task back holds no claim on it.
        assert ACCEPTED not in fleet.report_many("cycler-7", [done("k0/0", 1e15)])
        [task] = fleet.lease("holder", 1)
        assert fleet.report_many("holder", [done(task.task_id, 2.0)]) == [ACCEPTED]
        record = fleet._phases.table._records["k0/0"]  # type: ignore[union-attr]
        assert len(record.holders) <= fleet.settings.max_attempts

    run_phase(scenario, tasks=1)


def test_forged_reports_over_grpc_are_not_accepted_and_never_scored(tmp_path: Path) -> None:
    async def scenario(stub: pb_grpc.EvolutionStub, master: Any, training: Any) -> None:
        run_id = master.trainer.fleet.settings.run_id
        # Guessed ids of both phases (offspring, elite re-evaluation), with an impossible score.
        guessed = [f"g0/o/{i}/0" for i in range(POPULATION)]
        guessed += [f"g0/e/{c}/{e}" for c in range(2) for e in range(2)]
        forged = [pb.TaskResult(task_id=task_id, run_id=run_id, episode_returns=[1e15],
                                episode_frames=[1], frames=1) for task_id in guessed]  # fmt: skip
        lease = pb.LeaseRequest(protocol_version=CURRENT, worker_id="holder", max_tasks=256)
        while not (response := await stub.Lease(lease, timeout=CALL_S)).run_complete:
            assert pb.RESULT_DISPOSITION_ACCEPTED not in await report(stub, "intruder", forged)
            honest = [result(t, 5.0) for t in response.tasks]
            acks = await report(stub, "holder", honest)
            assert acks == [pb.RESULT_DISPOSITION_ACCEPTED] * len(honest)
            await asyncio.sleep(0 if response.tasks else 0.005)
        [record] = await training
        assert (record.score_max, record.elite_score) == (5.0, 5.0)
        assert record.generation_evaluations == POPULATION + 2 * 2

    with_master(scenario, tmp_path)


def with_sums(task_id: str, count: float, squares: float = 0.0) -> TaskOutcome:
    observations = ObservationStats(count, np.zeros(3), np.full(3, squares))
    return TaskOutcome(task_id, (1.0,), 10, observations=observations)


def test_observation_sums_count_only_from_the_holder_and_never_overflow_the_phase() -> None:
    """Each count is finite; two of them are not. The second is refused whole, recording
    nothing, instead of failing the phase's sum (and the master) when the phase ends."""

    async def scenario(fleet: Fleet, clock: Clock) -> None:
        tasks = fleet.lease("holder", 8)
        assert fleet.report_many("intruder", [with_sums(tasks[0].task_id, 1e308)]) == [
            Disposition.REJECTED
        ]
        assert fleet.report_many("holder", [with_sums(tasks[0].task_id, 1e308)]) == [ACCEPTED]
        before = (fleet.counters(), fleet.frames_accepted, fleet.recorded())
        overflow = [with_sums(tasks[2].task_id, 1.0), with_sums(tasks[1].task_id, 1e308)]
        with pytest.raises(ValueError, match=f"task {tasks[1].task_id}: its observation sums"):
            fleet.report_many("holder", overflow)
        assert (fleet.counters(), fleet.frames_accepted, fleet.recorded()) == before
        rest = [with_sums(t.task_id, 5.0, 10.0) for t in tasks[1:]]
        assert fleet.report_many("holder", rest) == [ACCEPTED] * 3

    outcome = run_phase(scenario)
    assert outcome is not None and outcome.observations is not None
    assert outcome.observations.count == 1e308 + 15.0
    mean, std = outcome.observations.normaliser()
    assert np.isfinite(mean).all() and np.isfinite(std).all()


# -- 2. a failure counts once per lease, and only from its holder -----------------------------


def test_a_failure_counts_once_per_lease_and_only_from_its_holder() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        [task] = fleet.lease("holder", 1)
        # Five copies of one error in one batch, then the whole batch again (a resend).
        batch = [failed(task.task_id)] * 5
        assert fleet.report_many("holder", batch).count(ACCEPTED) == 1
        assert ACCEPTED not in fleet.report_many("holder", batch)
        # Errors for tasks the sender never held burn nothing, however many.
        for _ in range(10):
            assert ACCEPTED not in fleet.report_many("intruder", [failed("k0/0"), failed("k1/0")])
        assert fleet.counters().done == 0
        tasks = fleet.lease("holder", 2)
        assert sorted(t.task_id for t in tasks) == ["k0/0", "k1/0"]
        assert fleet.report_many("holder", [done(t.task_id, 4.0) for t in tasks]) == [ACCEPTED] * 2

    outcome = run_phase(scenario, tasks=2, max_attempts=5)
    assert outcome is not None and outcome.returns == {"k0": [4.0], "k1": [4.0]}


# -- 3. heartbeats extend only the caller's own leases ----------------------------------------


def test_a_share_of_the_pending_tasks_counts_the_workers_that_ask_for_work() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        for i in range(10):
            fleet.attach(f"watched{i}")  # present, but not asking: they share nothing
        fleet.heartbeat("beating", [])
        assert len(fleet.lease("a", 4)) == 4  # the only worker asking: all it asked for
        clock.now += 2  # the fleet is counted again (at most once a second)
        assert len(fleet.lease("b", 4)) == 2  # four left, two workers asking: two each

    run_phase(scenario, tasks=8)


def test_idle_workers_of_a_big_fleet_wait_longer_so_the_fleet_polls_at_a_bounded_rate() -> None:
    waits: dict[int, list[int]] = {}

    async def scenario(fleet: Fleet, clock: Clock) -> None:
        for size in (2, 4000, 20000):
            for i in range(size):
                fleet.lease(f"w{i}", 1)  # all but the first get nothing
            clock.now += 2  # counted again
            fleet.lease("w0", 1)
            waits[size] = [fleet.retry_after_ms() for _ in range(200)]

    run_phase(scenario, tasks=1)
    assert set(waits[2]) == {200}  # a small fleet: the configured wait, as before
    for size in (4000, 20000):
        mean_s = sum(waits[size]) / len(waits[size]) / 1000
        # About IDLE_POLLS_PER_S calls a second over the fleet, jittered (not all alike).
        assert size / mean_s == pytest.approx(IDLE_POLLS_PER_S, rel=0.15)
        assert len(set(waits[size])) > 50


def test_heartbeat_never_hands_out_a_task_the_caller_did_not_hold() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        [released, failing, lapsing] = fleet.lease("w", 3)
        # A heartbeat neither takes a pending task (k3) nor another worker's (k0).
        assert fleet.heartbeat("intruder", ["k3/0", "k0/0"]) == ["k3/0", "k0/0"]
        assert fleet.counters().leased == 3 and fleet._phases.table.holder("k0/0") == "w"
        fleet.release("w", [released.task_id])
        fleet.report_many("w", [failed(failing.task_id)])
        clock.now = LEASE_S + 1
        fleet._phases.expire()
        # Only the worker whose lease just lapsed may take its task back (it is still on it).
        dropped = fleet.heartbeat("w", [released.task_id, failing.task_id, lapsing.task_id])
        assert dropped == [released.task_id, failing.task_id]
        # Newcomers share the three pending tasks; k2 stays w's (a newcomer left idle may
        # get a backup copy of it, never its lease).
        honest = {t.task_id for i in range(3) for t in fleet.lease(f"honest{i}", 8)}
        assert lapsing.task_id == "k2/0" and honest - {"k2/0"} == {"k0/0", "k1/0", "k3/0"}
        assert fleet._phases.table.holder("k2/0") == "w"

    run_phase(scenario, tasks=4)


# -- 4. error text is bounded, few are kept, and they are logged ------------------------------


def test_error_text_is_bounded_few_are_kept_and_they_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    huge = "\x1b[2J" + "x" * (64 << 10)

    async def scenario(fleet: Fleet, clock: Clock) -> None:
        for i in range(40):
            [task] = fleet.lease(f"w{i}", 1)
            assert fleet.report_many(f"w{i}", [failed(task.task_id, huge)]) == [ACCEPTED]
        errors = fleet._phases.table.errors("k0/0")  # type: ignore[union-attr]
        assert 1 <= len(errors) <= 8
        assert all(len(error) <= ERROR_CHARS for error in errors)

    with caplog.at_level(logging.WARNING, logger="master.fleet"):
        run_phase(scenario, tasks=1, max_attempts=100)
    logged = [r.getMessage() for r in caplog.records if "k0/0" in r.getMessage()]
    assert logged and "w0" in logged[0]  # names the worker
    assert len(logged) <= 11  # rate-limited, not one line per failure
    assert all(len(line) <= 2 * ERROR_CHARS and "\x1b" not in line for line in logged)


# -- 5. the worker table and Status's worker list are bounded ---------------------------------


def test_the_worker_table_is_bounded_by_count_not_only_by_time() -> None:
    roster = WorkerRoster()
    for i in range(10_000):
        roster.seen(f"spot-{i}", 1.0 + i * 1e-3)  # all within a few seconds
    assert len(roster) <= WORKERS_TRACKED
    assert roster.connected(11.0, 60.0) == len(roster)


def test_status_lists_only_the_most_recent_workers_and_stays_small(tmp_path: Path) -> None:
    async def scenario(stub: pb_grpc.EvolutionStub, master: Any, training: Any) -> None:
        fleet = master.trainer.fleet
        for i in range(6000):
            fleet.heartbeat(f"spot-{i}", [])
        status = await stub.Status(pb.StatusRequest(), timeout=CALL_S)
        listed = {w.worker_id for w in status.worker_status}
        assert len(listed) <= STATUS_WORKERS and "spot-5999" in listed
        assert status.ByteSize() < 64 << 10
        assert status.workers_tracked == len(fleet.roster) <= WORKERS_TRACKED

    with_master(scenario, tmp_path)


# -- 6. worker ids are restricted at the edge and escaped in status ----------------------------

FAKE_LINE = "w\nrun complete  yes\x1b[2J"


@pytest.mark.parametrize(
    ("worker_id", "named"),
    [(FAKE_LINE, "'\\n'"), ("tab\there", "'\\t'"), ("caf\u00e9", "'\u00e9'"), ("a b", "' '"),
     ("x" * 257, "257")],
)  # fmt: skip
def test_worker_ids_outside_printable_ascii_are_refused(
    tmp_path: Path, worker_id: str, named: str
) -> None:
    async def scenario(stub: pb_grpc.EvolutionStub, master: Any, training: Any) -> None:
        calls = [
            stub.Lease(pb.LeaseRequest(protocol_version=CURRENT, worker_id=worker_id, max_tasks=1)),
            stub.Heartbeat(pb.HeartbeatRequest(protocol_version=CURRENT, worker_id=worker_id)),
            stub.Release(pb.ReleaseRequest(protocol_version=CURRENT, worker_id=worker_id)),
            stub.Report(pb.ReportRequest(protocol_version=CURRENT, worker_id=worker_id)),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "worker_id" in refused.value.details() and named in refused.value.details()
        assert len(master.trainer.fleet.roster) == 0

    with_master(scenario, tmp_path)


def test_status_escapes_what_it_cannot_print() -> None:
    status = pb.StatusResponse(run_id="r\x1b]0;", env_id="CartPole-v1", elite_score=math.nan)
    status.worker_status.add(worker_id=FAKE_LINE, tasks_leased=1)
    status.worker_status.add(worker_id="good-1")
    text = format_status(status)
    assert "\x1b" not in text
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("run complete")] == ["run complete  no"]
    assert any(line.startswith("w\\nrun complete  yes\\x1b[2J") for line in lines)


# -- helpers: a real master on loopback -----------------------------------------------------


def with_master(
    scenario: Callable[[pb_grpc.EvolutionStub, Any, Any], Awaitable[None]], tmp_path: Path
) -> None:
    """Runs scenario(stub, master, training) against a fresh master, bounded in time."""

    async def main() -> None:
        async with live_master(tiny_cartpole(**TINY), tmp_path / "run") as live:
            await asyncio.wait_for(scenario(live.stub(), live.master, live.training), 30)

    asyncio.run(main())


def result(task: pb.Task, score: float) -> pb.TaskResult:
    episodes = task.episodes
    return pb.TaskResult(
        task_id=task.task_id,
        run_id=task.run_id,
        episode_returns=[score] * episodes,
        episode_frames=[10] * episodes,
        frames=10 * episodes,
    )


async def report(stub: pb_grpc.EvolutionStub, worker: str, results: list) -> list[int]:
    request = pb.ReportRequest(protocol_version=CURRENT, worker_id=worker, results=results)
    response = await stub.Report(request, timeout=CALL_S)
    return [ack.disposition for ack in response.acks]


# -- found in review: bounded calls, bounded bookkeeping, what the worker takes -----------------


@pytest.mark.parametrize("method", ["Heartbeat", "Release", "Report"])
def test_one_call_names_a_bounded_number_of_tasks(tmp_path: Path, method: str) -> None:
    async def scenario(stub: pb_grpc.EvolutionStub, master: Any, training: Any) -> None:
        ids = [f"t{i}" for i in range(5000)]
        common = {"protocol_version": CURRENT, "worker_id": "w"}
        if method == "Report":
            results = [pb.TaskResult(task_id=t, error="e") for t in ids]
            call = stub.Report(pb.ReportRequest(**common, results=results), timeout=CALL_S)
        else:
            request_type = getattr(pb, f"{method}Request")
            call = getattr(stub, method)(request_type(**common, task_ids=ids), timeout=CALL_S)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "5000" in refused.value.details()

    with_master(scenario, tmp_path)


def test_heartbeats_in_a_tight_loop_do_not_grow_the_lease_bookkeeping() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        [task] = fleet.lease("w", 1)
        for step in range(10_000):
            clock.now = step * 1e-4  # one second of heartbeats, 10,000 a second
            assert fleet.heartbeat("w", [task.task_id]) == []
        table = fleet._phases.table
        assert table is not None and len(table._deadlines) <= 2 + 1 / (0.1 * LEASE_S)
        clock.now = 2.0
        fleet.heartbeat("w", [task.task_id])  # a heartbeat at the usual pace still extends
        clock.now = LEASE_S + 1.0
        fleet._phases.expire()
        assert table.holder(task.task_id) == "w"

    run_phase(scenario, tasks=1)


def test_the_master_waits_only_for_workers_not_yet_told_and_only_for_a_while() -> None:
    ticks = iter(range(10**6))
    fleet = Fleet(FleetSettings(run_id="r", run_seed=1, lease_seconds=8.0), lambda: next(ticks))
    fleet.lease("told", 1)
    fleet.complete_run()
    assert fleet.tell_complete("told")
    asyncio.run(asyncio.wait_for(fleet.linger(poll_s=0), 1.0))  # nobody left to tell
    started = next(ticks)
    fleet.heartbeat("busy", [])  # seen, not told yet
    asyncio.run(asyncio.wait_for(fleet.linger(poll_s=0), 1.0))
    waited = next(ticks) - started
    assert fleet.completion_grace_s - 2 <= waited <= fleet.completion_grace_s + 3
