"""Which run's tasks a lease call draws from, when one fleet serves several runs (a study).

Fair share: among the runs with pending tasks, the one with the least work in flight goes first
(ties: the one served least recently), so no run starves however much work another has, and a
worker holding no task never goes without one while any run has a pending task. Work in flight
is a run's tasks in flight times what one of its tasks keeps a worker busy (set_task_seconds,
from the results' busy seconds): runs share the fleet's time, not its task count. Counting
tasks alone starved a run of short tasks beside runs of long ones: a worker plays the task it
holds beyond the running one only once that ends, so a 1 ms task of a toy task waited behind a
seconds-long Atari episode for each of its turns (a 0.3 s generation took 50 s on 2 workers).
A worker asking for several takes them from several runs, levelling their work in flight.
Within a run its tables are drawn from in order: the running phase's before the next phase's
tasks played ahead (master.algorithms.base.Algorithm.ask_ahead). Backup copies of in-flight
tasks, which only cut a phase's tail, are leased only once no run has a pending task.

A lease call costs little however many runs are served (a study serves 65 at once, and a big
fleet makes thousands of calls a second): the picker keeps each run's pending and in-flight
totals, and the runs with pending tasks in a heap ordered by (work in flight, last served). Tables
change behind its back (reports, lapsed leases, a worker gone), so each call first compares
every table's change count (LeaseTable.changes) with the one it last read, in one pass, and
reads again only the runs whose tables moved.

Pure bookkeeping like master.fleet.leases, whose public calls are all it uses: no asyncio, no
clock of its own (time comes in as an argument).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from master.fleet.leases import PhaseTask


class Leasable(Protocol):
    """What the picker uses of a lease table; master.fleet.leases.LeaseTable is one."""

    @property
    def pending(self) -> int: ...
    @property
    def leased(self) -> int: ...
    @property
    def changes(self) -> int: ...
    @property
    def complete(self) -> bool: ...
    def lease(
        self, worker_id: str, max_tasks: int, now: float, fleet_slots: int = 0,
        backups: bool = True, workers: Collection[str] = (),
    ) -> list[PhaseTask]: ...  # fmt: skip
    def lease_backups(self, worker_id: str, max_tasks: int, now: float) -> list[PhaseTask]: ...


T = TypeVar("T", bound=Leasable)

TASK_SECONDS_STEP = 0.05
"""A run's seconds per task moving by less than this share keeps its place in the heap."""


@dataclass(frozen=True)
class Drawn(Generic[T]):
    """The tasks one lease call took from one table of one run."""

    run: str
    table: T
    tasks: tuple[PhaseTask, ...]
    backup: bool = False
    """Backup copies of tasks in flight, not fresh tasks."""


class _Run(Generic[T]):
    """One run served: its tables and the figures the picker last read of them."""

    __slots__ = ("entry", "first", "in_flight", "name", "order", "pending", "queued", "served",
                 "tables", "task_s")  # fmt: skip

    def __init__(self, name: str, order: int) -> None:
        self.name = name
        self.order = order
        """Rank among the runs by when each was added: the last tie-break."""
        self.tables: tuple[T, ...] = ()
        self.first = 0
        """Index of its first table in the picker's list of every run's tables."""
        self.served = 0
        """Serial of the last lease call that gave it work; 0: never served."""
        self.pending = 0
        self.in_flight = 0
        self.task_s = 1.0
        """What one of its tasks keeps a worker busy (any unit, the same for every run)."""
        self.entry: tuple[float, int, int, _Run[T]] | None = None
        """Its heap entry, (work in flight, served, order, run): entries that are not this are
        stale."""

    @property
    def load(self) -> float:
        """Its work in flight: tasks in flight times the seconds each takes."""
        return self.in_flight * self.task_s
        self.queued = False
        """Whether `entry` is in the heap."""


