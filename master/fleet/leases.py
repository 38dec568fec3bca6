"""Tasks of one evaluation phase and their leases: PENDING -> LEASED(worker, deadline) -> DONE.

Pure bookkeeping: time comes in as an argument, nothing here blocks or talks to the network.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from master.algorithms.base import Candidate


class Disposition(enum.Enum):
    """What the master did with a reported result."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    STALE = "stale"
    REJECTED = "rejected"
    """The task was never leased to the reporting worker (or it handed the task back)."""


MAX_ERROR_CHARS = 512
"""A worker's error text is kept (and logged) up to this many characters."""
MAX_ERRORS_KEPT = 5
"""Errors kept per task: enough to tell why it failed, whatever max_attempts is."""
FRESH_LEASE_FRACTION = 0.9
"""A heartbeat extends a lease only once less than this fraction of it is left."""


class PhaseTask(NamedTuple):
    """Episodes [first_episode, first_episode + episodes) of one evaluation request."""

    # A NamedTuple rather than a frozen dataclass: one is made per evaluated episode, and
    # it costs a third as much to make.
    task_id: str
    request_key: str
    genome: Candidate
    episodes: int
    env_seed: int


@dataclass(slots=True)
class _Lease:
    worker_id: str
    deadline: float


@dataclass(slots=True)
class _Record:
    task: PhaseTask
    lease: _Lease | None = None
    returns: tuple[float, ...] | None = None
    frames: int = 0
    extras: object = None
    """What else the accepted result carried (the fleet's business), None if nothing."""
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    queued: int = 0
    """Ticket of this task's live entry in the pending queue; 0 when it is not queued."""
    holders: tuple[str, ...] = ()
    """Workers it was leased to this phase and did not hand back: whose results count. At
    most max_attempts, since only a lapse or a failure (each an attempt) re-queues a task
    without taking its holder off."""
    lapsed_from: str | None = None
    """The worker whose lease just lapsed, while the task waits to be leased again: a
    heartbeat from it takes the task back rather than have it run twice."""


@dataclass(frozen=True)
class LeaseCounters:
    pending: int
    leased: int
    done: int
    reissued: int


