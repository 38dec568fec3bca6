"""The Fleet: the workers' side of the runs it serves, the one object the gRPC edge talks to.

It answers the workers' calls (lease, report, heartbeat, release, presence) and evaluates each
run's phases on them, each job in its own module: one run's phases and their leases
(master.fleet.phases), which run's tables a lease draws from (master.fleet.shares), who asks
for work (master.fleet.pacing), the presence calls (master.fleet.presence), the end of serving
(master.fleet.completion), and the workers themselves (master.fleet.roster), which hears of
every call answered here.

A fleet serves one run (a master's --env run: `Fleet(settings)`, whose run-side methods are
that run's) or a study's runs, each added with add_run() and trained through its RunFleet. The
task ids workers see are a single run's own; a study's are qualified by the run's key,
"<run key>|<task id>" (qualified()), since Heartbeat and Release name task ids alone. Inside,
each run keeps its own ids, from which its env seeds are derived, so a run in a study plays the
episodes it would play alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from master.algorithms.base import EvaluationRequest
from master.fleet.completion import RunCompletion
from master.fleet.leases import Disposition, LeaseCounters, LeaseTable, PhaseTask
from master.fleet.pacing import LeasePacing
from master.fleet.phases import FleetSettings, PhaseLoop, PhaseOutcome, TaskExtras, TaskOutcome
from master.fleet.presence import MAX_ATTACHED, Presence
from master.fleet.roster import STATUS_WORKERS, WORKER_SEEN_WINDOW_S, WorkerRoster, WorkerStats
from master.fleet.shares import FairShare

T = TypeVar("T")

SEPARATOR = "|"
"""Between a run's key and its task id, in a study's task ids on the wire."""


def qualified(run: str, task_id: str) -> str:
    """A task id as workers see it: the run's own for a single run (key ""), else
    "<run key>|<task id>"."""
    return f"{run}{SEPARATOR}{task_id}" if run else task_id


@dataclass(frozen=True)
class FleetFigures:
    """Where the fleet stands, as a snapshot of the run reads it."""

    counters: LeaseCounters
    workers: int
    """Workers that called in the last WORKER_SEEN_WINDOW_S seconds."""
    run_complete: bool
    worker_stats: tuple[WorkerStats, ...] = ()


class Granted(NamedTuple):
    """Tasks of one run leased by one call, their ids as workers see them."""

    run: str
    """The run's key ("" for a single run)."""
    tasks: tuple[PhaseTask, ...]


class RunFleet:
    """One run's side of the fleet: what its training loop calls (evaluate, counters, the run's
    end), while the workers' calls go to the Fleet."""

    def __init__(self, fleet: Fleet, key: str, phases: PhaseLoop) -> None:
        self._fleet = fleet
        self.key = key
        """The run's key: "" for a single run, else what its task ids are qualified with."""
        self.phases = phases
        self._complete = False

    def __repr__(self) -> str:
        return f"RunFleet({self.key or self.settings.run_id!r}, complete={self._complete})"

    @property
    def settings(self) -> FleetSettings:
        return self.phases.settings

    async def evaluate(
        self,
        requests: Sequence[EvaluationRequest],
        recorded: Mapping[str, tuple[Sequence[float], int]] | None = None,
        recorded_extras: Mapping[str, TaskExtras] | None = None,
        ahead: Sequence[EvaluationRequest] = (),
    ) -> PhaseOutcome:
        """Hands the requests out as tasks and waits until every one is recorded (PhaseLoop).

        `recorded` holds tasks of this phase already done before a restart (from a
        checkpoint), with what else they carried in `recorded_extras`; they are not handed
        out again. `ahead`: the next phase's requests, played meanwhile at lower priority.
        """
        return await self.phases.evaluate(requests, recorded, recorded_extras, ahead)

    def drop_ahead(self) -> None:
        """Stops playing the next phase's tasks ahead (the run will not ask for them)."""
        self.phases.drop_ahead()

    def recorded(self) -> dict[str, tuple[tuple[float, ...], int]]:
        """The current (or an interrupted) phase's recorded tasks; empty between phases."""
        return self.phases.recorded()

    def recorded_extras(self) -> dict[str, TaskExtras]:
        """What the recorded tasks carried besides returns (behaviours, observation sums)."""
        return self.phases.recorded_extras()

    def counters(self) -> LeaseCounters:
        """The running phase's tasks by state, and leases re-issued over the whole run."""
        return self.phases.counters()

    def restore_counters(self, leases_reissued: int) -> None:
        """Continues a resumed run's count of re-issued leases from its checkpoint."""
        self.phases.restore_counters(leases_reissued)

    @property
    def frames_accepted(self) -> int:
        """Frames of every accepted result so far, for throughput figures."""
        return self.phases.frames_accepted

    @property
    def worker_s(self) -> float:
        """Seconds workers spent on this run's accepted results, in this process."""
        return self.phases.worker_s

    @property
    def run_complete(self) -> bool:
        return self._complete

    def complete_run(self) -> None:
        """The run is complete: its tasks are leased no more; a single run's workers are told
        so from now on (a study's, once every run is: Fleet.complete_run)."""
        self._complete = True
        self.phases.drop_ahead()
        self._fleet.run_finished(self.key)

    def figures(self, workers: bool = False) -> FleetFigures:
        """Where the run and the fleet stand; with `workers`, the per-worker table too."""
        fleet = self._fleet
        return FleetFigures(
            counters=self.counters(),
            workers=fleet.workers_connected(),
            run_complete=self._complete,
            worker_stats=tuple(fleet.worker_stats()) if workers else (),
        )

    def workers_connected(self) -> int:
        """Workers that called in the last WORKER_SEEN_WINDOW_S seconds."""
        return self._fleet.workers_connected()


