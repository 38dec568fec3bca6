"""The Fleet: the workers' side of a run, the one object the gRPC edge and the loop talk to.

It answers the workers' calls (lease, report, heartbeat, release, presence) and evaluates the
run's phases on them, each job in its own module: the phases and their leases
(master.fleet.phases), who asks for work (master.fleet.pacing), the presence calls
(master.fleet.presence), the run's end (master.fleet.completion), and the workers themselves
(master.fleet.roster), which hears of every call answered here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from master.algorithms.base import EvaluationRequest
from master.fleet.completion import RunCompletion
from master.fleet.leases import Disposition, LeaseCounters, PhaseTask
from master.fleet.pacing import LeasePacing
from master.fleet.phases import FleetSettings, PhaseLoop, PhaseOutcome, TaskExtras, TaskOutcome
from master.fleet.presence import MAX_ATTACHED, Presence
from master.fleet.roster import STATUS_WORKERS, WORKER_SEEN_WINDOW_S, WorkerRoster, WorkerStats


@dataclass(frozen=True)
class FleetFigures:
    """Where the fleet stands, as a snapshot of the run reads it."""

    counters: LeaseCounters
    workers: int
    """Workers that called in the last WORKER_SEEN_WINDOW_S seconds."""
    run_complete: bool
    worker_stats: tuple[WorkerStats, ...] = ()


class Fleet:
    """Runs one phase at a time on remote workers; gRPC handlers call lease/report/...

    evaluate() is awaited by the training loop; the other methods are called by the service
    and never block. Time comes from `clock` so tests can drive lease expiry.
    """

    def __init__(
        self, settings: FleetSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self._clock = clock
        self.roster = WorkerRoster()
        """Per-worker figures (contacts, work, rate) for Status and /metrics."""
        self._phases = PhaseLoop(settings, self.roster, clock)
        self._pacing = LeasePacing(settings.retry_after_ms, max_askers=MAX_ATTACHED)
        self._presence = Presence(MAX_ATTACHED)
        self._completion = RunCompletion(self.roster, settings.lease_seconds, clock)

    # -- the run's side: phases, counters, the run's end --------------------------------------

    async def evaluate(
        self,
        requests: Sequence[EvaluationRequest],
        recorded: Mapping[str, tuple[Sequence[float], int]] | None = None,
        recorded_extras: Mapping[str, TaskExtras] | None = None,
    ) -> PhaseOutcome:
        """Hands the requests out as tasks and waits until every one is recorded.

        `recorded` holds tasks of this phase already done before a restart (from a
        checkpoint), with what else they carried in `recorded_extras`; they are not handed
        out again.
        """
        return await self._phases.evaluate(requests, recorded, recorded_extras)

    def recorded(self) -> dict[str, tuple[tuple[float, ...], int]]:
        """The current (or an interrupted) phase's recorded tasks; empty between phases."""
        return self._phases.recorded()

    def recorded_extras(self) -> dict[str, TaskExtras]:
        """What the recorded tasks carried besides returns (behaviours, observation sums)."""
        return self._phases.recorded_extras()

    def counters(self) -> LeaseCounters:
        """The running phase's tasks by state, and leases re-issued over the whole run."""
        return self._phases.counters()

    def restore_counters(self, leases_reissued: int) -> None:
        """Continues a resumed run's count of re-issued leases from its checkpoint."""
        self._phases.restore_counters(leases_reissued)

    @property
    def frames_accepted(self) -> int:
        """Frames of every accepted result so far, for throughput figures."""
        return self._phases.frames_accepted

    @property
    def run_complete(self) -> bool:
        return self._completion.complete

    def complete_run(self) -> None:
        """The run is complete: every worker that calls from now on is told so."""
        self._completion.mark()

    def figures(self, workers: bool = False) -> FleetFigures:
        """Where the fleet stands; with `workers`, the per-worker table too."""
        return FleetFigures(
            counters=self.counters(),
            workers=self.workers_connected(),
            run_complete=self.run_complete,
            worker_stats=tuple(self.worker_stats()) if workers else (),
        )

    @property
    def completion_grace_s(self) -> float:
        """How long after the run the master keeps answering, for workers to hear it is over."""
        return self._completion.grace_s

    async def linger(self, poll_s: float = 0.05) -> None:
        """Once the run is complete: returns when every worker seen lately has been told so,
        or after completion_grace_s at most."""
        await self._completion.linger(poll_s)

    # -- the workers' calls -------------------------------------------------------------------

    def lease(self, worker_id: str, max_tasks: int) -> list[PhaseTask]:
        self._seen(worker_id)
        now = self._clock()
        if self.roster.held_off(worker_id, now):
            return []  # it failed every task it got lately while others' results counted
        # Counted between phases too: at a phase's start the workers waiting for it are known.
        fleet_slots = self._pacing.asked(worker_id, max_tasks, now)
        if self._phases.table is None:
            return []
        # A task this worker failed goes to another that asked for work lately, if any.
        workers = self._pacing.askers()
        return self._phases.lease(worker_id, max_tasks, now, fleet_slots, workers)

    def retry_after_ms(self) -> int:
        """How long a worker that got no task waits before it asks again."""
        return self._pacing.retry_after_ms()

    def report_many(self, worker_id: str, outcomes: Sequence[TaskOutcome]) -> list[Disposition]:
        """Records a batch of results and failures; one disposition per outcome, in order.

        Raises ValueError, having recorded nothing, if a result of this phase carries a number
        of episode returns other than its task's.
        """
        self._phases.check(outcomes)
        self._seen(worker_id)  # after validation: a refused report changes nothing
        dispositions = self._phases.record(worker_id, outcomes)
        if self.roster.held_off(worker_id, self._clock()):
            self._pacing.forget(worker_id)  # no longer one that can take a failed task
        return dispositions

    def heartbeat(self, worker_id: str, task_ids: Iterable[str]) -> list[str]:
        """Extends this worker's leases; returns the ids it should drop."""
        self._seen(worker_id)
        return self._phases.heartbeat(worker_id, task_ids)

    def release(self, worker_id: str, task_ids: Iterable[str]) -> int:
        """Hands this worker's unfinished tasks back; returns how many."""
        self._seen(worker_id)
        return self._phases.release(worker_id, task_ids)

    def tell_complete(self, worker_id: str) -> bool:
        """Whether the run is complete; if so, notes that this worker has been told."""
        if not self.run_complete:
            return False
        self._seen(worker_id)
        self._completion.told(worker_id)
        return True

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
            self._phases.withdraw_refusal(worker_id, self._presence.workers())

    # -- refusals: workers that cannot import a module the run needs --------------------------

    def refuse(self, worker_id: str, reason: str) -> None:
        """A worker refuses every task of the run (service.Lease carries why); once every
        attached worker does, the run stops with that error (evaluate raises RunRefused)."""
        self._seen(worker_id)
        self._phases.refuse(worker_id, reason, self._presence.workers())

    def withdraw_refusal(self, worker_id: str) -> None:
        """A worker asks for tasks without refusing: any refusal it made is over."""
        if self._phases.refusing(worker_id):
            self._phases.withdraw_refusal(worker_id, self._presence.workers())

    def refusals(self) -> dict[str, str]:
        """worker id -> why it refuses the run's tasks, for the workers that do."""
        return self._phases.refusals()

    def worker_gone(self, worker_id: str) -> int:
        """A worker's connection closed (service.Attach): its leases end now, not when they
        lapse, and its tasks go to others. Returns how many it held."""
        return self._phases.worker_gone(worker_id)

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
        """Returns when the run is complete or the presence calls are to end."""
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

    def worker_stats(self, limit: int | None = STATUS_WORKERS) -> list[WorkerStats]:
        """Per-worker figures of the `limit` most recently seen workers, by worker id."""
        return self.roster.snapshot(self._clock(), self._phases.holder, limit)

    def tasks_leased_to(self, worker_id: str) -> list[str]:
        """The running phase's tasks whose lease this worker holds (not its backup copies)."""
        table = self._phases.table
        return table.leased_to(worker_id) if table is not None else []

    def _seen(self, worker_id: str) -> None:
        self.roster.seen(worker_id, self._clock())
