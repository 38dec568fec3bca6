"""The fair-share picker over several runs' lease tables: pure, driven by an explicit clock."""

from __future__ import annotations

import numpy as np
import pytest

from master.fleet.leases import LeaseTable, PhaseTask
from master.fleet.shares import Drawn, FairShare
from neuro.genome import Genome

LEASE_S = 60.0
GENOME = Genome((1,))


def table(name: str, tasks: int, backups: bool = True) -> LeaseTable:
    """`tasks` one-episode tasks with ids name/0, name/1, ..."""
    return LeaseTable(
        [PhaseTask(f"{name}/{i}", f"{name}/k{i}", GENOME, 1, i) for i in range(tasks)],
        LEASE_S,
        max_attempts=3,
        backups=backups,
    )


def share_of(pending: dict[str, int]) -> tuple[FairShare[LeaseTable], dict[str, LeaseTable]]:
    """A picker over one table per run, each with this many pending tasks."""
    share: FairShare[LeaseTable] = FairShare()
    tables = {}
    for run, tasks in pending.items():
        tables[run] = table(run, tasks)
        share.set_tables(run, [tables[run]])
    return share, tables


def taken(drawn: list[Drawn[LeaseTable]]) -> dict[str, int]:
    """Fresh tasks drawn, by run."""
    counts: dict[str, int] = {}
    for d in drawn:
        assert not d.backup
        counts[d.run] = counts.get(d.run, 0) + len(d.tasks)
    return counts


@pytest.mark.parametrize(
    ("pending", "workers", "in_flight"),
    [
        ({"a": 100, "b": 10, "c": 1000}, 12, {"a": 4, "b": 4, "c": 4}),
        ({"a": 2, "b": 100, "c": 100}, 12, {"a": 2, "b": 5, "c": 5}),
        ({"a": 30, "b": 3}, 9, {"a": 6, "b": 3}),
        ({"a": 0, "b": 5, "c": 5}, 4, {"a": 0, "b": 2, "c": 2}),
        ({"a": 1, "b": 1, "c": 1, "d": 1}, 4, {"a": 1, "b": 1, "c": 1, "d": 1}),
        ({"a": 7}, 5, {"a": 5}),
    ],
)
def test_one_task_workers_share_the_runs_fairly_whatever_each_has_pending(
    pending, workers, in_flight
) -> None:
    share, _ = share_of(pending)
    for i in range(workers):
        assert sum(taken(share.lease(f"w{i}", 1, now=0.0)).values()) == 1
    assert {run: share.in_flight(run) for run in pending} == in_flight


@pytest.mark.parametrize(
    ("pending", "busy", "ask", "drawn"),
    [
        # Levelled one at a time: a, b, c, a, b, c, a, c (b has no more), a.
        ({"a": 100, "b": 2, "c": 100}, {}, 9, {"a": 4, "b": 2, "c": 3}),
        # b has nothing in flight: it is levelled up to a first.
        ({"a": 10, "b": 10}, {"a": 3}, 5, {"b": 4, "a": 1}),
        # Fewer pending than asked: everything there is.
        ({"a": 2, "b": 1}, {}, 8, {"a": 2, "b": 1}),
    ],
)
def test_a_worker_asking_for_many_takes_them_from_several_runs_levelling_them(
    pending, busy, ask, drawn
) -> None:
    share, tables = share_of(pending)
    for run, count in busy.items():
        for i in range(count):
            tables[run].lease(f"other{i}", 1, 0.0)  # leased before, to other workers
    assert taken(share.lease("gpu", ask, now=0.0)) == drawn


def test_no_worker_takes_more_than_its_share_of_every_runs_pending_tasks() -> None:
    share, _ = share_of({"a": 5, "b": 5})
    # Two workers asking for 10 each, 10 tasks pending in two runs: the first takes its half,
    # from both runs; the second its half of the 5 left, 3, levelling the runs again.
    assert taken(share.lease("w0", 10, now=0.0, fleet_slots=20)) == {"a": 3, "b": 2}
    assert taken(share.lease("w1", 10, now=0.0, fleet_slots=20)) == {"b": 2, "a": 1}
    assert share.pending == 2


def test_no_run_starves_beside_one_with_a_hundred_times_its_work() -> None:
    """Six one-task workers, each reporting its oldest task and asking again: while runs have
    pending tasks their tasks in flight differ by one at most, so the small runs are done early."""
    share, tables = share_of({"big": 500, "mid": 20, "small": 5})
    running: list[tuple[str, Drawn[LeaseTable]]] = []
    for i in range(6):
        (drawn,) = share.lease(f"w{i}", 1, now=0.0)
        running.append((f"w{i}", drawn))
    last_lease = {}
    for step in range(1, 600):
        worker, drawn = running.pop(0)
        (task,) = drawn.tasks
        drawn.table.complete_task(task.task_id, [1.0], 4, worker)
        if all(t.complete for t in tables.values()):
            break
        got = share.lease(worker, 1, now=float(step))
        if not got or got[0].backup:
            assert not share.pending
            continue  # the phase's tail: this worker's part is over
        (drawn,) = got
        running.append((worker, drawn))
        last_lease[drawn.run] = step
        flights = [share.in_flight(run) for run in tables if tables[run].pending]
        assert not flights or max(flights) - min(flights) <= 1, step
    # Each of small's 5 tasks was leased within a run of three leases (one per run).
    assert last_lease["small"] <= 3 * 5
    assert last_lease["mid"] <= 3 * 20
    assert tables["small"].complete and tables["mid"].complete