class Fleet:
    """Runs phases on remote workers; gRPC handlers call lease/report/...

    `Fleet(settings)` serves one run, whose training loop calls the run-side methods here
    (evaluate, counters, complete_run, ...); `Fleet()` serves the runs add_run() adds, each
    through its RunFleet. The workers' calls never block. Time comes from `clock` so tests can
    drive lease expiry.
    """

    def __init__(
        self,
        settings: FleetSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        retry_after_ms: int = 200,
        lease_seconds: float = 60.0,
    ) -> None:
        """`retry_after_ms` and `lease_seconds` (for how long workers are told the end): a
        single run's come from its settings."""
        self._clock = clock
        self.roster = WorkerRoster()
        """Per-worker figures (contacts, work, rate) for Status and /metrics."""
        self._runs: dict[str, RunFleet] = {}
        self._share: FairShare[LeaseTable] = FairShare()
        if settings is not None:
            retry_after_ms, lease_seconds = settings.retry_after_ms, settings.lease_seconds
        self._pacing = LeasePacing(retry_after_ms, max_askers=MAX_ATTACHED)
        self._presence = Presence(MAX_ATTACHED)
        self._completion = RunCompletion(self.roster, lease_seconds, clock)
        self._sole: RunFleet | None = None
        if settings is not None:
            self._sole = self.add_run(settings, key="")

    # -- the runs -----------------------------------------------------------------------------

    def add_run(self, settings: FleetSettings, key: str | None = None) -> RunFleet:
        """Serves one more run; its tasks are leased beside the others' from now on.

        `key` (default: the run's id) qualifies its task ids on the wire; "" only for a fleet's
        single run. ValueError if the key is in use or holds the separator.
        """
        key = settings.run_id if key is None else key
        if key in self._runs or SEPARATOR in key or (not key and self._runs):
            raise ValueError(f"run key {key!r} is in use here, or holds {SEPARATOR!r}")

        def on_tables(tables: tuple[LeaseTable, ...]) -> None:
            if key in self._runs and not self._runs[key].run_complete:
                self._share.set_tables(key, tables)

        prefix = qualified(key, "")
        phases = PhaseLoop(settings, self.roster, self._clock, prefix, on_tables)
        run = self._runs[key] = RunFleet(self, key, phases)
        self._share.set_tables(key, phases.tables)
        return run

    def run_finished(self, key: str) -> None:
        """A run's tasks are leased no more (RunFleet.complete_run); a single run's end is the
        fleet's."""
        self._share.remove(key)
        if self._sole is not None and self._sole.key == key:
            self._completion.mark()

    def remove_run(self, key: str) -> None:
        """Stops serving a run: its tasks still held are dropped at their holders' next call."""
        self._share.remove(key)
        self._runs.pop(key, None)

    def runs(self) -> dict[str, RunFleet]:
        """The runs served, by key."""
        return dict(self._runs)

    def run_key(self, task_id: str) -> str | None:
        """The key of the run a wire task id belongs to; None if no run served has it."""
        if self._sole is not None:
            return self._sole.key
        key, separator, _ = task_id.partition(SEPARATOR)
        return key if separator and key in self._runs else None

    # -- a single run's side (Fleet(settings)): its RunFleet's --------------------------------

    @property
    def settings(self) -> FleetSettings:
        return self._single.settings

    @property
    def _single(self) -> RunFleet:
        if self._sole is None:
            raise RuntimeError("this fleet serves several runs: use each one's RunFleet")
        return self._sole

    @property
    def _phases(self) -> PhaseLoop:
        return self._single.phases

    async def evaluate(
        self,
        requests: Sequence[EvaluationRequest],
        recorded: Mapping[str, tuple[Sequence[float], int]] | None = None,
        recorded_extras: Mapping[str, TaskExtras] | None = None,
        ahead: Sequence[EvaluationRequest] = (),
    ) -> PhaseOutcome:
        """The single run's RunFleet.evaluate."""
        return await self._single.evaluate(requests, recorded, recorded_extras, ahead)

    def drop_ahead(self) -> None:
        self._single.drop_ahead()

    def recorded(self) -> dict[str, tuple[tuple[float, ...], int]]:
        """The current (or an interrupted) phase's recorded tasks; empty between phases."""
        return self._single.recorded()

    def recorded_extras(self) -> dict[str, TaskExtras]:
        """What the recorded tasks carried besides returns (behaviours, observation sums)."""
        return self._single.recorded_extras()

    def counters(self) -> LeaseCounters:
        """The running phase's tasks by state, and leases re-issued over the whole run."""
        return self._single.counters()

    def restore_counters(self, leases_reissued: int) -> None:
        """Continues a resumed run's count of re-issued leases from its checkpoint."""
        self._single.restore_counters(leases_reissued)

    @property
    def frames_accepted(self) -> int:
        """Frames of every accepted result so far, for throughput figures."""
        return self._single.frames_accepted

    @property
    def worker_s(self) -> float:
        return self._single.worker_s

    def figures(self, workers: bool = False) -> FleetFigures:
        """Where the single run and the fleet stand; with `workers`, the per-worker table too."""
        figures = self._single.figures(workers)
        return FleetFigures(figures.counters, figures.workers, self.run_complete,
                            figures.worker_stats)  # fmt: skip

    # -- the end of serving -------------------------------------------------------------------

    @property
    def run_complete(self) -> bool:
        """Whether serving is over (a single run's end, or every run of a study's)."""
        return self._completion.complete

    def complete_run(self) -> None:
        """Serving is over: every worker that calls from now on is told so."""
        for run in self._runs.values():
            run._complete = True
            run.phases.drop_ahead()
            self._share.remove(run.key)
        self._completion.mark()

    @property
    def completion_grace_s(self) -> float:
        """How long after the run the master keeps answering, for workers to hear it is over."""
        return self._completion.grace_s

    async def linger(self, poll_s: float = 0.05) -> None:
        """Once serving is over: returns when every worker seen lately has been told so, or
        after completion_grace_s at most."""
        await self._completion.linger(poll_s)

    # -- the workers' calls -------------------------------------------------------------------

    def lease(self, worker_id: str, max_tasks: int) -> list[PhaseTask]:
        """Up to max_tasks tasks for this worker, their ids as workers see them."""
        return [task for granted in self.lease_runs(worker_id, max_tasks) for task in granted.tasks]

    def lease_runs(
        self, worker_id: str, max_tasks: int, excluded: Collection[str] = ()
    ) -> list[Granted]:
        """Up to max_tasks tasks for this worker, by run, none of the `excluded` runs' (by key)
        nor of a run it refuses."""
        self._seen(worker_id)
        now = self._clock()
        if self.roster.held_off(worker_id, now):
            return []  # it failed every task it got lately while others' results counted
        # Counted between phases too: at a phase's start the workers waiting for it are known.
        fleet_slots = self._pacing.asked(worker_id, max_tasks, now)
        refused = []
        for key, run in self._runs.items():
            # Lapsed leases back in the queue first: the picker sees only pending tasks.
            run.phases.expire()
            if run.phases.refusing(worker_id):
                refused.append(key)
        if refused:
            excluded = {*excluded, *refused}
        # A task this worker failed goes to another that asked for work lately, if any.
        workers = self._pacing.askers()
        drawn = []
        first = self._reevaluating(worker_id) if len(self._runs) > 1 else None
        if first is not None and first not in excluded:
            # Its individual's other episodes first (they come next in that run's queue): a
            # per-genome worker plays them in one batched pass, where tasks of several runs'
            # individuals would each take a pass of their own at every step.
            others = {*excluded, *(key for key in self._runs if key != first)}
            drawn = self._share.lease(worker_id, max_tasks, now, fleet_slots, workers, others)
            max_tasks -= sum(len(draw.tasks) for draw in drawn)
        if max_tasks > 0:
            drawn += self._share.lease(worker_id, max_tasks, now, fleet_slots, workers, excluded)
        granted: dict[str, list[PhaseTask]] = {}
        for draw in drawn:
            run = self._runs.get(draw.run)
            if run is None:
                continue
            run.phases.granted(worker_id, draw.tasks)
            tasks = granted.setdefault(draw.run, [])
            if draw.run:
                tasks += (task._replace(task_id=qualified(draw.run, task.task_id))
                          for task in draw.tasks)  # fmt: skip
            else:
                tasks += draw.tasks
        return [Granted(run, tuple(tasks)) for run, tasks in granted.items()]

    def _reevaluating(self, worker_id: str) -> str | None:
        """The run whose individual the worker plays episodes of, when every task it holds is
        of one request split into several tasks (an elite's re-evaluation); None otherwise."""
        found = None
        for key, run in self._runs.items():
            requests = run.phases.reevaluated(worker_id)
            if requests is None or len(requests) > 1 or (requests and found is not None):
                return None
            if requests:
                found = key
        return found

    def retry_after_ms(self) -> int:
        """How long a worker that got no task waits before it asks again."""
        return self._pacing.retry_after_ms()

    def report_many(self, worker_id: str, outcomes: Sequence[TaskOutcome]) -> list[Disposition]:
        """Records a batch of results and failures (wire ids); one disposition per outcome, in
        order.

        Raises ValueError, having recorded nothing, if a result of a running phase carries a
        number of episode returns other than its task's.
        """
        by_run = self._by_run(outcomes, lambda outcome: outcome.task_id)
        for run, _, own in by_run:
            run.phases.check([o._replace(task_id=task_id) for o, task_id in own])
        self._seen(worker_id)  # after validation: a refused report changes nothing
        dispositions: list[Disposition | None] = [None] * len(outcomes)
        for run, places, own in by_run:
            recorded = run.phases.record(worker_id, [o._replace(task_id=t) for o, t in own])
            for place, disposition in zip(places, recorded, strict=True):
                dispositions[place] = disposition
            self._share.set_task_seconds(run.key, run.phases.task_seconds)
        if self.roster.held_off(worker_id, self._clock()):
            self._pacing.forget(worker_id)  # no longer one that can take a failed task
        # Outcomes of no run served here: a finished run's, or not ours.
        return [Disposition.STALE if d is None else d for d in dispositions]

    def heartbeat(self, worker_id: str, task_ids: Iterable[str]) -> list[str]:
        """Extends this worker's leases; returns the ids it should drop."""
        self._seen(worker_id)
        task_ids = list(task_ids)
        kept: set[int] = set()
        for run, places, own in self._by_run(task_ids, lambda task_id: task_id):
            lost = set(run.phases.heartbeat(worker_id, [task_id for _, task_id in own]))
            kept.update(p for p, (_, t) in zip(places, own, strict=True) if t not in lost)
        # In the order asked: done, not its own, or of no run served here.
        return [task_id for place, task_id in enumerate(task_ids) if place not in kept]

    def release(self, worker_id: str, task_ids: Iterable[str]) -> int:
        """Hands this worker's unfinished tasks back; returns how many."""
        self._seen(worker_id)
        released = 0
        for run, _, own in self._by_run(list(task_ids), lambda task_id: task_id):
            released += run.phases.release(worker_id, [task_id for _, task_id in own])
        return released

    def tell_complete(self, worker_id: str) -> bool:
        """Whether serving is over; if so, notes that this worker has been told."""
        if not self.run_complete:
            return False
        self._seen(worker_id)
        self._completion.told(worker_id)
        return True

    def _by_run(
        self, items: Sequence[T], task_id_of: Callable[[T], str]
    ) -> list[tuple[RunFleet, list[int], list[tuple[T, str]]]]:
        """The items (outcomes or ids) of each run served, with their places in `items` and
        each one's task id inside its run; items of no run served are left out."""
        if self._sole is not None:
            items = list(items)
            own = [(item, task_id_of(item)) for item in items]
            return [(self._sole, list(range(len(items))), own)] if items else []
        grouped: dict[str, tuple[RunFleet, list[int], list[tuple[T, str]]]] = {}
        for place, item in enumerate(items):
            key, separator, task_id = task_id_of(item).partition(SEPARATOR)
            run = self._runs.get(key) if separator else None
            if run is None:
                continue
            entry = grouped.setdefault(key, (run, [], []))
            entry[1].append(place)
            entry[2].append((item, task_id))
        return list(grouped.values())

    # -- presence: the workers' Attach calls --------------------------------------------------

    def attach(self, worker_id: str) -> int | None:
        """A worker's presence call opened: a token for detach(), None if too many are open."""
        token = self._presence.attach(worker_id)
        if token is not None:
            self._seen(worker_id)
        return token

    def detach(self, worker_id: str, token: int) -> None:
        """A worker's presence call ended. Unless a newer one of the same worker replaced it,
        the worker is gone (its process killed, its host or network lost: a worker leaving
        in order handed its tasks back first, and then holds nothing)."""
        if self._presence.detach(worker_id, token):
            self._pacing.forget(worker_id)
            self.worker_gone(worker_id)
            # Gone, it refuses nothing; those left may all refuse.
            for run in self._runs.values():
                run.phases.withdraw_refusal(worker_id, self._presence.workers())

    # -- refusals: workers that cannot import a module a run needs ----------------------------

    def refuse(self, worker_id: str, reason: str, run: str | None = None) -> None:
        """A worker refuses every task of a run (by key; None: the single run's), and service.
        Lease carries why; once every attached worker does, that run stops with the error
        (its evaluate raises RunRefused). Its refusals of other runs are over: a worker
        refuses one run at a time."""
        self._seen(worker_id)
        key = self._single.key if run is None else run
        for other_key, other in self._runs.items():
            if other_key == key:
                other.phases.refuse(worker_id, reason, self._presence.workers())
            elif other.phases.refusing(worker_id):
                other.phases.withdraw_refusal(worker_id, self._presence.workers())

    def withdraw_refusal(self, worker_id: str) -> None:
        """A worker asks for tasks without refusing: any refusal it made is over."""
        for run in self._runs.values():
            if run.phases.refusing(worker_id):
                run.phases.withdraw_refusal(worker_id, self._presence.workers())

    def refusals(self) -> dict[str, str]:
        """worker id -> why it refuses a run's tasks, for the workers that do."""
        refusals: dict[str, str] = {}
        for run in self._runs.values():
            for worker_id, reason in run.phases.refusals().items():
                if run.key:
                    reason = f"run {run.settings.run_id}: {reason}"
                refusals[worker_id] = reason
        return refusals

    def worker_gone(self, worker_id: str) -> int:
        """A worker's connection closed (service.Attach): its leases end now, not when they
        lapse, and its tasks go to others. Returns how many it held."""
        return sum(run.phases.worker_gone(worker_id) for run in self._runs.values())

    def workers_attached(self) -> int:
        return len(self._presence)

    @property
    def presence_closed(self) -> bool:
        return self._presence.closed

    def close_presence(self) -> None:
        """The master is stopping: every presence call ends now (service.Attach), inside the
        server's grace, rather than being cut at its end."""
        self._presence.close()

    async def until_complete_or_closed(self) -> None:
        """Returns when serving is over or the presence calls are to end."""
        waits = [asyncio.ensure_future(self._completion.wait()),
                 asyncio.ensure_future(self._presence.wait_closed())]  # fmt: skip
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    # -- the workers, as Status and /metrics show them ----------------------------------------

    def workers_connected(self) -> int:
        """Workers that called in the last WORKER_SEEN_WINDOW_S seconds."""
        return self.roster.connected(self._clock(), WORKER_SEEN_WINDOW_S)

    def workers_tracked(self) -> int:
        """Workers in the worker table (at most MAX_WORKERS_TRACKED)."""
        return len(self.roster)

    def utilisation(self) -> float | None:
        """How busy the workers were lately (WorkerRoster.utilisation); None: unknown yet."""
        return self.roster.utilisation(self._clock())

    def worker_stats(self, limit: int | None = STATUS_WORKERS) -> list[WorkerStats]:
        """Per-worker figures of the `limit` most recently seen workers, by worker id."""
        return self.roster.snapshot(self._clock(), self._holder, limit)

    def tasks_leased_to(self, worker_id: str) -> list[str]:
        """The tasks (wire ids) whose lease this worker holds, not its backup copies."""
        return sorted(qualified(run.key, task_id) for run in self._runs.values()
                      for task_id in run.phases.leased_to(worker_id))  # fmt: skip

    def _holder(self, task_id: str) -> str | None:
        """Who holds the lease of a task (wire id) of a run served here, if anyone does."""
        if self._sole is not None:
            return self._sole.phases.holder(task_id)
        key, _, own = task_id.partition(SEPARATOR)
        run = self._runs.get(key)
        return run.phases.holder(own) if run is not None else None

    def _seen(self, worker_id: str) -> None:
        self.roster.seen(worker_id, self._clock())
