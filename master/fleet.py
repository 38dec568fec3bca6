"""Evaluates GA requests on whatever workers lease them: the seam between the GA and the wire."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from master.ga import EvaluationRequest
from master.leases import Disposition, LeaseCounters, LeaseTable, PhaseTask

WORKER_SEEN_WINDOW_S = 60.0


@dataclass(frozen=True)
class PhaseOutcome:
    """The episode returns of every request of one phase, and what they cost."""

    returns: dict[str, list[float]]
    frames: int
    episodes: int


class TaskOutcome(NamedTuple):
    """One reported task: its episode returns and frames, or the error that stopped it."""

    task_id: str
    returns: Sequence[float]
    frames: int
    error: str = ""


@dataclass(frozen=True)
class FleetSettings:
    run_id: str
    run_seed: int
    lease_seconds: float = 60.0
    max_attempts: int = 5
    episodes_per_task: int = 1
    retry_after_ms: int = 200


def env_seed_for(run_seed: int, task_id: str) -> int:
    """A task's env seed: fixed by the run seed and the task id, whichever worker runs it."""
    return env_seeds(run_seed)(task_id)


def env_seeds(run_seed: int) -> Callable[[str], int]:
    """env_seed_for with the run seed fixed; the "run_seed:" prefix is hashed once."""
    prefix = hashlib.blake2b(f"{run_seed}:".encode(), digest_size=8)

    def seed(task_id: str) -> int:
        hasher = prefix.copy()
        hasher.update(task_id.encode())
        return int.from_bytes(hasher.digest(), "little") >> 1

    return seed


def split_into_tasks(
    requests: Sequence[EvaluationRequest], settings: FleetSettings
) -> list[PhaseTask]:
    """One task per `episodes_per_task` episodes, so long re-evaluations spread over workers."""
    tasks = []
    per_task, seed = settings.episodes_per_task, env_seeds(settings.run_seed)
    for request in requests:
        for first in range(0, request.episodes, per_task):
            count = min(per_task, request.episodes - first)
            task_id = f"{request.key}/{first}"
            tasks.append(PhaseTask(task_id, request.key, request.genome, count, seed(task_id)))
    return tasks


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
        self._table: LeaseTable | None = None
        self._interrupted: dict[str, tuple[tuple[float, ...], int]] = {}
        self._phase_done = asyncio.Event()
        self._workers_seen: dict[str, float] = {}
        self._finished_task_ids: set[str] = set()
        self.run_complete = False
        self.reissued_total = 0
        self.frames_accepted = 0
        """Frames of every accepted result so far, for throughput figures."""

    async def evaluate(
        self,
        requests: Sequence[EvaluationRequest],
        recorded: Mapping[str, tuple[Sequence[float], int]] | None = None,
    ) -> PhaseOutcome:
        """Hands the requests out as tasks and waits until every one is recorded.

        `recorded` holds tasks of this phase already done before a restart (from a
        checkpoint); they are not handed out again.
        """
        if self._table is not None:
            raise RuntimeError("a phase is already running")
        tasks = split_into_tasks(requests, self.settings)
        table = LeaseTable(tasks, self.settings.lease_seconds, self.settings.max_attempts)
        for task_id, (returns, frames) in (recorded or {}).items():
            if task_id in table:
                table.complete_task(task_id, returns, frames)
        self._phase_done.clear()
        self._table = table
        try:
            while not table.complete:
                # Lapsed leases are also re-issued on every lease call; this wakes up for the
                # case where no worker is asking.
                try:
                    await asyncio.wait_for(self._phase_done.wait(), self.settings.lease_seconds)
                except TimeoutError:
                    self._expire()
        finally:
            self._table = None
            self.reissued_total += table.reissued
            # Cancelled mid-phase (shutdown): what was recorded still goes into the checkpoint.
            self._interrupted = {} if table.complete else table.done()
        # Only the last phase's ids are kept: enough to tell a late duplicate from a stranger
        # without growing with the run.
        self._finished_task_ids = {t.task_id for t in tasks}
        episodes = sum(t.episodes for t in tasks)
        return PhaseOutcome(table.results(), table.frames, episodes)

    def lease(self, worker_id: str, max_tasks: int) -> list[PhaseTask]:
        self._seen(worker_id)
        if self._table is None:
            return []
        return self._table.lease(worker_id, max_tasks, self._clock())

    def report_many(self, worker_id: str, outcomes: Sequence[TaskOutcome]) -> list[Disposition]:
        """Records a batch of results and failures; one disposition per outcome, in order.

        Raises ValueError, having recorded nothing, if a result of this phase carries a number
        of episode returns other than its task's.
        """
        table = self._table
        if table is None:
            self._seen(worker_id)
            return [self._unknown(outcome.task_id) for outcome in outcomes]
        for task_id, returns, _, error in outcomes:
            expected = table.episodes_of(task_id)
            if not error and expected is not None and expected != len(returns):
                raise ValueError(
                    f"task {task_id[:80]}: {len(returns)} episode_returns, "
                    f"the task has {expected} episodes"
                )
        self._seen(worker_id)  # after validation: a refused report changes nothing
        dispositions = []
        try:
            for task_id, returns, frames, error in outcomes:
                if error:
                    disposition = table.fail_task(task_id, error)
                else:
                    disposition = table.complete_task(task_id, returns, frames)
                    if disposition is Disposition.ACCEPTED:
                        self.frames_accepted += frames
                if disposition is Disposition.STALE:
                    disposition = self._unknown(task_id)
                dispositions.append(disposition)
        finally:
            self._wake_if_complete()
        return dispositions

    def heartbeat(self, worker_id: str, task_ids: Iterable[str]) -> list[str]:
        self._seen(worker_id)
        if self._table is None:
            return list(task_ids)
        return self._table.heartbeat(worker_id, task_ids, self._clock())

    def release(self, worker_id: str, task_ids: Iterable[str]) -> int:
        self._seen(worker_id)
        if self._table is None:
            return 0
        return self._table.release(worker_id, task_ids)

    def recorded(self) -> dict[str, tuple[tuple[float, ...], int]]:
        """The current (or an interrupted) phase's recorded tasks; empty between phases."""
        return self._table.done() if self._table is not None else dict(self._interrupted)

    def counters(self) -> LeaseCounters:
        if self._table is None:
            return LeaseCounters(0, 0, 0, self.reissued_total)
        c = self._table.counters
        return LeaseCounters(c.pending, c.leased, c.done, self.reissued_total + c.reissued)

    def workers_connected(self) -> int:
        horizon = self._clock() - WORKER_SEEN_WINDOW_S
        return sum(1 for seen in self._workers_seen.values() if seen >= horizon)

    def _unknown(self, task_id: str) -> Disposition:
        # A task of an earlier phase was done already; anything else is not ours.
        if task_id in self._finished_task_ids:
            return Disposition.DUPLICATE
        return Disposition.STALE

    def _expire(self) -> None:
        if self._table is not None:
            self._table.expire(self._clock())
            self._wake_if_complete()

    def _wake_if_complete(self) -> None:
        if self._table is not None and self._table.complete:
            self._phase_done.set()

    def _seen(self, worker_id: str) -> None:
        self._workers_seen[worker_id] = self._clock()
