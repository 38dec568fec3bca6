"""Evaluates an algorithm's requests on whatever workers lease them: the seam between the
algorithm and the wire.

The Fleet runs one phase at a time across workers (tasks, leases through master.fleet.leases,
results, behaviours and observation sums); who the workers are is master.fleet.roster's.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from master.algorithms.base import EvaluationRequest
from master.fleet.leases import (
    Disposition,
    LeaseCounters,
    LeaseTable,
    PhaseTask,
    bounded_error,
)
from master.fleet.roster import STATUS_WORKERS, WORKER_SEEN_WINDOW_S, WorkerRoster, WorkerStats
from neuro.observation_stats import ObservationStats

log = logging.getLogger(__name__)
ERROR_LOG_LINES = 10
ERROR_LOG_WINDOW_S = 60.0
"""Task failures are logged at most ERROR_LOG_LINES times per window; the rest are counted."""
MAX_ATTACHED = 20_000
"""Workers whose presence (service.Attach) is watched at once; more are refused and fall back
on their leases lapsing."""
IDLE_POLLS_PER_S = 1000.0
"""Empty Lease calls a whole fleet makes per second, about: a worker that got nothing waits
longer the bigger the fleet (10,000 workers: 10 s each, jittered), so that idle workers at a
phase's end do not swamp the master's one core, while enough of them still call each second
that new tasks and backup copies go out at once."""
FLEET_SIZE_REFRESH_S = 1.0
"""How often the fleet's size (for each worker's share of a phase's tasks) is counted again."""
RUN_COMPLETE_GRACE_S = 10.0
"""After the run, how long past a worker's heartbeat interval the master keeps answering, so
that busy or backing-off workers still hear the run is complete (worker.client paces
heartbeats at a quarter lease, at most 300 s, and backs off at most 5 s)."""


@dataclass(frozen=True)
class PhaseOutcome:
    """The episode returns of every request of one phase, and what they cost."""

    returns: dict[str, list[float]]
    frames: int
    episodes: int
    behaviours: dict[str, np.ndarray] | None = None
    """Per request key, (episodes, behaviour_size) float32; NaN rows where evaluation failed.
    None unless the run asks for behaviours."""
    observations: ObservationStats | None = None
    """The sums of the phase's observations (accepted results only); None if none came."""
    tail_s: float = 0.0
    """Seconds from the phase's last fresh lease to its end."""
    backup_tasks: int = 0
    backup_wins: int = 0
    workers_lost: int = 0


class TaskExtras(NamedTuple):
    """What an accepted result carried besides returns and frames."""

    behaviours: np.ndarray | None = None
    """(episodes, behaviour_size) float32."""
    observations: ObservationStats | None = None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {}
        if self.behaviours is not None:
            document["behaviours"] = self.behaviours.tolist()
        if self.observations is not None:
            document["observations"] = self.observations.to_json()
        return document

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> TaskExtras:
        """Inverse of to_json (float32 behaviours round-trip exactly through JSON's doubles)."""
        behaviours = document.get("behaviours")
        stats = document.get("observations")
        return cls(
            None if behaviours is None else np.array(behaviours, dtype=np.float32),
            None if stats is None else ObservationStats.from_json(stats),
        )


class TaskOutcome(NamedTuple):
    """One reported task: its episode returns and frames, or the error that stopped it."""

    task_id: str
    returns: Sequence[float]
    frames: int
    error: str = ""
    behaviours: np.ndarray | None = None
    """(episodes, behaviour_size) float32, when the run asks for behaviours."""
    observations: ObservationStats | None = None


