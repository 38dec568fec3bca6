"""A worker that fails its tasks, and presence calls that end while their worker lives on: the
other workers' tasks are neither failed nor spent; driven with an explicit clock, no network."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable

from master.algorithms.ga import EvaluationRequest, Genome
from master.fleet.fleet import Fleet
from master.fleet.leases import Disposition
from master.fleet.phases import FleetSettings, PhaseOutcome, TaskOutcome
from master.fleet.roster import (
    FAILURES_BEFORE_HOLD_OFF,
    HOLD_OFF_S,
    MAX_HOLD_OFF_S,
    WORKER_SEEN_WINDOW_S,
    WorkerRoster,
)
from master.fleet.service import with_worker_status
from master.observe.status import format_status
from neuro.v1 import evolution_pb2 as pb
from tests.support.clock import Clock

LEASE_S = 60.0
OOM = "RuntimeError: CUDA out of memory"


def run_phase(
    scenario: Callable[[Fleet, Clock], Awaitable[None]], tasks: int, max_attempts: int = 5
) -> PhaseOutcome:
    """Runs scenario(fleet, clock) while a phase of `tasks` one-episode requests is open; the
    phase's outcome (the scenario must finish it)."""
    clock = Clock()
    settings = FleetSettings(run_id="r", run_seed=1, lease_seconds=LEASE_S,
                             max_attempts=max_attempts)  # fmt: skip
    fleet = Fleet(settings, clock)

    async def main() -> PhaseOutcome:
        requests = [EvaluationRequest(f"k{i}", Genome((i + 1,)), 1) for i in range(tasks)]
        phase = asyncio.ensure_future(fleet.evaluate(requests))
        await asyncio.sleep(0)
        try:
            await scenario(fleet, clock)
            return await asyncio.wait_for(phase, 5.0)
        finally:
            phase.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await phase

    return asyncio.run(main())


def done(task_id: str) -> TaskOutcome:
    return TaskOutcome(task_id, [1.0], 10)


def failed(task_id: str) -> TaskOutcome:
    return TaskOutcome(task_id, [], 0, error=OOM)


# -- the roster: failures counted, a worker that fails everything held off --------------------


def test_a_worker_failing_everything_while_others_succeed_is_held_off_then_tried_again():
    roster = WorkerRoster()
    for worker in ("good", "bad"):
        roster.seen(worker, 0.0)
    roster.credit("good", 1, 10, 0.0)
    for _ in range(FAILURES_BEFORE_HOLD_OFF - 1):
        assert roster.failed("bad", 1.0) == 0.0
    assert not roster.held_off("bad", 1.0)
    assert roster.failed("bad", 1.0) == HOLD_OFF_S
    assert roster.held_off("bad", 1.0 + HOLD_OFF_S - 0.1)
    assert not roster.held_off("bad", 1.0 + HOLD_OFF_S)  # tried again
    roster.credit("good", 1, 10, 1.0 + HOLD_OFF_S)
    # One more failure and it is held off again, twice as long, up to MAX_HOLD_OFF_S.
    assert roster.failed("bad", 1.0 + HOLD_OFF_S) == 2 * HOLD_OFF_S
    [bad, good] = roster.snapshot(1.0 + HOLD_OFF_S, lambda task_id: None)
    assert (bad.worker_id, bad.tasks_failed, bad.held_off_s) == (
        "bad", FAILURES_BEFORE_HOLD_OFF + 1, 2 * HOLD_OFF_S,
    )  # fmt: skip
    assert (good.tasks_failed, good.held_off_s) == (0, 0.0)
    now = 1.0 + HOLD_OFF_S
    for _ in range(10):
        roster.credit("good", 1, 10, now)
        assert roster.failed("bad", now) <= MAX_HOLD_OFF_S
    # An accepted result ends the streak.
    roster.credit("bad", 1, 10, now)
    assert roster.failed("bad", now) == 0.0


def test_a_whole_fleet_failing_is_held_off_nowhere():
    roster = WorkerRoster()
    roster.seen("a", 0.0)
    roster.seen("b", 0.0)
    roster.credit("b", 1, 10, 0.0)
    later = WORKER_SEEN_WINDOW_S + 1.0  # nobody's result was accepted in the last window
    for _ in range(3 * FAILURES_BEFORE_HOLD_OFF):
        assert roster.failed("a", later) == 0.0
    assert not roster.held_off("a", later)


