"""One Fleet serving several runs (a study): task ids qualified by run on the wire, each call
routed to its run, fair share across them, the tasks played ahead, busy seconds bounded; driven
with an explicit clock, no network."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable

import pytest

from master.algorithms.base import EvaluationRequest
from master.fleet.fleet import Fleet, RunFleet, qualified
from master.fleet.leases import Disposition
from master.fleet.phases import FleetSettings, PhaseOutcome, TaskOutcome, env_seed_for
from neuro.genome import Genome
from tests.support.clock import Clock

LEASE_S = 10.0


def requests(prefix: str, count: int, episodes: int = 1) -> list[EvaluationRequest]:
    return [EvaluationRequest(f"{prefix}/{i}", Genome((i + 1,)), episodes) for i in range(count)]


def outcome(task_id: str, episodes: int = 1, busy_s: float = 0.0) -> TaskOutcome:
    return TaskOutcome(task_id, [1.0] * episodes, 10 * episodes, busy_s=busy_s)


def with_runs(
    scenario: Callable[[Fleet, dict[str, RunFleet], Clock], Awaitable[None]],
    phases: dict[str, int],
) -> None:
    """Runs scenario(fleet, runs, clock) while each run (key -> tasks) has a phase open."""
    clock = Clock()
    fleet = Fleet(clock=clock, lease_seconds=LEASE_S)
    runs = {key: fleet.add_run(FleetSettings(run_id=key, run_seed=7, lease_seconds=LEASE_S))
            for key in phases}  # fmt: skip

    async def main() -> None:
        open_phases = [asyncio.ensure_future(runs[key].evaluate(requests("g0/o", count)))
                       for key, count in phases.items()]  # fmt: skip
        await asyncio.sleep(0)
        try:
            await scenario(fleet, runs, clock)
        finally:
            for phase in open_phases:
                phase.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await phase

    asyncio.run(main())


def test_a_studys_task_ids_carry_their_run_and_every_call_reaches_that_run() -> None:
    async def scenario(fleet: Fleet, runs: dict[str, RunFleet], clock: Clock) -> None:
        granted = fleet.lease_runs("w", 4)
        ids = {run: [t.task_id for t in tasks] for run, tasks in granted}
        # Fair share: two of each run, ids qualified by the run's key.
        assert ids == {"a": ["a|g0/o/0/0", "a|g0/o/1/0"], "b": ["b|g0/o/0/0", "b|g0/o/1/0"]}
        for _, tasks in granted:
            for task in tasks:  # the env seed is the run's own task id's, as alone
                assert task.env_seed == env_seed_for(7, task.task_id.split("|", 1)[1])
        assert runs["a"].counters().leased == 2 and runs["b"].counters().leased == 2
        # The same internal id in two runs is two tasks; a foreign or unqualified id is dropped.
        beat = ["a|g0/o/0/0", "b|g0/o/0/0", "c|g0/o/0/0", "g0/o/0/0", "a|g0/o/9/0"]
        assert fleet.heartbeat("w", beat) == ["c|g0/o/0/0", "g0/o/0/0", "a|g0/o/9/0"]
        assert fleet.release("w", ["b|g0/o/1/0"]) == 1
        assert runs["b"].counters().pending == 2
        dispositions = fleet.report_many(
            "w", [outcome("b|g0/o/0/0"), outcome("a|g0/o/1/0"), outcome("x|g0/o/0/0")]
        )
        assert dispositions == [Disposition.ACCEPTED, Disposition.ACCEPTED, Disposition.STALE]
        assert runs["a"].counters().done == 1 and runs["b"].counters().done == 1
        assert fleet.tasks_leased_to("w") == ["a|g0/o/0/0"]
        (stats,) = fleet.worker_stats()
        assert stats.tasks_leased == 1
        # A bad result of one run refuses the whole batch, recording nothing of either run.
        with pytest.raises(ValueError, match="episode_returns"):
            fleet.report_many("w", [outcome("b|g0/o/2/0"), outcome("a|g0/o/0/0", episodes=2)])
        assert runs["b"].counters().done == 1

    with_runs(scenario, {"a": 3, "b": 3})


def test_no_run_starves_and_backups_wait_until_no_run_has_pending_work() -> None:
    async def scenario(fleet: Fleet, runs: dict[str, RunFleet], clock: Clock) -> None:
        # One-task workers: the run with a long phase does not crowd out the short one.
        taken = [fleet.lease_runs(f"w{i}", 1)[0] for i in range(4)]
        assert sorted(run for run, _ in taken) == ["a", "a", "b", "b"]
        assert runs["b"].counters().pending == 0 and runs["a"].counters().pending == 8
        # An idle worker gets fresh work of "a", not a backup copy of "b"'s in-flight tasks.
        for i in range(8):
            ((run, tasks),) = fleet.lease_runs(f"idle{i}", 1)
            assert run == "a" and len(tasks) == 1
        # Nothing pending anywhere now: a backup copy of the run with the fewest in flight,
        # its longest running task.
        ((run, (backup,)),) = fleet.lease_runs("late", 1)
        first_of_b = next(granted.tasks[0] for granted in taken if granted.run == "b")
        assert run == "b" and backup.task_id == first_of_b.task_id

    with_runs(scenario, {"a": 10, "b": 2})


@pytest.mark.parametrize("long_s", [2.0, 8.0])  # within a lease (LEASE_S)
def test_a_run_of_short_tasks_beside_runs_of_long_ones_is_not_kept_waiting(long_s: float) -> None:
    """Two workers, each playing one task and holding one more (prefetched) that starts when
    the running one ends, as a per-genome worker does. Two runs of long Atari-like tasks fill
    them; then a run of 1 ms tasks asks too: its 60 tasks are done once the long tasks held
    ahead of its first ones end, since its work in flight weighs its tasks' seconds (the picker
    once counted tasks, and the short run was done only after all 80 long tasks), while the
    long tasks each worker held go on."""
    seconds = {"a": long_s, "b": long_s, "short": 0.001}

    async def scenario(fleet: Fleet, runs: dict[str, RunFleet], clock: Clock) -> None:
        queues: dict[str, list[str]] = {"w0": [], "w1": []}
        ends: dict[str, float] = {}
        for worker, queue in queues.items():  # the short run's phase is not open yet
            queue += [t.task_id for g in fleet.lease_runs(worker, 2, ["short"]) for t in g.tasks]
        for worker, queue in queues.items():
            ends[worker] = clock.now + seconds[queue[0].partition("|")[0]]
        done_at = None
        while done_at is None and any(queues.values()):
            worker = min(ends, key=ends.__getitem__)  # the next task to end
            clock.now = ends[worker]
            for holder, held in queues.items():  # heartbeats: no lease lapses meanwhile
                fleet.heartbeat(holder, held)
            queue = queues[worker]
            task_id = queue.pop(0)
            run = task_id.partition("|")[0]
            fleet.report_many(worker, [outcome(task_id, busy_s=seconds[run])])
            if runs["short"].counters().done == 60:
                done_at = clock.now
            queue += [t.task_id for t in fleet.lease(worker, 2 - len(queue))]
            ends[worker] = clock.now + seconds[queue[0].partition("|")[0]] if queue else math.inf
        long_done = runs["a"].counters().done + runs["b"].counters().done
        # The two long tasks each worker held when it began, then its own 60 tasks (once run
        # after the long runs' 80, at 40 long tasks' time).
        assert done_at is not None and done_at < 2.5 * long_s, (done_at, long_done)
        assert long_done == 4

    with_runs(scenario, {"a": 40, "b": 40, "short": 60})


def test_a_run_a_worker_cannot_serve_is_left_to_others() -> None:
    async def scenario(fleet: Fleet, runs: dict[str, RunFleet], clock: Clock) -> None:
        granted = fleet.lease_runs("w", 4, excluded=["a"])
        assert [run for run, _ in granted] == ["b"]
        # A refusal of one run (a module it lacks) keeps it from that run alone.
        fleet.refuse("r", "cannot import module 'mypkg'", "b")
        assert [run for run, _ in fleet.lease_runs("r", 2)] == ["a"]
        assert fleet.refusals() == {"r": "run b: cannot import module 'mypkg'"}
        fleet.withdraw_refusal("r")
        assert fleet.refusals() == {}

    with_runs(scenario, {"a": 3, "b": 3})


def test_a_worker_is_told_the_study_is_complete_only_once_every_run_is() -> None:
    async def scenario(fleet: Fleet, runs: dict[str, RunFleet], clock: Clock) -> None:
        runs["a"].complete_run()
        assert runs["a"].run_complete and not fleet.run_complete
        assert not fleet.tell_complete("w")
        # The finished run's tasks are leased no more; the other's still are.
        assert [run for run, _ in fleet.lease_runs("w", 8)] == ["b"]
        fleet.complete_run()
        assert fleet.tell_complete("w") and runs["b"].run_complete

    with_runs(scenario, {"a": 3, "b": 3})


def test_busy_seconds_count_up_to_the_lease_age_and_only_for_accepted_results() -> None:
    async def scenario(fleet: Fleet, runs: dict[str, RunFleet], clock: Clock) -> None:
        tasks = fleet.lease("w", 3)
        assert len(tasks) == 3
        clock.now = 4.0
        ids = [t.task_id for t in tasks]
        dispositions = fleet.report_many("w", [
            outcome(ids[0], busy_s=1.5),       # as measured
            outcome(ids[1], busy_s=1e9),       # more than the lease's 4 s: 4
            outcome(ids[2], busy_s=float("nan")),  # no time
        ])  # fmt: skip
        assert dispositions == [Disposition.ACCEPTED] * 3
        fleet.report_many("w", [outcome(ids[0], busy_s=3.0)])  # a duplicate adds nothing
        assert runs["a"].worker_s == pytest.approx(5.5)
        assert fleet.roster.utilisation(clock.now) is None  # 4 s: too soon to say
        clock.now = 30.0
        fleet.lease("w", 1)  # seen again, connected
        assert fleet.utilisation() == pytest.approx(5.5 / 30.0)

    with_runs(scenario, {"a": 4})


def test_tasks_played_ahead_wait_for_the_phase_and_become_the_next_one() -> None:
    """The next phase's tasks are leased once the running phase has none pending; their results
    are kept and the next evaluate() takes them, adding the tasks it has beside them."""
    clock = Clock()
    fleet = Fleet(clock=clock, lease_seconds=LEASE_S)
    run = fleet.add_run(
        FleetSettings(run_id="a", run_seed=3, lease_seconds=LEASE_S, episodes_per_task=2)
    )
    elite = [EvaluationRequest("g0/e/0", Genome((1,)), 2)]
    offspring = requests("g1/o", 3)
    ahead = offspring[:2]  # the carried elite (g1/o/2) is not known ahead

    async def main() -> PhaseOutcome:
        phase = asyncio.ensure_future(run.evaluate(elite, ahead=ahead))
        await asyncio.sleep(0)
        first = fleet.lease("w", 1)
        assert [t.task_id for t in first] == ["a|g0/e/0/0"]  # the running phase's first
        second = fleet.lease("v", 4)
        assert [t.task_id for t in second] == ["a|g1/o/0/0", "a|g1/o/1/0"]
        fleet.report_many("v", [outcome("a|g1/o/0/0")])
        fleet.report_many("w", [outcome("a|g0/e/0/0", episodes=2)])
        done = await asyncio.wait_for(phase, 1.0)
        assert done.episodes == 2 and set(done.returns) == {"g0/e/0"}
        # Between phases the tasks played ahead are still served, and still reported.
        assert fleet.heartbeat("v", ["a|g1/o/1/0"]) == []
        nxt = asyncio.ensure_future(run.evaluate(offspring))
        await asyncio.sleep(0)
        assert run.counters().done == 1  # g1/o/0, played ahead
        (last,) = fleet.lease("w", 4)
        assert last.task_id == "a|g1/o/2/0"
        fleet.report_many("v", [outcome("a|g1/o/1/0")])
        fleet.report_many("w", [outcome("a|g1/o/2/0")])
        return await asyncio.wait_for(nxt, 1.0)

    outcome_ = asyncio.run(main())
    assert sorted(outcome_.returns) == ["g1/o/0", "g1/o/1", "g1/o/2"]
    assert outcome_.episodes == 3 and outcome_.frames == 30


def test_a_lease_of_a_task_played_ahead_lost_with_its_worker_counts_once_when_it_happens() -> None:
    """A run's per-generation figure of re-issued leases is the difference of counters() at its
    ends: a task played ahead and lost during the elite phase counts in that generation, and
    not again when the next phase adopts the table (nor not at all, as it once did)."""
    clock = Clock()
    fleet = Fleet(FleetSettings(run_id="a", run_seed=3, lease_seconds=LEASE_S), clock)
    elite = [EvaluationRequest("g0/e/0", Genome((1,)), 1)]
    offspring = requests("g1/o", 2)

    async def main() -> None:
        phase = asyncio.ensure_future(fleet.evaluate(elite, ahead=offspring))
        await asyncio.sleep(0)
        assert [t.task_id for t in fleet.lease("w", 1)] == ["g0/e/0/0"]
        assert [t.task_id for t in fleet.lease("v", 1)] == ["g1/o/0/0"]
        assert fleet.counters().reissued == 0
        assert fleet.worker_gone("v") == 1  # v dies holding a task played ahead
        assert fleet.counters().reissued == 1
        fleet.report_many("w", [outcome("g0/e/0/0")])
        await asyncio.wait_for(phase, 1.0)
        assert fleet.counters().reissued == 1
        nxt = asyncio.ensure_future(fleet.evaluate(offspring))
        await asyncio.sleep(0)
        assert fleet.counters().reissued == 1  # adopted, not counted again
        leased = [t.task_id for t in fleet.lease("w", 2)]
        assert sorted(leased) == ["g1/o/0/0", "g1/o/1/0"]
        fleet.report_many("w", [outcome(task_id) for task_id in leased])
        await asyncio.wait_for(nxt, 1.0)
        assert fleet.counters().reissued == 1
        # A table played ahead and then dropped keeps what it re-issued in the run's count.
        last = asyncio.ensure_future(fleet.evaluate(requests("g2/e", 1), ahead=requests("g3/o", 1)))
        await asyncio.sleep(0)
        assert [t.task_id for t in fleet.lease("u", 2)] == ["g2/e/0/0", "g3/o/0/0"]
        fleet.worker_gone("u")
        assert fleet.counters().reissued == 3
        fleet.drop_ahead()
        assert fleet.counters().reissued == 3
        last.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await last

    asyncio.run(main())


def test_tasks_played_ahead_that_the_next_phase_does_not_ask_for_are_played_again() -> None:
    clock = Clock()
    fleet = Fleet(FleetSettings(run_id="a", run_seed=3, lease_seconds=LEASE_S), clock)
    elite = [EvaluationRequest("g0/e/0", Genome((1,)), 1)]
    wrong = [EvaluationRequest("g1/o/0", Genome((99,)), 1)]  # not the genome asked for later

    async def main() -> None:
        phase = asyncio.ensure_future(fleet.evaluate(elite, ahead=wrong))
        await asyncio.sleep(0)
        assert [t.task_id for t in fleet.lease("w", 2)] == ["g0/e/0/0", "g1/o/0/0"]
        fleet.report_many("w", [outcome("g1/o/0/0"), outcome("g0/e/0/0")])
        await asyncio.wait_for(phase, 1.0)
        nxt = asyncio.ensure_future(fleet.evaluate(requests("g1/o", 1)))
        await asyncio.sleep(0)
        assert fleet.counters().done == 0 and fleet.counters().pending == 1
        nxt.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await nxt

    asyncio.run(main())


def test_a_single_runs_ids_are_its_own_and_a_run_key_cannot_hold_the_separator() -> None:
    fleet = Fleet(FleetSettings(run_id="r", run_seed=1), Clock())
    assert fleet.run_key("g0/o/0/0") == "" and qualified("", "g0/o/0/0") == "g0/o/0/0"
    with pytest.raises(ValueError, match="in use"):
        fleet.add_run(FleetSettings(run_id="other", run_seed=1), key="")
    study = Fleet(clock=Clock())
    with pytest.raises(ValueError, match=r"holds '\|'"):
        study.add_run(FleetSettings(run_id="a|b", run_seed=1))
    study.add_run(FleetSettings(run_id="a", run_seed=1))
    assert study.run_key("a|g0/o/0/0") == "a" and study.run_key("b|g0/o/0/0") is None
    with pytest.raises(RuntimeError, match="several runs"):
        study.counters()


def test_a_worker_playing_an_individuals_episodes_is_given_its_other_episodes_first() -> None:
    """An elite's re-evaluation stays on the worker playing it, which plays its episodes in one
    pass: the fewest-in-flight rule would hand it another run's individual instead."""
    clock = Clock()
    fleet = Fleet(clock=clock, lease_seconds=LEASE_S)
    elite = fleet.add_run(FleetSettings(run_id="a", run_seed=1, lease_seconds=LEASE_S))
    other = fleet.add_run(FleetSettings(run_id="b", run_seed=1, lease_seconds=LEASE_S))

    async def main() -> None:
        phases = [asyncio.ensure_future(elite.evaluate(requests("g0/e", 2, episodes=4))),
                  asyncio.ensure_future(other.evaluate(requests("g0/o", 6)))]  # fmt: skip
        await asyncio.sleep(0)
        try:
            assert [t.task_id for t in fleet.lease("w", 1)] == ["a|g0/e/0/0"]
            # "b" has fewer in flight, but w holds an episode of a's individual: more of it.
            assert [t.task_id for t in fleet.lease("w", 1)] == ["a|g0/e/0/1"]
            assert [t.task_id for t in fleet.lease("w", 3)] == ["a|g0/e/0/2", "a|g0/e/0/3",
                                                               "a|g0/e/1/0"]  # fmt: skip
            # Holding two individuals' episodes, it is levelled again: "b" goes first.
            assert [t.task_id for t in fleet.lease("w", 1)] == ["b|g0/o/0/0"]
            # One-episode requests (offspring) keep nobody: levelled as ever.
            assert [t.task_id for t in fleet.lease("v", 1)] == ["b|g0/o/1/0"]
            assert [t.task_id for t in fleet.lease("v", 1)] == ["b|g0/o/2/0"]
        finally:
            for phase in phases:
                phase.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await phase

    asyncio.run(main())
