"""Tasks of one evaluation phase and their leases: PENDING -> LEASED(worker, deadline) -> DONE.

At the phase's end, once nothing is pending, an idle worker may lease a second copy of an
in-flight task (a backup task, as MapReduce runs them against stragglers): the first valid
result of either copy counts and the other is a duplicate. An evaluation is deterministic in
its task (seeded no-ops, a deterministic emulator), so a copy is exactly redundant; for an env
with randomness of its own both results are valid samples of the same evaluation, and the first
to arrive is the one recorded. A worker known to be gone (its connection closed: see
master.fleet.service's Attach) loses its leases at once instead of when they lapse.

One unhealthy worker (an out-of-memory GPU, a broken install) must not spend other workers'
tasks: a task is not leased again, nor backed up, to a worker that failed it while another
worker can take it, and a backup copy's failure spends none of the task's attempts. Only when
every worker the caller knows of has failed a task is it retried on one of them, spending
attempts, so that a one-worker run never stalls. A lost presence call spends no attempt
either: the attempt is spent only if the task is leased again before its holder, alive after
all, takes it back by heartbeat.

Pure bookkeeping: time comes in as an argument, nothing here blocks or talks to the network.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from master.algorithms.base import Candidate
from neuro.wire import MAX_ERROR_CHARS


class Disposition(enum.Enum):
    """What the master did with a reported result."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    STALE = "stale"
    REJECTED = "rejected"
    """The task was never leased to the reporting worker (or it handed the task back)."""


MAX_ERRORS_KEPT = 5
"""Errors kept per task: enough to tell why it failed, whatever max_attempts is."""
FRESH_LEASE_FRACTION = 0.9
"""A heartbeat extends a lease only once less than this fraction of it is left."""
BACKUPS_PER_LEASE = 1
"""Backup copies an idle worker is given per lease call: spread over the idle workers, each
copy starts at once instead of waiting behind another on one worker."""


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
    backup: _Lease | None = None
    """A second copy, leased to an idle worker at the phase's end while `lease` runs."""
    returns: tuple[float, ...] | None = None
    frames: int = 0
    extras: object = None
    """What else the accepted result carried (the fleet's business), None if nothing."""
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    queued: int = 0
    """Ticket of this task's live entry in the pending queue; 0 when it is not queued."""
    holders: tuple[str, ...] = ()
    """Workers it was leased to this phase and did not hand back: whose results count. One is
    added by a lease after a lapse, a failure or a gone worker (each at most max_attempts
    times), and by a backup copy (one at a time, never to a worker that failed the task), so
    they stay as few as the workers that tried it."""
    failed_by: tuple[str, ...] = ()
    """Workers that reported it failed, in order: it goes to them again only once no other
    worker can take it."""
    lapsed_from: str | None = None
    """The worker whose lease just lapsed or ended with its presence, while the task waits to
    be leased again: a heartbeat from it takes the task back rather than have it run twice."""
    loss_unspent: bool = False
    """Its holder's presence ended and no attempt was spent for it: one is if the task is leased
    again before that holder takes it back."""
    since: float = 0.0
    """When its lease's holder was granted it (a heartbeat keeps it): the lease's age bounds
    the time a worker may say it spent on the task."""
    backup_since: float = 0.0


@dataclass(frozen=True)
class LeaseCounters:
    pending: int
    leased: int
    done: int
    reissued: int


@dataclass(frozen=True)
class TailFigures:
    """How a phase ended: its tail and the backup tasks run in it."""

    last_fresh_lease: float | None
    """When the last pending task was leased (clock time); the tail is from here to the end."""
    backups: int
    """Backup copies leased."""
    backups_won: int
    """Tasks whose recorded result came from the backup copy."""
    workers_lost: int
    """Workers known to be gone while holding leases, which were ended at once."""