# -- the fleet: a failing worker beside a healthy one ------------------------------------------


def test_a_worker_that_fails_every_task_costs_the_healthy_worker_nothing():
    """The issue's reproduction: one healthy worker holds every task and heartbeats, another
    fails every task (or copy) it is given; nothing is failed, no result is turned away."""

    async def scenario(fleet: Fleet, clock: Clock) -> None:
        held = [task.task_id for task in fleet.lease("good", 4)]
        assert len(held) == 4
        copies = 0
        for step in range(40):  # the bad worker asks again and again, failing each copy
            clock.now = step * 0.05
            fleet.heartbeat("good", held)
            for task in fleet.lease("bad", 1):
                [ack] = fleet.report_many("bad", [failed(task.task_id)])
                assert ack is Disposition.ACCEPTED
                copies += 1
        assert copies == 4  # one copy of each task, never the same one twice
        acks = fleet.report_many("good", [done(task_id) for task_id in held])
        assert acks == [Disposition.ACCEPTED] * 4

    outcome = run_phase(scenario, tasks=4)
    assert outcome.returns == {f"k{i}": [1.0] for i in range(4)}


def test_tasks_the_failing_worker_failed_go_to_the_healthy_one_and_it_is_held_off():
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        [first] = fleet.lease("good", 1)
        assert fleet.report_many("good", [done(first.task_id)]) == [Disposition.ACCEPTED]
        fleet.lease("good", 1)  # it holds a task: it can take another after this one
        given: list[str] = []
        for _ in range(FAILURES_BEFORE_HOLD_OFF):
            [task] = fleet.lease("bad", 1)
            given.append(task.task_id)
            fleet.report_many("bad", [failed(task.task_id)])
        assert len(set(given)) == FAILURES_BEFORE_HOLD_OFF  # never a task it failed
        assert fleet.lease("bad", 4) == []  # held off
        bad = next(w for w in fleet.worker_stats() if w.worker_id == "bad")
        assert (bad.tasks_failed, bad.held_off_s) == (FAILURES_BEFORE_HOLD_OFF, HOLD_OFF_S)
        status = with_worker_status(pb.StatusResponse(workers=2), fleet.worker_stats())
        shown = format_status(status)
        row = next(line for line in shown.splitlines() if line.startswith("bad "))
        assert f"{FAILURES_BEFORE_HOLD_OFF}  held off {HOLD_OFF_S:.0f} s" in row, shown
        clock.now = 1.0
        rest = fleet.lease("good", 100)
        assert set(given) <= {task.task_id for task in rest}
        fleet.report_many("good", [done(task.task_id) for task in rest])
        held = fleet.tasks_leased_to("good")
        fleet.report_many("good", [done(task_id) for task_id in held])

    outcome = run_phase(scenario, tasks=2 * FAILURES_BEFORE_HOLD_OFF)
    assert outcome.returns == {f"k{i}": [1.0] for i in range(2 * FAILURES_BEFORE_HOLD_OFF)}


def test_alone_a_failing_worker_retries_its_tasks_and_the_phase_ends():
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        for _ in range(5 * 2):
            for task in fleet.lease("only", 2):
                fleet.report_many("only", [failed(task.task_id)])

    outcome = run_phase(scenario, tasks=2, max_attempts=5)
    assert all(math.isnan(r) for returns in outcome.returns.values() for r in returns)


# -- presence calls that end while their worker lives on ----------------------------------------


def test_presence_calls_ending_under_a_live_worker_spend_none_of_its_tasks():
    """The issue's reproduction: five open/cancel cycles of Attach under a healthy worker's id
    dropped two of its tasks as failed evaluations."""

    async def scenario(fleet: Fleet, clock: Clock) -> None:
        held = [task.task_id for task in fleet.lease("w1", 2)]
        for cycle in range(5):
            token = fleet.attach("w1")
            assert token is not None
            fleet.detach("w1", token)
            clock.now = cycle + 0.5
            assert fleet.heartbeat("w1", held) == []  # it takes its tasks back
        assert fleet.report_many("w1", [done(t) for t in held]) == [Disposition.ACCEPTED] * 2

    outcome = run_phase(scenario, tasks=2, max_attempts=2)
    assert outcome.returns == {"k0": [1.0], "k1": [1.0]}
