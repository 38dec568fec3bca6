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


# ---------------------------------------------------------------- tables moving behind its back
# The picker keeps each run's figures between calls; reports, lapsed leases and gone workers
# change the tables through calls it does not make, and must count at its next call.


@pytest.mark.parametrize(
    "move",
    [
        lambda a: a.complete_task("a/0", [1.0], 4, "w0"),
        lambda a: a.fail_task("a/0", "out of memory", "w0"),
        lambda a: a.release("w0", ["a/0"]),
        lambda a: a.worker_gone("w0"),
        lambda a: a.expire(LEASE_S + 1.0),
    ],
    ids=["reported", "failed", "handed-back", "worker-gone", "lapsed"],
)
def test_a_task_ending_behind_the_pickers_back_counts_at_its_next_call(move) -> None:
    """a's only task in flight ends by a call on its table, not the picker's: a has none in
    flight now, and goes before b (one in flight, served more recently than a)."""
    share, tables = share_of({"a": 5, "b": 5})
    assert [d.run for d in share.lease("w0", 1, 0.0)] == ["a"]
    assert [d.run for d in share.lease("w1", 1, 0.0)] == ["b"]
    move(tables["a"])
    assert share.in_flight("a") == 0
    assert [d.run for d in share.lease("w2", 1, 1.0)] == ["a"]


@pytest.mark.parametrize(
    "move",
    [
        lambda a: a.fail_task("a/0", "out of memory", "w0"),
        lambda a: a.release("w0", ["a/0"]),
        lambda a: a.worker_gone("w0"),
        lambda a: a.expire(LEASE_S + 1.0),
        lambda a: a.add([PhaseTask("a/late", "a/late", GENOME, 1, 9)]),
    ],
    ids=["failed", "handed-back", "worker-gone", "lapsed", "added"],
)
def test_a_run_with_nothing_pending_is_served_again_once_a_task_is_back(move) -> None:
    """a leased its only task and had nothing pending; a task comes back (or joins) by a call
    on a's table: it is pending for the picker too, and no backup copy goes out meanwhile."""
    share, tables = share_of({"a": 1, "b": 0})
    share.lease("w0", 1, 0.0)
    assert share.pending == 0
    move(tables["a"])
    assert share.pending == 1
    (drawn,) = share.lease("w1", 1, 2 * LEASE_S)
    assert (drawn.run, drawn.backup) == ("a", False)


def test_a_heartbeat_taking_back_a_lapsed_task_leaves_nothing_pending() -> None:
    share, tables = share_of({"a": 1})
    share.lease("w0", 1, 0.0)
    tables["a"].expire(LEASE_S + 1.0)
    assert share.pending == 1
    assert tables["a"].heartbeat("w0", ["a/0"], LEASE_S + 2.0) == []  # still on it: takes it back
    assert (share.pending, share.in_flight("a")) == (0, 1)
    (backup,) = share.lease("w1", 1, LEASE_S + 3.0)
    assert backup.backup and backup.tasks[0].task_id == "a/0"


@pytest.mark.parametrize("change", ["added", "removed"])
def test_a_run_added_or_removed_after_another_runs_table_moved(change: str) -> None:
    share, tables = share_of({"a": 5, "b": 5, "c": 5})
    assert [d.run for i in range(3) for d in share.lease(f"w{i}", 1, 0.0)] == ["a", "b", "c"]
    tables["a"].complete_task("a/0", [1.0], 4, "w0")  # a: none in flight now
    if change == "added":
        share.set_tables("d", [table("d", 0)])
    else:
        share.remove("c")
    assert [d.run for d in share.lease("w3", 1, 1.0)] == ["a"]