@pytest.mark.parametrize("seed", range(5))
def test_a_worker_holding_nothing_gets_work_whenever_any_run_has_some(seed: int) -> None:
    """Random asks and reports over runs of random sizes: an idle worker asking is never sent
    away while a task is pending, and gets no backup copy while one is."""
    rng = np.random.default_rng(seed)
    share, tables = share_of({f"r{i}": int(rng.integers(0, 40)) for i in range(3)})
    held: dict[str, list[tuple[LeaseTable, PhaseTask]]] = {f"w{i}": [] for i in range(5)}
    for step in range(400):
        now = float(step)
        worker = f"w{rng.integers(len(held))}"
        if held[worker] and rng.random() < 0.6:
            lease_table, task = held[worker].pop(0)
            lease_table.complete_task(task.task_id, [1.0], 4, worker)
            continue
        pending_before = share.pending
        drawn = share.lease(worker, int(rng.integers(1, 4)), now)
        if pending_before:
            assert not any(d.backup for d in drawn)
            if not held[worker]:
                assert drawn, f"step {step}: {worker} idle with {pending_before} pending"
        for d in drawn:  # a backup copy is held (and reported) as a task is
            held[worker] += [(d.table, task) for task in d.tasks]
    assert sum(t.counters.done for t in tables.values()) > 0


def test_a_worker_a_run_holds_off_takes_another_runs_task() -> None:
    """Near a phase's end a table leases its last tasks only to workers holding none of its
    tasks; a worker it holds off gets another run's pending task instead of nothing."""
    share, tables = share_of({"a": 3, "b": 4})
    tables["a"].lease("x", 1, 0.0)
    tables["a"].lease("y", 1, 0.0)
    for worker in ("p", "q", "r"):
        tables["b"].lease(worker, 1, 0.0)
    # a: 2 in flight, 1 pending, 2 holders; b: 3 in flight, 1 pending. a comes first, and
    # holds x off (x holds one of its tasks), so x gets b's last task.
    assert tables["a"].lease("x", 1, 0.0) == []
    (drawn,) = share.lease("x", 1, 0.0)
    assert (drawn.run, drawn.backup) == ("b", False)


def test_backup_copies_only_once_no_run_has_a_pending_task() -> None:
    share, tables = share_of({"a": 2, "b": 1})
    share.lease("w0", 1, 0.0)
    share.lease("w1", 1, 0.0)  # a and b each have one task in flight
    (drawn,) = share.lease("w2", 1, 0.0)
    assert not drawn.backup and tables["a"].pending == 0 == tables["b"].pending
    # Nothing is pending: an idle worker gets a backup copy of a task in flight.
    (backup,) = share.lease("w3", 1, 1.0)
    assert backup.backup and len(backup.tasks) == 1
    assert backup.table.backup_holder(backup.tasks[0].task_id) == "w3"
    # A worker holding a task of every table gets none.
    assert share.lease("w0", 1, 1.0) == []


def test_a_table_made_without_backups_gives_none() -> None:
    share: FairShare[LeaseTable] = FairShare()
    plain = table("a", 1, backups=False)
    share.set_tables("a", [plain])
    share.lease("w0", 1, 0.0)
    assert share.lease("w1", 1, 0.0) == []


def test_a_runs_running_phase_comes_before_its_tasks_played_ahead() -> None:
    share: FairShare[LeaseTable] = FairShare()
    current, ahead = table("elite", 3), table("next", 10)
    share.set_tables("run", [current, ahead])
    drawn = share.lease("gpu", 5, 0.0)
    assert [(d.table, len(d.tasks)) for d in drawn] == [(current, 3), (ahead, 2)]
    assert share.in_flight("run") == 5  # both tables' tasks count
    (drawn_next,) = share.lease("w", 1, 0.0)
    assert drawn_next.table is ahead
    # Another run with nothing in flight is levelled up to this one before it is served again.
    other = table("other", 10)
    share.set_tables("other", [other])
    assert taken(share.lease("gpu2", 6, 0.0)) == {"other": 6}


def test_runs_added_and_removed_mid_phase() -> None:
    share, tables = share_of({"a": 10, "b": 10})
    for i in range(4):
        share.lease(f"w{i}", 1, 0.0)
    assert (share.in_flight("a"), share.in_flight("b")) == (2, 2)
    share.set_tables("c", [table("c", 10)])
    assert [d.run for i in (4, 5) for d in share.lease(f"w{i}", 1, 0.0)] == ["c", "c"]
    # Levelled now: the least recently served goes first.
    assert [d.run for d in share.lease("w6", 1, 0.0)] == ["a"]
    share.remove("b")
    assert share.runs == ("a", "c")
    drawn = share.lease("w7", 6, 0.0)
    assert set(taken(drawn)) == {"a", "c"}
    assert tables["b"].pending == 8  # b's table is left as it was
    # A run's next phase replaces its tables; it keeps its place in the order.
    share.set_tables("a", [table("a2", 5)])
    assert share.in_flight("a") == 0 and share.runs == ("a", "c")
    assert [d.table.tasks()[0].task_id for d in share.lease("w8", 1, 0.0)] == ["a2/0"]


def test_ties_go_to_the_run_served_least_recently() -> None:
    share, _ = share_of({"a": 10, "b": 10, "c": 10})
    order = []
    for step in range(6):
        (drawn,) = share.lease("w", 1, float(step))
        order.append(drawn.run)
        (task,) = drawn.tasks
        drawn.table.complete_task(task.task_id, [1.0], 4, "w")
    assert order == ["a", "b", "c", "a", "b", "c"]


def test_nothing_to_lease() -> None:
    share: FairShare[LeaseTable] = FairShare()
    assert share.lease("w", 4, 0.0) == [] and share.pending == 0
    share, _ = share_of({"a": 3})
    assert share.lease("w", 0, 0.0) == []
    assert share.pending == 3 and repr(share) == "FairShare(runs=1, pending=3)"
