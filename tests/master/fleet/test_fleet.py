"""The Fleet's methods for the loop above it: counters restored, the run completed, its
figures, and whose leases are whose; driven with an explicit clock, no network."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from master.algorithms.ga import EvaluationRequest, Genome
from master.fleet.fleet import Fleet
from master.fleet.leases import Disposition, LeaseCounters
from master.fleet.phases import FleetSettings, TaskOutcome
from master.fleet.presence import Presence
from tests.support.clock import Clock

LEASE_S = 10.0


def during_a_phase(
    scenario: Callable[[Fleet, Clock], Awaitable[None]], tasks: int = 3, reissued: int = 0
) -> Fleet:
    """Runs scenario(fleet, clock) while a phase of `tasks` one-episode requests is open, on a
    fleet whose count of re-issued leases was restored to `reissued` (as on a resume)."""
    clock = Clock()
    fleet = Fleet(FleetSettings(run_id="r", run_seed=1, lease_seconds=LEASE_S), clock)
    fleet.restore_counters(leases_reissued=reissued)

    async def main() -> None:
        requests = [EvaluationRequest(f"k{i}", Genome((i + 1,)), 1) for i in range(tasks)]
        phase = asyncio.ensure_future(fleet.evaluate(requests))
        await asyncio.sleep(0)
        try:
            await scenario(fleet, clock)
        finally:
            phase.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await phase

    asyncio.run(main())
    return fleet


def test_restored_counters_continue_a_resumed_runs_count_of_reissued_leases() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        assert fleet.counters() == LeaseCounters(3, 0, 0, 7)
        [task] = fleet.lease("slow", 1)
        clock.now = LEASE_S + 1
        assert [t.task_id for t in fleet.lease("fast", 1)] == [task.task_id]  # re-issued
        assert fleet.counters().reissued == 8
        with pytest.raises(RuntimeError, match="before the first phase"):
            fleet.restore_counters(leases_reissued=0)

    fresh = Fleet(FleetSettings(run_id="r", run_seed=1), Clock())
    assert fresh.counters() == LeaseCounters(0, 0, 0, 0)
    fleet = during_a_phase(scenario, reissued=7)
    # The interrupted phase's re-issue stays counted once it has ended.
    assert fleet.counters() == LeaseCounters(0, 0, 0, 8)


def test_a_completed_run_is_told_to_every_worker_that_calls_from_then_on() -> None:
    async def main() -> list[bool]:
        fleet = Fleet(FleetSettings(run_id="r", run_seed=1), Clock())
        heard = [fleet.tell_complete("early"), fleet.run_complete, fleet.figures().run_complete]
        waiting = asyncio.ensure_future(fleet.until_complete_or_closed())
        await asyncio.sleep(0)
        heard.append(waiting.done())
        fleet.complete_run()
        await asyncio.wait_for(waiting, 1.0)  # a presence call waiting on it hears it at once
        heard += [fleet.tell_complete("late"), fleet.run_complete, fleet.figures().run_complete]
        await asyncio.wait_for(fleet.linger(poll_s=0), 1.0)  # "late" was told: nobody to wait
        return heard

    assert asyncio.run(main()) == [False, False, False, False, True, True, True]


def test_figures_hold_what_a_snapshot_reads_and_the_worker_table_only_when_asked() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        one = fleet.lease("w1", 2)
        fleet.lease("w2", 1)
        fleet.report_many("w1", [TaskOutcome(one[0].task_id, (1.0,), 40)])
        figures = fleet.figures()
        assert figures.counters == fleet.counters() == LeaseCounters(0, 2, 1, 0)
        assert (figures.workers, figures.run_complete, figures.worker_stats) == (2, False, ())
        table = fleet.figures(workers=True).worker_stats
        assert [(w.worker_id, w.tasks_leased, w.frames) for w in table] == [
            ("w1", 1, 40),
            ("w2", 1, 0),
        ]
        clock.now = 61.0  # past the window a worker counts as connected in
        assert fleet.figures().workers == 0

    during_a_phase(scenario)


def test_tasks_leased_to_a_worker_are_its_leases_not_its_backup_copies() -> None:
    async def scenario(fleet: Fleet, clock: Clock) -> None:
        assert fleet.tasks_leased_to("nobody") == []
        held = [t.task_id for t in fleet.lease("busy", 3)]
        # Nothing is pending: an idle worker gets a backup copy, which is not its lease.
        [backup] = fleet.lease("idle", 1)
        assert backup.task_id in held
        assert fleet.tasks_leased_to("busy") == sorted(held)
        assert fleet.tasks_leased_to("idle") == []
        assert fleet.report_many("idle", [TaskOutcome(backup.task_id, (1.0,), 10)]) == [
            Disposition.ACCEPTED
        ]
        assert fleet.tasks_leased_to("busy") == sorted(set(held) - {backup.task_id})
        fleet.release("busy", held)
        assert fleet.tasks_leased_to("busy") == []

    fleet = during_a_phase(scenario)
    assert fleet.tasks_leased_to("busy") == []  # between phases nobody holds anything


def test_a_presence_call_replaced_by_a_newer_one_does_not_end_the_worker() -> None:
    presence = Presence(max_attached=2)
    first = presence.attach("w")
    second = presence.attach("w")  # reconnected: the newer call is the live one
    assert first is not None and second is not None and len(presence) == 1
    assert presence.detach("w", first) is False and len(presence) == 1
    assert presence.attach("other") is not None
    assert presence.attach("third") is None  # full: its leases lapse as usual
    assert presence.detach("w", second) is True and len(presence) == 1