class Recomputing:
    """The rule FairShare follows, recomputed from its tables at every call: what it must
    decide, however many calls its figures are kept across."""

    def __init__(self) -> None:
        self.tables: dict[str, list[LeaseTable]] = {}
        self.served: dict[str, int] = {}
        self.task_s: dict[str, float] = {}
        self.serial = 0

    def set_tables(self, run: str, tables: list[LeaseTable]) -> None:
        if run not in self.tables:
            known = list(self.task_s.values())
            self.task_s[run] = sum(known) / len(known) if known else 1.0
        self.tables[run] = tables
        self.served.setdefault(run, 0)

    def set_task_seconds(self, run: str, seconds: float) -> None:
        if run in self.task_s and abs(seconds - self.task_s[run]) > 0.05 * self.task_s[run]:
            self.task_s[run] = seconds

    def remove(self, run: str) -> None:
        del self.tables[run], self.served[run], self.task_s[run]

    def pending(self, run: str | None = None) -> int:
        runs = self.tables if run is None else [run]
        return sum(t.pending for r in runs for t in self.tables[r])

    def in_flight(self, run: str) -> int:
        return sum(t.counters.leased for t in self.tables[run])

    def key(self, run: str) -> tuple[float, int, int]:
        load = self.in_flight(run) * self.task_s[run]
        return load, self.served[run], list(self.tables).index(run)

    def lease(self, worker, wanted, now, slots, excluded) -> list[tuple[str, list[str], bool]]:
        if slots and self.pending():
            wanted = min(wanted, max(1, -(-self.pending() * wanted // max(slots, wanted))))
        drawn, refused = [], set(excluded)
        while wanted > 0:
            runs = sorted((r for r in self.tables if r not in refused and self.pending(r)),
                          key=self.key)  # fmt: skip
            if not runs:
                break
            levels = {run: self.key(run)[0] for run in runs}
            given: dict[str, int] = {}
            for _ in range(wanted):  # one at a time to the lowest level, least recent first
                open_runs = [r for r in runs if given.get(r, 0) < self.pending(r)]
                if not open_runs:
                    break
                run = min(open_runs, key=lambda r: (levels[r], self.key(r)[1:]))
                given[run] = given.get(run, 0) + 1
                levels[run] += self.task_s[run]
            for run, count in given.items():
                granted = 0
                for t in self.tables[run]:
                    if granted < count and not t.complete and t.pending:
                        tasks = t.lease(worker, count - granted, now, backups=False)
                        drawn.append((run, [task.task_id for task in tasks], False))
                        granted += len(tasks)
                refused.update([run] if granted < count else [])
                if granted:
                    self.serial += 1
                    self.served[run] = self.serial
                wanted -= granted
        drawn = [d for d in drawn if d[1]]
        if drawn or self.pending():
            return drawn
        for run in sorted((r for r in self.tables if r not in excluded), key=self.key):
            for t in self.tables[run]:
                if not t.complete and (tasks := t.lease_backups(worker, wanted, now)):
                    self.serial += 1
                    self.served[run] = self.serial
                    return [(run, [task.task_id for task in tasks], True)]
        return []


@pytest.mark.parametrize("seed", range(4))
def test_its_decisions_are_those_recomputed_from_the_tables_at_every_call(seed: int) -> None:
    """Two copies of one world of runs, one leased through FairShare, the other through the
    same rule recomputed at every call, take the same random steps: reports, failures,
    hand-backs, gone workers, lapsed leases and heartbeats made on the tables directly, tasks
    added, runs added, replaced and removed. Every lease call draws the same tasks in both."""
    rng = np.random.default_rng(seed)
    share: FairShare[LeaseTable] = FairShare()
    plain = Recomputing()
    worlds: dict[str, tuple[list[LeaseTable], list[LeaseTable]]] = {}
    made = 0

    def new_tables(run: str) -> None:
        nonlocal made
        sizes = [int(n) for n in rng.integers(0, 12, size=int(rng.integers(1, 3)))]
        pair = tuple([table(f"{run}.{made}.{j}", n) for j, n in enumerate(sizes)] for _ in "ab")
        made += 1
        worlds[run] = pair  # type: ignore[assignment]
        share.set_tables(run, pair[0])
        plain.set_tables(run, pair[1])

    for r in range(4):
        new_tables(f"r{r}")
    workers = [f"w{i}" for i in range(6)]
    now, leases = 0.0, 0
    for _ in range(600):
        now += float(rng.exponential(4.0))
        step = rng.random()
        run = f"r{rng.integers(6)}"
        if step < 0.4:
            worker = str(rng.choice(workers))
            excluded = [r for r in worlds if rng.random() < 0.15]
            wanted, slots = int(rng.integers(1, 5)), int(rng.choice([0, 4, 12]))
            got = share.lease(worker, wanted, now, fleet_slots=slots, excluded=excluded)
            mine = [(d.run, [t.task_id for t in d.tasks], d.backup) for d in got]
            assert mine == plain.lease(worker, wanted, now, slots, excluded)
            leases += bool(mine)
            # Read only here: a read makes the picker catch up, which would hide a step that
            # leaves it behind (a run added or removed after another's table moved).
            assert share.pending == plain.pending()
            assert {r: share.in_flight(r) for r in worlds} == {
                r: plain.in_flight(r) for r in worlds
            }
        elif step < 0.85 and worlds:
            run = str(rng.choice(list(worlds)))
            index = int(rng.integers(len(worlds[run][0])))
            worker = str(rng.choice(workers))
            action = int(rng.integers(7))
            for tables in worlds[run]:
                t = tables[index]
                held = t.leased_to(worker)
                if action == 0 and held:
                    t.complete_task(held[0], [1.0], 4, worker)
                elif action == 1 and held:
                    t.fail_task(held[-1], "boom", worker)
                elif action == 2:
                    t.release(worker, held[:1])
                elif action == 3:
                    t.worker_gone(worker)
                elif action == 4:
                    t.heartbeat(worker, held, now)
                elif action == 5:
                    t.expire(now)
                else:
                    t.add([PhaseTask(f"{run}/x{now}", "x", GENOME, 1, 0)])
        elif step < 0.89 and run in worlds:
            # Its tasks' seconds as the results tell them (dyadic: the same sums both ways).
            seconds = float(rng.choice([0.25, 0.5, 1.0, 2.0, 8.0]))
            share.set_task_seconds(run, seconds)
            plain.set_task_seconds(run, seconds)
        elif step < 0.93:
            new_tables(run)  # a new run, or a run's next phase
        elif run in worlds and len(worlds) > 1:
            del worlds[run]
            share.remove(run)
            plain.remove(run)
    assert leases > 50