class FairShare(Generic[T]):
    """The runs a fleet serves, each with its lease tables in priority order, and the picker
    that leases across them."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run[T]] = {}
        self._tables: list[T] = []
        """Every run's tables, run by run in the runs' order."""
        self._owners: list[_Run[T]] = []
        """The run of each of `_tables`."""
        self._seen: list[int] = []
        """Each of `_tables`' change count when its figures were last read."""
        self._heap: list[tuple[float, int, int, _Run[T]]] = []
        """The runs with pending tasks by (work in flight, last served, order), and stale
        entries."""
        self._pending = 0
        self._serial = 0
        self._orders = itertools.count(1)

    def __repr__(self) -> str:
        return f"FairShare(runs={len(self._runs)}, pending={self.pending})"

    @property
    def runs(self) -> tuple[str, ...]:
        """The runs served, in the order they were added."""
        return tuple(self._runs)

    @property
    def pending(self) -> int:
        """Tasks waiting to be leased, every run's together."""
        self._sync()
        return self._pending

    def set_tables(self, run: str, tables: Sequence[T]) -> None:
        """A run's lease tables, highest priority first (the running phase's, then the tasks
        played ahead); a new run is served at once, a known one keeps its place."""
        self._sync()  # every run's figures current: the layout below marks them all read
        state = self._runs.get(run)
        if state is None:
            state = self._runs[run] = _Run(run, next(self._orders))
            # Until its own results say, its tasks weigh what the others' do on average.
            known = [s.task_s for s in self._runs.values() if s is not state]
            state.task_s = sum(known) / len(known) if known else 1.0
        state.tables = tuple(tables)
        self._lay_out()
        self._refresh(state)

    def set_task_seconds(self, run: str, seconds: float | None) -> None:
        """What one of a run's tasks keeps a worker busy, lately; its work in flight is its tasks
        in flight times this. None, 0, NaN or infinite change nothing (nothing measured yet);
        a change under TASK_SECONDS_STEP keeps the run's place (fewer heap entries)."""
        state = self._runs.get(run)
        if state is None or seconds is None or not (0 < seconds < math.inf):
            return
        if abs(seconds - state.task_s) <= TASK_SECONDS_STEP * state.task_s:
            return
        self._sync()
        state.task_s = seconds
        self._refresh(state)

    def remove(self, run: str) -> None:
        """Stops serving a run (done, or stopped); what it has in flight is its own business."""
        self._sync()
        state = self._runs.pop(run, None)
        if state is None:
            return
        self._pending -= state.pending
        state.entry = None  # its heap entries are stale
        self._lay_out()

    def in_flight(self, run: str) -> int:
        """The run's tasks leased and not yet done, every table of it together."""
        state = self._runs[run]
        self._sync()
        return state.in_flight

    def lease(
        self,
        worker_id: str,
        max_tasks: int,
        now: float,
        fleet_slots: int = 0,
        workers: Collection[str] = (),
        excluded: Collection[str] = (),
    ) -> list[Drawn[T]]:
        """Up to `max_tasks` pending tasks, from the runs with the least work in flight; backup
        copies (at most one call's worth of one table) only if no run has a pending task.

        `fleet_slots`: how many tasks the workers asking for work ask for together (0: unknown):
        no worker takes more than its share of every run's pending tasks, by the rule one lease
        table applies to its own (master.fleet.leases.LeaseTable.lease). `workers`: those the
        fleet could lease to (LeaseTable.lease: a task this worker failed goes to one of them).
        `excluded`: runs this worker is given nothing of (it cannot build their env, or refuses
        them); their pending tasks still count as pending, so it gets no backup copy meanwhile.
        """
        if max_tasks < 1:
            return []
        self._sync()
        pending = self._pending
        if fleet_slots > 0 and pending:
            share = -(-pending * max_tasks // max(fleet_slots, max_tasks))
            max_tasks = min(max_tasks, max(1, share))
        drawn = self._lease_fresh(worker_id, max_tasks, now, workers, excluded)
        if drawn or self._pending:
            # A worker a table held off (near its phase's end the last tasks go to workers
            # holding none of them) gets no backup either: pending work comes first.
            return drawn
        return self._lease_backups(worker_id, max_tasks, now, excluded)

    def _lease_fresh(
        self,
        worker_id: str,
        wanted: int,
        now: float,
        workers: Collection[str],
        excluded: Collection[str],
    ) -> list[Drawn[T]]:
        drawn: list[Drawn[T]] = []
        refused: set[str] = set(excluded)
        # Each round either fills what is left, or a run gave fewer than it was given to lease
        # (a table held this worker off) and is not asked again: at most one round per run.
        while wanted > 0:
            runs = self._first(wanted, refused)
            if not runs:
                break
            for state, count in _levelled(runs, wanted).items():
                taken = self._lease_run(state, worker_id, count, now, workers)
                granted = sum(len(d.tasks) for d in taken)
                if granted < count:
                    refused.add(state.name)
                if granted:
                    self._mark_served(state)
                self._refresh(state)  # its tables moved (leases, and lapsed ones re-queued)
                drawn += taken
                wanted -= granted
        return drawn

    def _first(self, count: int, skipped: Collection[str]) -> list[_Run[T]]:
        """Up to `count` runs with pending tasks, none of `skipped`, least work in flight first
        (ties: least recently served, then first added). Levelling `count` tasks gives to these
        alone: a run is first given one only once every run before it was."""
        heap = self._heap
        found: list[_Run[T]] = []
        looked_at: list[tuple[float, int, int, _Run[T]]] = []
        while heap:
            entry = heap[0]
            state = entry[3]
            if state.entry is not entry or not state.pending:
                # Stale (the run's figures moved, or it is no longer served), or no work.
                heapq.heappop(heap)
                if state.entry is entry:
                    state.queued = False
                continue
            if state.name not in skipped:
                found.append(state)
                if len(found) == count:
                    break  # the last one found stays on top
            looked_at.append(heapq.heappop(heap))
        for entry in looked_at:
            heapq.heappush(heap, entry)
        return found

    def _lease_run(
        self, state: _Run[T], worker_id: str, count: int, now: float, workers: Collection[str]
    ) -> list[Drawn[T]]:
        """Up to `count` fresh tasks of one run, its tables in priority order."""
        drawn: list[Drawn[T]] = []
        for table in state.tables:
            if count <= 0:
                break
            if table.complete or not table.pending:
                continue
            tasks = table.lease(worker_id, count, now, backups=False, workers=workers)
            if tasks:
                drawn.append(Drawn(state.name, table, tuple(tasks)))
                count -= len(tasks)
        return drawn

    def _lease_backups(
        self, worker_id: str, max_tasks: int, now: float, excluded: Collection[str]
    ) -> list[Drawn[T]]:
        entries = sorted(s.entry for s in self._runs.values() if s.name not in excluded and s.entry)
        for *_, state in entries:
            for table in state.tables:
                if table.complete:
                    continue
                tasks = table.lease_backups(worker_id, max_tasks, now)
                if tasks:
                    self._mark_served(state)
                    self._refresh(state)
                    return [Drawn(state.name, table, tuple(tasks), backup=True)]
        return []  # the tables asked may have moved (lapsed leases): the next call reads them

    def _mark_served(self, state: _Run[T]) -> None:
        self._serial += 1
        state.served = self._serial

    def _sync(self) -> None:
        """Reads again the runs whose tables changed since their figures were last read."""
        changes = [table.changes for table in self._tables]
        seen = self._seen
        if changes == seen:
            return
        for i in itertools.compress(range(len(changes)), map(operator.ne, changes, seen)):
            if seen[i] != changes[i]:  # not yet read with another table of its run
                self._refresh(self._owners[i])

    def _refresh(self, state: _Run[T]) -> None:
        """Reads a run's figures from its tables, and keeps its place in the heap."""
        pending = in_flight = 0
        for i, table in enumerate(state.tables, state.first):
            pending += table.pending
            in_flight += table.leased
            self._seen[i] = table.changes
        self._pending += pending - state.pending
        state.pending, state.in_flight = pending, in_flight
        entry, load = state.entry, state.load
        if entry is None or entry[0] != load or entry[1] != state.served:
            state.entry = (load, state.served, state.order, state)
            state.queued = False
        if pending and not state.queued:
            self._push(state)

    def _push(self, state: _Run[T]) -> None:
        heap = self._heap
        heapq.heappush(heap, state.entry)
        state.queued = True
        if len(heap) > 2 * len(self._runs) + 16:
            # Stale entries left behind by runs whose figures moved: dropped all at once, which
            # costs one pass over the runs for every run's worth of entries pushed.
            heap[:] = []
            for run in self._runs.values():
                run.queued = bool(run.pending and run.entry)
                if run.queued:
                    heap.append(run.entry)
            heapq.heapify(heap)

    def _lay_out(self) -> None:
        """Lists every run's tables in one, each as read now (callers read or refresh first)."""
        tables: list[T] = []
        owners: list[_Run[T]] = []
        for state in self._runs.values():
            state.first = len(tables)
            tables += state.tables
            owners += [state] * len(state.tables)
        self._tables, self._owners = tables, owners
        self._seen = [table.changes for table in tables]


def _levelled(runs: list[_Run[T]], wanted: int) -> dict[_Run[T], int]:
    """How many of `wanted` tasks each run gives: one at a time to the run with the least work
    in flight (counting those given), the least recently served first, each run at most its
    pending tasks."""
    if len(runs) == 1:
        return {runs[0]: min(wanted, runs[0].pending)}
    heap = [(s.load, s.served, s.order, s) for s in runs]
    heapq.heapify(heap)
    given: dict[_Run[T], int] = {}
    while heap and wanted > 0:
        level, served, order, state = heapq.heappop(heap)
        given[state] = given.get(state, 0) + 1
        wanted -= 1
        if given[state] < state.pending:
            heapq.heappush(heap, (level + state.task_s, served, order, state))
    return given