class LeaseTable:
    """The tasks of one phase. Every task ends DONE exactly once, whatever workers do.

    A task that fails (worker error or lapsed lease) `max_attempts` times is recorded with NaN
    returns, so a poisoned task cannot stall a generation.
    """

    def __init__(
        self,
        tasks: Sequence[PhaseTask],
        lease_seconds: float,
        max_attempts: int,
        backups: bool = True,
    ) -> None:
        """`backups`: lease second copies of in-flight tasks to idle workers once nothing is
        pending."""
        if lease_seconds <= 0 or not math.isfinite(lease_seconds):
            raise ValueError(f"lease_seconds must be a positive number, got {lease_seconds}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.lease_seconds = lease_seconds
        self.max_attempts = max_attempts
        self._records: dict[str, _Record] = {}
        # Pending tasks, front first. Removal only clears the record's ticket and the entry is
        # skipped when it reaches the front, so taking a task out of the middle costs O(1).
        # A re-queued task gets a new entry ahead of its dead one.
        self._tickets = itertools.count(1)
        self._pending: deque[tuple[str, int]] = deque()
        self._pending_count = 0
        self.changes = 0
        """Grows whenever the pending, leased or done tasks change (by any call): whoever keeps
        figures of the table (master.fleet.shares) reads them again only once it moved."""
        self.add(tasks)
        self._leased: set[str] = set()
        self._held: dict[str, set[str]] = {}
        """The tasks each worker holding any holds a lease (or a backup lease) on."""
        self.backups = backups
        self._unbacked: OrderedDict[str, None] = OrderedDict()
        """Leased tasks without a backup copy, longest leased first: the candidates for one."""
        self.last_fresh_lease: float | None = None
        self.backups_granted = 0
        self.backups_won = 0
        self.workers_lost = 0
        # (deadline, ticket, lease, task ids), one entry per grant or heartbeat: a lease call
        # looks at the earliest deadline only instead of scanning every leased task. Tasks whose
        # lease was since replaced or ended are skipped; each entry leaves once its deadline
        # passes, so the heap holds what was granted within one lease_seconds.
        self._deadlines: list[tuple[float, int, _Lease, tuple[str, ...]]] = []
        self._done = 0
        self.reissued = 0

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._records

    def __len__(self) -> int:
        return len(self._records)

    def add(self, tasks: Sequence[PhaseTask]) -> None:
        """Appends tasks to the phase, pending behind those queued: a table of tasks played
        ahead becomes the next phase's once that phase's other tasks join it. ValueError,
        adding none, if an id is already in the table or repeats."""
        ids = {task.task_id for task in tasks}
        if len(ids) != len(tasks) or not ids.isdisjoint(self._records):
            raise ValueError("task ids within a phase must be unique")
        for task in tasks:
            self._records[task.task_id] = record = _Record(task)
            record.queued = ticket = next(self._tickets)
            self._pending.append((task.task_id, ticket))
        self._pending_count += len(tasks)
        self.changes += 1

    def lease_age(self, task_id: str, worker_id: str, now: float) -> float | None:
        """Seconds since this worker was granted the task it holds (its lease or backup copy);
        None if it holds neither now."""
        record = self._records.get(task_id)
        if record is None:
            return None
        if record.lease is not None and record.lease.worker_id == worker_id:
            return max(0.0, now - record.since)
        if record.backup is not None and record.backup.worker_id == worker_id:
            return max(0.0, now - record.backup_since)
        return None

    def __repr__(self) -> str:
        c = self.counters
        return f"LeaseTable(pending={c.pending}, leased={c.leased}, done={c.done})"

    @property
    def complete(self) -> bool:
        return self._done == len(self._records)

    @property
    def pending(self) -> int:
        """Tasks waiting to be leased."""
        return self._pending_count

    @property
    def leased(self) -> int:
        """Tasks leased and not yet done (backup copies not counted)."""
        return len(self._leased)

    @property
    def counters(self) -> LeaseCounters:
        return LeaseCounters(self._pending_count, len(self._leased), self._done, self.reissued)

    @property
    def tail(self) -> TailFigures:
        return TailFigures(self.last_fresh_lease, self.backups_granted, self.backups_won,
                           self.workers_lost)  # fmt: skip

    def lease(
        self,
        worker_id: str,
        max_tasks: int,
        now: float,
        fleet_slots: int = 0,
        backups: bool = True,
        workers: Collection[str] = (),
    ) -> list[PhaseTask]:
        """Hands out up to max_tasks pending tasks; lapsed leases are re-issued first.

        `fleet_slots`: how many tasks the workers asking for work ask for together (0:
        unknown). No worker takes more than its share of what is pending, in proportion to what
        it asks for: with as many one-task workers as tasks, each gets one and none holds a
        second behind its running one while another sits idle; a GPU host that asks for 256
        among CPU workers that ask for 2 still gets its 256. `backups` False: no backup copy
        in this call, whatever the table's own setting (a caller that leases several tables
        hands out backups only once none of them has anything pending). `workers`: those the
        caller could lease to (asking for work lately, none held off): a task this worker
        failed is skipped while one of them, or a worker holding a task here, has not failed
        it."""
        self.expire(now)
        if fleet_slots > 0:
            share = -(-self._pending_count * max_tasks // max(fleet_slots, max_tasks))
            max_tasks = min(max_tasks, max(1, share))
        if self._held.get(worker_id) and self._pending_count < len(self._held):
            # Near the phase's end a task leased as a busy worker's prefetch would wait behind
            # its running one while another worker ran out of work and sat idle: once fewer
            # tasks are left than workers holding leases, the next goes to one that holds none.
            return []
        granted: list[_Record] = []
        skipped: list[tuple[str, int]] = []
        pending, records = self._pending, self._records
        while pending and len(granted) < max_tasks:
            entry = pending.popleft()
            record = records[entry[0]]
            if record.queued != entry[1]:
                continue  # taken out of the queue since
            if worker_id in record.failed_by and self._others_can_take(record, worker_id, workers):
                skipped.append(entry)  # it stays at the front, for another worker
                continue
            record.queued = 0
            self._pending_count -= 1
            self.changes += 1
            if record.loss_unspent and not self._spend_lost_attempt(record):
                continue  # out of attempts: recorded as failed
            if worker_id not in record.holders:
                record.holders += (worker_id,)
            granted.append(record)
        pending.extendleft(reversed(skipped))
        if granted:
            self.last_fresh_lease = now
        elif backups:
            return self._lease_backups(worker_id, max_tasks, now)
        self._grant(granted, worker_id, now)
        return [record.task for record in granted]

    def lease_backups(self, worker_id: str, max_tasks: int, now: float) -> list[PhaseTask]:
        """Backup copies only, by the end-of-phase rules lease() follows: none while a task is
        pending, none to a worker that holds a task of this table, none when the table was made
        without backups, at most BACKUPS_PER_LEASE per call."""
        self.expire(now)
        return self._lease_backups(worker_id, max_tasks, now)

    def _lease_backups(self, worker_id: str, max_tasks: int, now: float) -> list[PhaseTask]:
        if not self.backups or self._pending_count or self._held.get(worker_id):
            return []
        # Nothing left to hand out and this worker idles: a second copy of the longest running
        # tasks, so that a dead or slow holder no longer decides when the phase ends.
        wanted = min(max_tasks, BACKUPS_PER_LEASE)
        return [record.task for record in self._grant_backups(worker_id, wanted, now)]

    def heartbeat(self, worker_id: str, task_ids: Iterable[str], now: float) -> list[str]:
        """Extends this worker's leases; returns the ids it should drop (done or not its own)."""
        dropped, kept, backups = [], [], []
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
            elif record.backup is not None and record.backup.worker_id == worker_id:
                if record.backup.deadline < fresh:
                    backups.append(record)
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
        self._grant(backups, worker_id, now, backup=True)
        return dropped

    def worker_gone(self, worker_id: str) -> int:
        """Ends every lease of a worker known to be gone (its connection closed) and drops its
        backup copies; returns how many tasks it held.

        Its tasks go to others at once (a backup copy running takes over), spending no attempt:
        should it be alive after all (a presence call can end while its worker lives on), a
        heartbeat takes back a task nobody took since, and a result of it still counts (it
        held the task). The attempt is spent when the task is leased again."""
        held = sorted(self._held.get(worker_id, ()), reverse=True)
        for task_id in held:
            record = self._records[task_id]
            if record.backup is not None and record.backup.worker_id == worker_id:
                self._drop_backup(record)
            elif record.lease is not None and record.lease.worker_id == worker_id:
                self._unlease(record)
                self.reissued += 1
                if record.backup is not None:
                    self._promote_backup(record)
                else:
                    record.lapsed_from, record.loss_unspent = worker_id, True
                    self._enqueue_front(record)
        if held:
            self.workers_lost += 1
        return len(held)

    def release(self, worker_id: str, task_ids: Iterable[str]) -> int:
        """Returns this worker's unfinished tasks to the front of the queue, in order."""
        released, count = [], 0
        for task_id in task_ids:
            record = self._records.get(task_id)
            if record is None or record.returns is not None:
                continue
            if record.backup is not None and record.backup.worker_id == worker_id:
                self._drop_backup(record)
            elif record.lease is not None and record.lease.worker_id == worker_id:
                self._unlease(record)
                if record.backup is not None:
                    self._promote_backup(record)  # the copy goes on; nothing to queue
                else:
                    released.append(record)
            else:
                continue
            # Handed back: it will not report the task, and whoever leases it next may.
            record.holders = tuple(h for h in record.holders if h != worker_id)
            count += 1
        for record in reversed(released):
            self._enqueue_front(record)
        return count

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
        if record.backup is not None and record.backup.worker_id == worker_id:
            self.backups_won += 1
        self._finish(record, tuple(map(float, returns)), frames)
        record.extras = extras
        return Disposition.ACCEPTED

    def fail_task(self, task_id: str, error: str, worker_id: str | None = None) -> Disposition:
        """A worker could not run the task: retry elsewhere, or record NaN after max_attempts.

        A worker's failure counts only while it holds the lease, and ends that lease: a copy
        of it (in the same batch, or a resent one) finds the lease over (STALE). The task then
        goes to another worker while one can take it (see lease). A backup copy's failure only
        ends the copy: the task's attempts are its first holder's. worker_id None counts
        unconditionally.
        """
        record = self._records.get(task_id)
        if record is None:
            return Disposition.STALE
        if record.returns is not None:
            return Disposition.DUPLICATE
        backup = record.backup is not None and record.backup.worker_id == worker_id
        primary = record.lease is not None and record.lease.worker_id == worker_id
        if worker_id is not None and not (primary or backup):
            return Disposition.STALE if worker_id in record.holders else Disposition.REJECTED
        if len(record.errors) < MAX_ERRORS_KEPT:
            record.errors.append(bounded_error(error))
        if worker_id is not None and worker_id not in record.failed_by:
            record.failed_by += (worker_id,)
        if backup:
            # The copy failed; the task goes on where it first ran, its attempts unspent: a
            # copy is extra, and one broken idle worker must not use up another's task.
            self._drop_backup(record)
        else:
            self._retry_or_give_up(record)
        return Disposition.ACCEPTED

    def expire(self, now: float) -> int:
        """Puts lapsed leases back in the queue; returns how many."""
        deadlines = self._deadlines
        lapsed: set[str] = set()
        while deadlines and deadlines[0][0] <= now:
            _, _, lease, task_ids = heapq.heappop(deadlines)
            for task_id in task_ids:
                record = self._records[task_id]
                if record.lease is lease:
                    lapsed.add(task_id)
                elif record.backup is lease:
                    self._drop_backup(record)  # the first copy still runs
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

    def leased_to(self, worker_id: str) -> list[str]:
        """The tasks whose lease (not a backup copy) this worker holds, by task id."""
        records = self._records
        return sorted(
            task_id
            for task_id in self._held.get(worker_id, ())
            if (lease := records[task_id].lease) is not None and lease.worker_id == worker_id
        )

    def backup_holder(self, task_id: str) -> str | None:
        """Who runs the task's backup copy, if one runs."""
        record = self._records.get(task_id)
        return record.backup.worker_id if record and record.backup else None

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

    def _others_can_take(self, record: _Record, worker_id: str, workers: Collection[str]) -> bool:
        """Whether a worker other than this one, and none that failed the task, could take it:
        one the caller names, or one holding a task of this table (it is alive)."""
        failed = record.failed_by
        # Stops at the first that qualifies: at most len(failed) + 1 workers are looked at.
        return any(w != worker_id and w not in failed for w in itertools.chain(workers, self._held))

    def _spend_lost_attempt(self, record: _Record) -> bool:
        """A task lost with its holder's presence is leased again: that costs an attempt now.
        False if none is left (the task is then recorded as failed)."""
        record.loss_unspent = False
        record.attempts += 1
        if record.attempts < self.max_attempts:
            return True
        self._finish(record, (math.nan,) * record.task.episodes, 0)
        return False

    def _retry_or_give_up(self, record: _Record) -> bool:
        """Queues the task again (at the front: it is a straggler) unless out of attempts; a
        backup copy running takes over instead of a queued one."""
        record.attempts += 1
        if record.lease is not None:
            self._unlease(record)
        else:
            self._dequeue(record)
        if record.attempts >= self.max_attempts:
            self._finish(record, (math.nan,) * record.task.episodes, 0)
            return False
        if record.backup is not None:
            self._promote_backup(record)
        else:
            self._enqueue_front(record)
        return True

    def _finish(self, record: _Record, returns: tuple[float, ...], frames: int) -> None:
        if record.backup is not None:
            self._drop_backup(record)
        if record.lease is not None:
            self._unlease(record)
        else:
            self._dequeue(record)
        record.lapsed_from, record.loss_unspent = None, False
        record.returns = returns
        record.frames = frames
        self._done += 1
        self.changes += 1

    def _grant(
        self, records: list[_Record], worker_id: str, now: float, backup: bool = False
    ) -> None:
        """Leases these tasks to this worker (new leases, or the holder's extended ones);
        `backup`: the backup copies it holds."""
        if not records:
            return
        lease = _Lease(worker_id, now + self.lease_seconds)
        held = self._held.setdefault(worker_id, set())
        for record in records:
            task_id = record.task.task_id
            held.add(task_id)
            if backup:
                if record.backup is None or record.backup.worker_id != worker_id:
                    record.backup_since = now
                record.backup = lease
                continue
            if record.lease is None and record.backup is None:
                self._unbacked[task_id] = None  # a candidate for a backup, newest last
            if record.lease is None or record.lease.worker_id != worker_id:
                record.since = now
            record.lease = lease
            record.lapsed_from, record.loss_unspent = None, False
        task_ids = tuple(record.task.task_id for record in records)
        if not backup:
            self._leased.update(task_ids)
            self.changes += 1
        entry = (lease.deadline, next(self._tickets), lease, task_ids)
        heapq.heappush(self._deadlines, entry)

    def _grant_backups(self, worker_id: str, max_tasks: int, now: float) -> list[_Record]:
        """Backup copies of up to max_tasks in-flight tasks, longest leased first; none of a task
        this worker failed."""
        chosen: list[_Record] = []
        unlisted: list[str] = []
        for task_id in self._unbacked:
            if len(chosen) >= max_tasks:
                break
            record = self._records[task_id]
            if record.lease is None or record.backup is not None or record.returns is not None:
                unlisted.append(task_id)  # ended since it was listed
            elif worker_id not in record.failed_by:
                unlisted.append(task_id)
                chosen.append(record)
        for task_id in unlisted:
            del self._unbacked[task_id]
        for record in chosen:
            if worker_id not in record.holders:
                record.holders += (worker_id,)
        self._grant(chosen, worker_id, now, backup=True)
        self.backups_granted += len(chosen)
        return chosen

    def _promote_backup(self, record: _Record) -> None:
        """The backup copy becomes the task's lease (its first holder is gone or failed)."""
        lease, record.backup = record.backup, None
        record.lease = lease
        record.since = record.backup_since
        self._leased.add(record.task.task_id)
        self.changes += 1
        # It may be backed up again (its new holder may die too); an old task, so it goes first.
        self._unbacked[record.task.task_id] = None
        self._unbacked.move_to_end(record.task.task_id, last=False)

    def _drop_backup(self, record: _Record) -> None:
        lease, record.backup = record.backup, None
        if lease is not None:
            self._release_hold(lease.worker_id, record.task.task_id)
            if record.lease is not None and record.returns is None:
                # It may be backed up again; an old task, so it goes first.
                self._unbacked[record.task.task_id] = None
                self._unbacked.move_to_end(record.task.task_id, last=False)

    def _release_hold(self, worker_id: str, task_id: str) -> None:
        held = self._held.get(worker_id)
        if held is not None:
            held.discard(task_id)
            if not held:
                del self._held[worker_id]

    def _unlease(self, record: _Record) -> None:
        task_id = record.task.task_id
        if record.lease is not None:
            self._release_hold(record.lease.worker_id, task_id)
        record.lease = None
        self._leased.discard(task_id)
        self.changes += 1
        self._unbacked.pop(task_id, None)

    def _enqueue_front(self, record: _Record) -> None:
        record.queued = ticket = next(self._tickets)
        self._pending.appendleft((record.task.task_id, ticket))
        self._pending_count += 1
        self.changes += 1

    def _dequeue(self, record: _Record) -> None:
        if record.queued:
            record.queued = 0
            self._pending_count -= 1
            self.changes += 1


TASK_SECONDS_WEIGHT = 0.1
"""Each result's share of a run's moving average of seconds per task (the fair share's weight,
master.fleet.shares): about the last twenty results count, so a run whose episodes lengthen as
it learns is weighed anew within a generation."""


def moving_task_seconds(last: float | None, seconds: float) -> float:
    """A run's seconds per task once a result that kept its worker `seconds` busy counts."""
    return seconds if last is None else last + TASK_SECONDS_WEIGHT * (seconds - last)


def bounded_error(error: str) -> str:
    """A worker's error text cut to MAX_ERROR_CHARS, marked where it was cut."""
    if len(error) <= MAX_ERROR_CHARS:
        return error
    marker = f"... [{len(error)} chars]"
    return error[: MAX_ERROR_CHARS - len(marker)] + marker