class LeaseTable:
    """The tasks of one phase. Every task ends DONE exactly once, whatever workers do.

    A task that fails (worker error or lapsed lease) `max_attempts` times is recorded with NaN
    returns, so a poisoned task cannot stall a generation.
    """

    def __init__(self, tasks: Sequence[PhaseTask], lease_seconds: float, max_attempts: int) -> None:
        if lease_seconds <= 0 or not math.isfinite(lease_seconds):
            raise ValueError(f"lease_seconds must be a positive number, got {lease_seconds}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self._records = {t.task_id: _Record(t) for t in tasks}
        if len(self._records) != len(tasks):
            raise ValueError("task ids within a phase must be unique")
        # Pending tasks, front first. Removal only clears the record's ticket and the entry is
        # skipped when it reaches the front, so taking a task out of the middle costs O(1).
        # A re-queued task gets a new entry ahead of its dead one.
        self._tickets = itertools.count(1)
        self._pending: deque[tuple[str, int]] = deque()
        for record in self._records.values():
            record.queued = ticket = next(self._tickets)
            self._pending.append((record.task.task_id, ticket))
        self._pending_count = len(self._pending)
        self._leased: set[str] = set()
        self._held: dict[str, int] = {}
        """Leased tasks per worker holding any."""
        # (deadline, ticket, lease, task ids), one entry per grant or heartbeat: a lease call
        # looks at the earliest deadline only instead of scanning every leased task. Tasks whose
        # lease was since replaced or ended are skipped; each entry leaves once its deadline
        # passes, so the heap holds what was granted within one lease_seconds.
        self._deadlines: list[tuple[float, int, _Lease, tuple[str, ...]]] = []
        self._done = 0
        self.reissued = 0

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._records

    def __repr__(self) -> str:
        c = self.counters
        return f"LeaseTable(pending={c.pending}, leased={c.leased}, done={c.done})"

    @property
    def complete(self) -> bool:
        return self._done == len(self._records)

    @property
    def counters(self) -> LeaseCounters:
        return LeaseCounters(self._pending_count, len(self._leased), self._done, self.reissued)

    def lease(self, worker_id: str, max_tasks: int, now: float) -> list[PhaseTask]:
        """Hands out up to max_tasks pending tasks; lapsed leases are re-issued first."""
        self.expire(now)
        if self._held.get(worker_id) and self._pending_count < len(self._held):
            # Near the phase's end a task leased as a busy worker's prefetch would wait behind
            # its running one while another worker ran out of work and sat idle: once fewer
            # tasks are left than workers holding leases, the next goes to one that holds none.
            return []
        granted: list[_Record] = []
        pending, records = self._pending, self._records
        while pending and len(granted) < max_tasks:
            task_id, ticket = pending.popleft()
            record = records[task_id]
            if record.queued == ticket:
                record.queued = 0
                if worker_id not in record.holders:
                    record.holders += (worker_id,)
                granted.append(record)
        self._pending_count -= len(granted)
        self._grant(granted, worker_id, now)
        return [record.task for record in granted]

    def heartbeat(self, worker_id: str, task_ids: Iterable[str], now: float) -> list[str]:
        """Extends this worker's leases; returns the ids it should drop (done or not its own)."""
        dropped, kept = [], []
        # A lease with most of its time left is not extended again: a worker heartbeating in a
        # tight loop would otherwise add a deadline entry per call.
        fresh = now + self.lease_seconds * FRESH_LEASE_FRACTION
        for task_id in task_ids:
            record = self._records.get(task_id)
            if record is None or record.returns is not None:
                dropped.append(task_id)
            elif record.lease is not None and record.lease.worker_id == worker_id:
                if record.lease.deadline < fresh:
                    kept.append(record)
            elif record.lease is None and record.lapsed_from == worker_id:
                # Its own lease lapsed and nobody took the task since, but the worker is still
                # on it: take it back rather than run it twice.
                self._dequeue(record)
                kept.append(record)
            else:
                # Another's, handed back, failed, or never this worker's: not to be granted
                # by a heartbeat.
                dropped.append(task_id)
        self._grant(kept, worker_id, now)
        return dropped

    def release(self, worker_id: str, task_ids: Iterable[str]) -> int:
        """Returns this worker's unfinished tasks to the front of the queue, in order."""
        released = []
        for task_id in task_ids:
            record = self._records.get(task_id)
            if record and record.lease is not None and record.lease.worker_id == worker_id:
                self._unlease(record)
                # Handed back: it will not report the task, and whoever leases it next may.
                record.holders = tuple(h for h in record.holders if h != worker_id)
                released.append(record)
        for record in reversed(released):
            self._enqueue_front(record)
        return len(released)

    def episodes_of(self, task_id: str) -> int | None:
        """How many episode returns a report of this task must carry (None: not ours)."""
        record = self._records.get(task_id)
        return record.task.episodes if record else None

    def complete_task(
        self,
        task_id: str,
        returns: Sequence[float],
        frames: int,
        worker_id: str | None = None,
        extras: object = None,
    ) -> Disposition:
        """Records a finished task; a second report of the same task is a harmless duplicate.

        A worker's result counts only if the task was leased to it this phase (an earlier
        holder's late result too: evaluation is deterministic). worker_id None is a result
        from no worker, e.g. restored from a checkpoint.
        """
        record = self._records.get(task_id)
        if record is None:
            return Disposition.STALE
        if record.returns is not None:
            return Disposition.DUPLICATE
        if worker_id is not None and worker_id not in record.holders:
            return Disposition.REJECTED
        if len(returns) != record.task.episodes:
            raise ValueError(
                f"task {task_id} has {record.task.episodes} episodes, got {len(returns)} returns"
            )
        self._finish(record, tuple(map(float, returns)), frames)
        record.extras = extras
        return Disposition.ACCEPTED

    def fail_task(self, task_id: str, error: str, worker_id: str | None = None) -> Disposition:
        """A worker could not run the task: retry elsewhere, or record NaN after max_attempts.

        A worker's failure counts only while it holds the lease, and ends that lease: a copy
        of it (in the same batch, or a resent one) finds the lease over (STALE). worker_id
        None counts unconditionally.
        """
        record = self._records.get(task_id)
        if record is None:
            return Disposition.STALE
        if record.returns is not None:
            return Disposition.DUPLICATE
        if worker_id is not None and (record.lease is None or record.lease.worker_id != worker_id):
            return Disposition.STALE if worker_id in record.holders else Disposition.REJECTED
        if len(record.errors) < MAX_ERRORS_KEPT:
            record.errors.append(bounded_error(error))
        self._retry_or_give_up(record)
        return Disposition.ACCEPTED

    def expire(self, now: float) -> int:
        """Puts lapsed leases back in the queue; returns how many."""
        deadlines = self._deadlines
        lapsed: set[str] = set()
        while deadlines and deadlines[0][0] <= now:
            _, _, lease, task_ids = heapq.heappop(deadlines)
            lapsed.update(t for t in task_ids if self._records[t].lease is lease)
        for task_id in sorted(lapsed, reverse=True):
            record = self._records[task_id]
            holder = record.lease.worker_id if record.lease is not None else None
            if self._retry_or_give_up(record):
                record.lapsed_from = holder
                self.reissued += 1
        return len(lapsed)

    def holder(self, task_id: str) -> str | None:
        record = self._records.get(task_id)
        return record.lease.worker_id if record and record.lease else None

    def errors(self, task_id: str) -> list[str]:
        """The first MAX_ERRORS_KEPT errors reported for this task, each bounded."""
        return list(self._records[task_id].errors)

    def results(self) -> dict[str, list[float]]:
        """Episode returns per GA request key, tasks joined in id order; only when complete."""
        if not self.complete:
            raise RuntimeError(f"phase not complete: {self!r}")
        joined: dict[str, list[float]] = {}
        for record in self._records.values():
            joined.setdefault(record.task.request_key, []).extend(record.returns or ())
        return joined

    def done(self) -> dict[str, tuple[tuple[float, ...], int]]:
        """Recorded tasks: id -> (episode returns, frames); what a checkpoint keeps."""
        return {
            task_id: (record.returns, record.frames)
            for task_id, record in self._records.items()
            if record.returns is not None
        }

    def extras(self) -> dict[str, object]:
        """What recorded tasks carried besides returns and frames: id -> extras (if any)."""
        return {
            task_id: record.extras
            for task_id, record in self._records.items()
            if record.extras is not None
        }

    def tasks(self) -> list[PhaseTask]:
        """The phase's tasks, in the order results() joins them."""
        return [record.task for record in self._records.values()]

    @property
    def frames(self) -> int:
        return sum(r.frames for r in self._records.values())

    def _retry_or_give_up(self, record: _Record) -> bool:
        """Queues the task again (at the front: it is a straggler) unless out of attempts."""
        record.attempts += 1
        if record.lease is not None:
            self._unlease(record)
        else:
            self._dequeue(record)
        if record.attempts >= self.max_attempts:
            self._finish(record, (math.nan,) * record.task.episodes, 0)
            return False
        self._enqueue_front(record)
        return True

    def _finish(self, record: _Record, returns: tuple[float, ...], frames: int) -> None:
        if record.lease is not None:
            self._unlease(record)
        else:
            self._dequeue(record)
        record.lapsed_from = None
        record.returns = returns
        record.frames = frames
        self._done += 1

    def _grant(self, records: list[_Record], worker_id: str, now: float) -> None:
        """Leases these tasks to this worker (new leases, or the holder's extended ones)."""
        if not records:
            return
        lease = _Lease(worker_id, now + self.lease_seconds)
        for record in records:
            if record.lease is None:
                self._held[worker_id] = self._held.get(worker_id, 0) + 1
            record.lease = lease
            record.lapsed_from = None
        task_ids = tuple(record.task.task_id for record in records)
        self._leased.update(task_ids)
        entry = (lease.deadline, next(self._tickets), lease, task_ids)
        heapq.heappush(self._deadlines, entry)

    def _unlease(self, record: _Record) -> None:
        if record.lease is not None:
            holder = record.lease.worker_id
            self._held[holder] -= 1
            if not self._held[holder]:
                del self._held[holder]
        record.lease = None
        self._leased.discard(record.task.task_id)

    def _enqueue_front(self, record: _Record) -> None:
        record.queued = ticket = next(self._tickets)
        self._pending.appendleft((record.task.task_id, ticket))
        self._pending_count += 1

    def _dequeue(self, record: _Record) -> None:
        if record.queued:
            record.queued = 0
            self._pending_count -= 1


def bounded_error(error: str) -> str:
    """A worker's error text cut to MAX_ERROR_CHARS, marked where it was cut."""
    if len(error) <= MAX_ERROR_CHARS:
        return error
    marker = f"... [{len(error)} chars]"
    return error[: MAX_ERROR_CHARS - len(marker)] + marker