@dataclass(frozen=True)
class FleetSettings:
    run_id: str
    run_seed: int
    lease_seconds: float = 60.0
    max_attempts: int = 5
    episodes_per_task: int = 1
    retry_after_ms: int = 200
    behaviour_size: int = 0
    """> 0: results carry each episode's behaviour characterisation of this size."""
    backups: bool = True
    """Lease backup copies of in-flight tasks to idle workers once nothing is pending."""


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
        self._interrupted_extras: dict[str, TaskExtras] = {}
        self._observations: ObservationStats | None = None
        """The running phase's accepted observation sums so far, to refuse a result that would
        take them past what a normaliser can use (the phase's own sum is made at its end)."""
        self._phase_done = asyncio.Event()
        self.roster = WorkerRoster()
        """Per-worker figures (contacts, work, rate) for Status and /metrics."""
        self._finished_task_ids: set[str] = set()
        self._run_complete = False
        self._completed = asyncio.Event()
        self._presence_closed = asyncio.Event()
        self._attached: dict[str, int] = {}
        """worker id -> the token of its live Attach call (the newest, if it reconnected)."""
        self._attach_tokens = itertools.count(1)
        self._askers: OrderedDict[str, tuple[float, int]] = OrderedDict()
        """When each worker last asked for work and for how many tasks, most recent last (at
        most MAX_ATTACHED)."""
        self._fleet_size_at, self._fleet_size_count, self._fleet_slots = -float("inf"), 0, 0
        self._jitter = random.Random()
        self._error_log = _RateLimitedLog(ERROR_LOG_LINES, ERROR_LOG_WINDOW_S)
        self.reissued_total = 0
        self.frames_accepted = 0
        """Frames of every accepted result so far, for throughput figures."""

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
        if self._table is not None:
            raise RuntimeError("a phase is already running")
        tasks = split_into_tasks(requests, self.settings)
        table = LeaseTable(tasks, self.settings.lease_seconds, self.settings.max_attempts,
                           backups=self.settings.backups)  # fmt: skip
        extras = recorded_extras or {}
        self._observations = None
        for task_id, (returns, frames) in (recorded or {}).items():
            if task_id in table:
                extra = extras.get(task_id)
                table.complete_task(task_id, returns, frames, extras=extra)
                if extra is not None:
                    self._observations = _plus(self._observations, extra.observations)
        self._phase_done.clear()
        self._table = table
        try:
            while not table.complete:
                # Lapsed leases are also re-issued on every lease call; this wakes up for the
                # case where no worker is asking. asyncio.timeout, not wait_for: on Python
                # 3.11 wait_for swallows a cancel (SIGTERM) that arrives as the phase
                # completes, and the run would go on.
                try:
                    async with asyncio.timeout(self.settings.lease_seconds):
                        await self._phase_done.wait()
                except TimeoutError:
                    self._expire()
        finally:
            self._table = None
            self.roster.phase_ended()
            self.reissued_total += table.reissued
            # Cancelled mid-phase (shutdown): what was recorded still goes into the checkpoint.
            self._interrupted = {} if table.complete else table.done()
            self._interrupted_extras = {} if table.complete else table.extras()
        # Only the last phase's ids are kept: enough to tell a late duplicate from a stranger
        # without growing with the run.
        self._finished_task_ids = {t.task_id for t in tasks}
        episodes = sum(t.episodes for t in tasks)
        behaviours, observations = self._extras_of(table)
        tail = table.tail
        fresh = tail.last_fresh_lease
        return PhaseOutcome(
            table.results(), table.frames, episodes, behaviours, observations,
            tail_s=0.0 if fresh is None else max(0.0, self._clock() - fresh),
            backup_tasks=tail.backups, backup_wins=tail.backups_won,
            workers_lost=tail.workers_lost,
        )  # fmt: skip

    def _extras_of(
        self, table: LeaseTable
    ) -> tuple[dict[str, np.ndarray] | None, ObservationStats | None]:
        """The phase's behaviours per request key and its summed observations."""
        extras = table.extras()
        observations = None
        for extra in extras.values():
            if extra.observations is not None:
                stats = extra.observations
                observations = stats if observations is None else observations + stats
        size = self.settings.behaviour_size
        if not size:
            return None, observations
        rows: dict[str, list[np.ndarray]] = {}
        for task in table.tasks():
            extra = extras.get(task.task_id)
            if extra is None or extra.behaviours is None:  # failed: no behaviour to compare
                block = np.full((task.episodes, size), np.nan, dtype=np.float32)
            else:
                block = extra.behaviours
            rows.setdefault(task.request_key, []).append(block)
        return {key: np.concatenate(blocks) for key, blocks in rows.items()}, observations

    def lease(self, worker_id: str, max_tasks: int) -> list[PhaseTask]:
        self._seen(worker_id)
        if self._table is None:
            return []
        now = self._clock()
        self._askers[worker_id] = (now, max_tasks)
        self._askers.move_to_end(worker_id)
        if len(self._askers) > MAX_ATTACHED:
            self._askers.popitem(last=False)
        self._count_fleet(now)
        granted = self._table.lease(worker_id, max_tasks, now, self._fleet_slots)
        self.roster.holding(worker_id, (task.task_id for task in granted))
        return granted

    def report_many(self, worker_id: str, outcomes: Sequence[TaskOutcome]) -> list[Disposition]:
        """Records a batch of results and failures; one disposition per outcome, in order.

        Raises ValueError, having recorded nothing, if a result of this phase carries a number
        of episode returns other than its task's.
        """
        table = self._table
        if table is None:
            self._seen(worker_id)
            return [self._unknown(outcome.task_id) for outcome in outcomes]
        trial = self._observations
        for task_id, returns, _, error, _, sums in outcomes:
            expected = table.episodes_of(task_id)
            if not error and expected is not None and expected != len(returns):
                raise ValueError(
                    f"task {task_id[:80]}: {len(returns)} episode_returns, "
                    f"the task has {expected} episodes"
                )
            if not error and expected is not None:
                try:
                    trial = _plus(trial, sums)
                except ValueError as problem:
                    raise ValueError(
                        f"task {task_id[:80]}: its observation sums and the phase's do not add "
                        f"up to usable ones ({problem})"
                    ) from None
        self._seen(worker_id)  # after validation: a refused report changes nothing
        dispositions = []
        episodes_accepted = frames_accepted = 0
        try:
            for task_id, returns, frames, error, behaviours, observations in outcomes:
                if error:
                    disposition = table.fail_task(task_id, error, worker_id)
                    if disposition is Disposition.ACCEPTED:
                        self._log_failure(worker_id, task_id, error)
                else:
                    extras = None
                    if behaviours is not None or observations is not None:
                        extras = TaskExtras(behaviours, observations)
                    disposition = table.complete_task(task_id, returns, frames, worker_id, extras)
                    if disposition is Disposition.ACCEPTED:
                        episodes_accepted += len(returns)
                        frames_accepted += frames
                        self._observations = _plus(self._observations, observations)
                if disposition is Disposition.STALE:
                    disposition = self._unknown(task_id)
                dispositions.append(disposition)
        finally:
            self.frames_accepted += frames_accepted
            self.roster.not_holding(worker_id, (outcome.task_id for outcome in outcomes))
            if episodes_accepted:
                self.roster.credit(worker_id, episodes_accepted, frames_accepted, self._clock())
            self._wake_if_complete()
        return dispositions

    def heartbeat(self, worker_id: str, task_ids: Iterable[str]) -> list[str]:
        self._seen(worker_id)
        if self._table is None:
            return list(task_ids)
        task_ids = list(task_ids)
        dropped = self._table.heartbeat(worker_id, task_ids, self._clock())
        self.roster.not_holding(worker_id, dropped)
        gone = set(dropped)
        self.roster.holding(worker_id, (t for t in task_ids if t not in gone))
        return dropped

    @property
    def run_complete(self) -> bool:
        return self._run_complete

    @run_complete.setter
    def run_complete(self, value: bool) -> None:
        self._run_complete = value
        if value:
            self._completed.set()

    @property
    def presence_closed(self) -> bool:
        return self._presence_closed.is_set()

    def close_presence(self) -> None:
        """The master is stopping: every presence call ends now (service.Attach), inside the
        server's grace, rather than being cut at its end."""
        self._presence_closed.set()

    async def until_complete_or_closed(self) -> None:
        """Returns when the run is complete or the presence calls are to end."""
        waits = [asyncio.ensure_future(e.wait()) for e in (self._completed, self._presence_closed)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def attach(self, worker_id: str) -> int | None:
        """A worker's presence call opened: a token for detach(), None if too many are open."""
        if worker_id not in self._attached and len(self._attached) >= MAX_ATTACHED:
            return None
        self._seen(worker_id)
        token = self._attached[worker_id] = next(self._attach_tokens)
        return token

    def detach(self, worker_id: str, token: int) -> None:
        """A worker's presence call ended. Unless a newer one of the same worker replaced it,
        the worker is gone (its process killed, its host or network lost: a worker leaving
        in order handed its tasks back first, and then holds nothing)."""
        if self._attached.get(worker_id) != token:
            return
        del self._attached[worker_id]
        self.worker_gone(worker_id)

    def workers_attached(self) -> int:
        return len(self._attached)

    def worker_gone(self, worker_id: str) -> int:
        """A worker's connection closed (service.Attach): its leases end now, not when they
        lapse, and its tasks go to others. Returns how many it held."""
        if self._table is None:
            return 0
        held = self._table.worker_gone(worker_id)
        if held:
            log.info("worker %r is gone: its %d task(s) go to other workers", worker_id, held)
            self.roster.holds_nothing(worker_id)
        self._wake_if_complete()
        return held

    def release(self, worker_id: str, task_ids: Iterable[str]) -> int:
        self._seen(worker_id)
        if self._table is None:
            return 0
        task_ids = list(task_ids)
        self.roster.not_holding(worker_id, task_ids)
        return self._table.release(worker_id, task_ids)

    def recorded(self) -> dict[str, tuple[tuple[float, ...], int]]:
        """The current (or an interrupted) phase's recorded tasks; empty between phases."""
        return self._table.done() if self._table is not None else dict(self._interrupted)

    def recorded_extras(self) -> dict[str, TaskExtras]:
        """What the recorded tasks carried besides returns (behaviours, observation sums)."""
        if self._table is not None:
            return self._table.extras()  # type: ignore[return-value]
        return dict(self._interrupted_extras)

    def counters(self) -> LeaseCounters:
        if self._table is None:
            return LeaseCounters(0, 0, 0, self.reissued_total)
        c = self._table.counters
        return LeaseCounters(c.pending, c.leased, c.done, self.reissued_total + c.reissued)

    def workers_connected(self) -> int:
        """Workers that called in the last WORKER_SEEN_WINDOW_S seconds."""
        return self.roster.connected(self._clock(), WORKER_SEEN_WINDOW_S)

    def workers_tracked(self) -> int:
        """Workers in the worker table (at most MAX_WORKERS_TRACKED)."""
        return len(self.roster)

    def worker_stats(self, limit: int | None = STATUS_WORKERS) -> list[WorkerStats]:
        """Per-worker figures of the `limit` most recently seen workers, by worker id."""
        table = self._table
        holder = table.holder if table is not None else _nobody
        return self.roster.snapshot(self._clock(), holder, limit)

    def tell_complete(self, worker_id: str) -> bool:
        """Whether the run is complete; if so, notes that this worker has been told."""
        if not self.run_complete:
            return False
        self._seen(worker_id)
        self.roster.told_complete(worker_id)
        return True

    @property
    def completion_grace_s(self) -> float:
        """How long after the run the master keeps answering, for workers to hear it is over."""
        heartbeat_s = min(self.settings.lease_seconds / 4, 300.0)
        return heartbeat_s + RUN_COMPLETE_GRACE_S

    async def linger(self, poll_s: float = 0.05) -> None:
        """Once the run is complete: returns when every worker seen lately has been told so.

        Remote workers learn it only by calling, and one whose master is gone retries forever
        (--give-up-after 0). A worker silent for completion_grace_s is taken to be gone; the
        wait never exceeds completion_grace_s.
        """
        grace = self.completion_grace_s
        deadline = self._clock() + grace
        while self._clock() < deadline and self.roster.untold(self._clock(), grace):
            await asyncio.sleep(poll_s)

    def _log_failure(self, worker_id: str, task_id: str, error: str) -> None:
        # repr: the text comes from the worker and may hold newlines or terminal escapes.
        self._error_log.warning(
            self._clock(),
            "task %r failed on worker %r: %r",
            task_id[:80],
            worker_id,
            bounded_error(error),
        )

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

    def retry_after_ms(self) -> int:
        """How long a worker that got no task waits before it asks again."""
        base = self.settings.retry_after_ms
        spread = self._fleet_size_count * 1000.0 / IDLE_POLLS_PER_S
        if spread <= base:
            return base
        # Jittered: the fleet's polls spread evenly over time, not in waves.
        return int(spread * self._jitter.uniform(0.5, 1.5))

    def _count_fleet(self, now: float) -> None:
        """The workers that asked for work in the last WORKER_SEEN_WINDOW_S seconds (those that
        share a phase's tasks; a worker that only watches or reports is not one) and the tasks
        they ask for together, counted at most once a second."""
        if now - self._fleet_size_at >= FLEET_SIZE_REFRESH_S or now < self._fleet_size_at:
            self._fleet_size_at, horizon = now, now - WORKER_SEEN_WINDOW_S
            while self._askers and next(iter(self._askers.values()))[0] < horizon:
                self._askers.popitem(last=False)
            self._fleet_size_count = len(self._askers)
            self._fleet_slots = sum(slots for _, slots in self._askers.values())

    def _seen(self, worker_id: str) -> None:
        self.roster.seen(worker_id, self._clock())


def _nobody(task_id: str) -> None:
    return None


def _plus(total: ObservationStats | None, more: ObservationStats | None) -> ObservationStats | None:
    """total + more, either of which may be None; ValueError if the sum is no valid sums."""
    if more is None:
        return total
    sums = more if total is None else total + more
    sums.normaliser()  # raises if it would be of no use
    return sums


class _RateLimitedLog:
    """At most `lines` warnings per `window_s`; the next one logged says how many were held."""

    def __init__(self, lines: int, window_s: float) -> None:
        self._lines = lines
        self._window_s = window_s
        self._window_start = -float("inf")
        self._logged = self._held = 0

    def warning(self, now: float, message: str, *args: object) -> None:
        if now - self._window_start >= self._window_s:
            self._window_start, self._logged = now, 0
        if self._logged >= self._lines:
            self._held += 1
            return
        self._logged += 1
        if self._held:
            message += f" ({self._held} more not logged)"
            self._held = 0
        log.warning(message, *args)
