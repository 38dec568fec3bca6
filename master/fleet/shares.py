"""Which run's tasks a lease call draws from, when one fleet serves several runs (a study).

Fair share: among the runs with pending tasks, the one with the fewest tasks in flight goes
first (ties: the one served least recently), so no run starves however much work another has,
and a worker holding no task never goes without one while any run has a pending task. A worker
asking for several takes them from several runs, levelling their tasks in flight. Within a run
its tables are drawn from in order: the running phase's before the next phase's tasks played
ahead (master.algorithms.base.Algorithm.ask_ahead). Backup copies of in-flight tasks, which only
cut a phase's tail, are leased only once no run has a pending task.

Pure bookkeeping like master.fleet.leases, whose public calls are all it uses: no asyncio, no
clock of its own (time comes in as an argument).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from master.fleet.leases import LeaseCounters, PhaseTask


class Leasable(Protocol):
    """What the picker uses of a lease table; master.fleet.leases.LeaseTable is one."""

    @property
    def pending(self) -> int: ...
    @property
    def counters(self) -> LeaseCounters: ...
    @property
    def complete(self) -> bool: ...
    def lease(
        self, worker_id: str, max_tasks: int, now: float, fleet_slots: int = 0,
        backups: bool = True, workers: Collection[str] = (),
    ) -> list[PhaseTask]: ...  # fmt: skip
    def lease_backups(self, worker_id: str, max_tasks: int, now: float) -> list[PhaseTask]: ...


T = TypeVar("T", bound=Leasable)


@dataclass(frozen=True)
class Drawn(Generic[T]):
    """The tasks one lease call took from one table of one run."""

    run: str
    table: T
    tasks: tuple[PhaseTask, ...]
    backup: bool = False
    """Backup copies of tasks in flight, not fresh tasks."""


class FairShare(Generic[T]):
    """The runs a fleet serves, each with its lease tables in priority order, and the picker
    that leases across them."""

    def __init__(self) -> None:
        self._tables: dict[str, tuple[T, ...]] = {}
        self._served: dict[str, int] = {}
        """Each run's serial of the last lease call that gave it work; 0: never served."""
        self._serial = 0

    def __repr__(self) -> str:
        return f"FairShare(runs={len(self._tables)}, pending={self.pending})"

    @property
    def runs(self) -> tuple[str, ...]:
        """The runs served, in the order they were added."""
        return tuple(self._tables)

    @property
    def pending(self) -> int:
        """Tasks waiting to be leased, every run's together."""
        return sum(self._pending(run) for run in self._tables)

    def set_tables(self, run: str, tables: Sequence[T]) -> None:
        """A run's lease tables, highest priority first (the running phase's, then the tasks
        played ahead); a new run is served at once, a known one keeps its place."""
        self._tables[run] = tuple(tables)
        self._served.setdefault(run, 0)

    def remove(self, run: str) -> None:
        """Stops serving a run (done, or stopped); what it has in flight is its own business."""
        self._tables.pop(run, None)
        self._served.pop(run, None)

    def in_flight(self, run: str) -> int:
        """The run's tasks leased and not yet done, every table of it together."""
        return sum(table.counters.leased for table in self._tables[run])

    def lease(
        self,
        worker_id: str,
        max_tasks: int,
        now: float,
        fleet_slots: int = 0,
        workers: Collection[str] = (),
        excluded: Collection[str] = (),
    ) -> list[Drawn[T]]:
        """Up to `max_tasks` pending tasks, from the runs with the fewest in flight; backup
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
        pending = self.pending
        if fleet_slots > 0 and pending:
            share = -(-pending * max_tasks // max(fleet_slots, max_tasks))
            max_tasks = min(max_tasks, max(1, share))
        drawn = self._lease_fresh(worker_id, max_tasks, now, workers, excluded)
        if drawn or self.pending:
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
            runs = [run for run in self._tables if run not in refused and self._pending(run)]
            if not runs:
                break
            for run, count in self._levelled(runs, wanted).items():
                taken = self._lease_run(run, worker_id, count, now, workers)
                granted = sum(len(d.tasks) for d in taken)
                if granted < count:
                    refused.add(run)
                if granted:
                    self._mark_served(run)
                drawn += taken
                wanted -= granted
        return drawn

    def _levelled(self, runs: list[str], wanted: int) -> dict[str, int]:
        """How many of `wanted` tasks each run gives: one at a time to the run with the fewest
        in flight (counting those given), the least recently served first, each run at most
        its pending tasks."""
        heap = [(self.in_flight(run), self._served[run], i, run) for i, run in enumerate(runs)]
        heapq.heapify(heap)
        room = {run: self._pending(run) for run in runs}
        given: dict[str, int] = {}
        while heap and wanted > 0:
            level, served, i, run = heapq.heappop(heap)
            given[run] = given.get(run, 0) + 1
            wanted -= 1
            if given[run] < room[run]:
                heapq.heappush(heap, (level + 1, served, i, run))
        return given

    def _lease_run(
        self, run: str, worker_id: str, count: int, now: float, workers: Collection[str]
    ) -> list[Drawn[T]]:
        """Up to `count` fresh tasks of one run, its tables in priority order."""
        drawn: list[Drawn[T]] = []
        for table in self._tables[run]:
            if count <= 0:
                break
            if table.complete or not table.pending:
                continue
            tasks = table.lease(worker_id, count, now, backups=False, workers=workers)
            if tasks:
                drawn.append(Drawn(run, table, tuple(tasks)))
                count -= len(tasks)
        return drawn

    def _lease_backups(
        self, worker_id: str, max_tasks: int, now: float, excluded: Collection[str]
    ) -> list[Drawn[T]]:
        runs = [run for run in self._tables if run not in excluded]
        for run in sorted(runs, key=lambda r: (self.in_flight(r), self._served[r])):
            for table in self._tables[run]:
                if table.complete:
                    continue
                tasks = table.lease_backups(worker_id, max_tasks, now)
                if tasks:
                    self._mark_served(run)
                    return [Drawn(run, table, tuple(tasks), backup=True)]
        return []

    def _pending(self, run: str) -> int:
        return sum(table.pending for table in self._tables[run])

    def _mark_served(self, run: str) -> None:
        self._serial += 1
        self._served[run] = self._serial
