"""Tasks of one evaluation phase and their leases: PENDING -> LEASED(worker, deadline) -> DONE.

Pure bookkeeping: time comes in as an argument, nothing here blocks or talks to the network.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from master.ga import Genome


class Disposition(enum.Enum):
    """What the master did with a reported result."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    STALE = "stale"


@dataclass(frozen=True)
class PhaseTask:
    """Episodes [first_episode, first_episode + episodes) of one GA evaluation request."""

    task_id: str
    request_key: str
    genome: Genome
    episodes: int
    env_seed: int


@dataclass
class _Lease:
    worker_id: str
    deadline: float


@dataclass
class _Record:
    task: PhaseTask
    lease: _Lease | None = None
    returns: tuple[float, ...] | None = None
    frames: int = 0
    attempts: int = 0
    errors: list[str] = field(default_factory=list)


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
        self._pending: deque[str] = deque(t.task_id for t in tasks)
        self._leased: set[str] = set()
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
        return LeaseCounters(len(self._pending), len(self._leased), self._done, self.reissued)

    def lease(self, worker_id: str, max_tasks: int, now: float) -> list[PhaseTask]:
        """Hands out up to max_tasks pending tasks; lapsed leases are re-issued first."""
        self.expire(now)
        granted: list[PhaseTask] = []
        while self._pending and len(granted) < max_tasks:
            task_id = self._pending.popleft()
            record = self._records[task_id]
            record.lease = _Lease(worker_id, now + self.lease_seconds)
            self._leased.add(task_id)
            granted.append(record.task)
        return granted

    def heartbeat(self, worker_id: str, task_ids: Iterable[str], now: float) -> list[str]:
        """Extends this worker's leases; returns the ids it should drop (done or not its own)."""
        dropped = []
        for task_id in task_ids:
            record = self._records.get(task_id)
            if record is None or record.returns is not None:
                dropped.append(task_id)
            elif record.lease is not None and record.lease.worker_id == worker_id:
                record.lease.deadline = now + self.lease_seconds
            elif record.lease is None:
                # Lapsed and back in the queue, but the worker is still on it: take it back
                # rather than run it twice.
                self._pending.remove(task_id)
                record.lease = _Lease(worker_id, now + self.lease_seconds)
                self._leased.add(task_id)
            else:
                dropped.append(task_id)
        return dropped

    def release(self, worker_id: str, task_ids: Iterable[str]) -> int:
        """Returns this worker's unfinished tasks to the front of the queue, in order."""
        released = []
        for task_id in task_ids:
            record = self._records.get(task_id)
            if record and record.lease is not None and record.lease.worker_id == worker_id:
                self._unlease(record)
                released.append(task_id)
        self._pending.extendleft(reversed(released))
        return len(released)

    def episodes_of(self, task_id: str) -> int | None:
        """How many episode returns a report of this task must carry (None: not ours)."""
        record = self._records.get(task_id)
        return record.task.episodes if record else None

    def complete_task(self, task_id: str, returns: Sequence[float], frames: int) -> Disposition:
        """Records a finished task; a second report of the same task is a harmless duplicate."""
        record = self._records.get(task_id)
        if record is None:
            return Disposition.STALE
        if record.returns is not None:
            return Disposition.DUPLICATE
        if len(returns) != record.task.episodes:
            raise ValueError(
                f"task {task_id} has {record.task.episodes} episodes, got {len(returns)} returns"
            )
        self._finish(record, tuple(float(r) for r in returns), frames)
        return Disposition.ACCEPTED

    def fail_task(self, task_id: str, error: str) -> Disposition:
        """A worker could not run the task: retry elsewhere, or record NaN after max_attempts."""
        record = self._records.get(task_id)
        if record is None:
            return Disposition.STALE
        if record.returns is not None:
            return Disposition.DUPLICATE
        record.errors.append(error)
        self._retry_or_give_up(record)
        return Disposition.ACCEPTED

    def expire(self, now: float) -> int:
        """Puts lapsed leases back in the queue; returns how many."""
        lapsed = [
            tid
            for tid in self._leased
            if self._records[tid].lease.deadline <= now  # type: ignore[union-attr]
        ]
        for task_id in sorted(lapsed, reverse=True):
            if self._retry_or_give_up(self._records[task_id]):
                self.reissued += 1
        return len(lapsed)

    def holder(self, task_id: str) -> str | None:
        record = self._records.get(task_id)
        return record.lease.worker_id if record and record.lease else None

    def errors(self, task_id: str) -> list[str]:
        return list(self._records[task_id].errors)

    def results(self) -> dict[str, list[float]]:
        """Episode returns per GA request key, tasks joined in id order; only when complete."""
        if not self.complete:
            raise RuntimeError(f"phase not complete: {self!r}")
        joined: dict[str, list[float]] = {}
        for record in self._records.values():
            joined.setdefault(record.task.request_key, []).extend(record.returns or ())
        return joined

    @property
    def frames(self) -> int:
        return sum(r.frames for r in self._records.values())

    def _retry_or_give_up(self, record: _Record) -> bool:
        """Queues the task again (at the front: it is a straggler) unless out of attempts."""
        record.attempts += 1
        if record.lease is not None:
            self._unlease(record)
        elif record.task.task_id in self._pending:
            self._pending.remove(record.task.task_id)
        if record.attempts >= self.max_attempts:
            self._finish(record, (math.nan,) * record.task.episodes, 0)
            return False
        self._pending.appendleft(record.task.task_id)
        return True

    def _finish(self, record: _Record, returns: tuple[float, ...], frames: int) -> None:
        task_id = record.task.task_id
        if record.lease is not None:
            self._unlease(record)
        elif task_id in self._pending:
            self._pending.remove(task_id)
        record.returns = returns
        record.frames = frames
        self._done += 1

    def _unlease(self, record: _Record) -> None:
        record.lease = None
        self._leased.discard(record.task.task_id)
