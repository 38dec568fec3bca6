"""The fleet's workers as the master knows them: contacts, work accepted, rate, leases held.

What Status and /metrics report of workers comes from here (WorkerStats); the Fleet
(master.fleet.fleet) tells the roster of every call it answers, and its phase loop
(master.fleet.phases) of the leases each worker holds. Pure bookkeeping: time comes in as an
argument.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

WORKER_SEEN_WINDOW_S = 60.0
"""A worker counts as connected if it called within this window."""
RATE_WINDOW_S = 60.0
"""A worker's frames per second are its accepted frames over this window."""
FORGET_WORKER_AFTER_S = 600.0
"""A worker silent this long leaves the worker table, which stays bounded under spot churn."""
MAX_WORKERS_TRACKED = 4096
"""The worker table's size, whatever the churn: beyond it the least recently seen goes."""
STATUS_WORKERS = 256
"""Status and /metrics list this many workers, the most recently seen."""
FAILURES_BEFORE_HOLD_OFF = 10
"""Tasks a worker fails in a row, with no result accepted in between, before it is held off
(given nothing), provided another worker had a result accepted in the last
WORKER_SEEN_WINDOW_S: a whole fleet failing is the run's problem, not one host's."""
HOLD_OFF_S = 30.0
MAX_HOLD_OFF_S = 600.0
"""A held-off worker gets nothing for HOLD_OFF_S, doubled for each hold-off in a row up to
MAX_HOLD_OFF_S; then it is given a task again, and one more failure holds it off again. An
accepted result ends the streak."""
UTILISATION_WINDOW_S = 60.0
"""The fleet's utilisation is its workers' busy seconds over this window, divided by the
workers connected times the window."""
MIN_UTILISATION_SPAN_S = 5.0
"""Less time than this since the first worker called: too little to say how busy they are."""


@dataclass(frozen=True)
class WorkerStats:
    """One worker's figures, as Status and /metrics show them."""

    worker_id: str
    tasks_leased: int
    evaluations: int
    frames: int
    frames_per_second: float
    seconds_since_contact: float
    tasks_failed: int = 0
    """Tasks it reported failed (each an error it sent for a task it held)."""
    held_off_s: float = 0.0
    """Seconds it is still given nothing for, having failed every task it got lately."""


@dataclass(slots=True)
class _Worker:
    first_seen: float
    last_seen: float
    evaluations: int = 0
    frames: int = 0
    # Accepted frames per whole second of the clock, oldest first: at most window + 1
    # buckets however often the worker reports, so a report costs O(1) amortised.
    buckets: deque[list[int]] = field(default_factory=deque)
    window_frames: int = 0
    held: set[str] = field(default_factory=set)
    """Task ids granted to it this phase; Status counts those it still holds."""
    told_complete: bool = False
    """It was answered that the run is complete."""
    failed: int = 0
    failing_streak: int = 0
    """Tasks failed since its last accepted result."""
    hold_offs: int = 0
    """Hold-offs in a row, each twice as long as the last."""
    held_off_until: float = -float("inf")


class WorkerRoster:
    """Per-worker contacts, accepted work and a sliding one-minute frame rate.

    Workers are kept least recently seen first, so forgetting the silent ones costs O(1)
    amortised per contact. Time comes in as an argument.
    """

    def __init__(
        self,
        rate_window_s: float = RATE_WINDOW_S,
        forget_after_s: float = FORGET_WORKER_AFTER_S,
        max_workers: int = MAX_WORKERS_TRACKED,
    ) -> None:
        if not 0 < rate_window_s <= forget_after_s:
            raise ValueError(
                f"need 0 < rate_window_s <= forget_after_s, got {rate_window_s}, {forget_after_s}"
            )
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.rate_window_s = rate_window_s
        self.forget_after_s = forget_after_s
        self.max_workers = max_workers
        self._workers: OrderedDict[str, _Worker] = OrderedDict()
        self._last_accepted = -float("inf")
        """When any worker last had a result accepted."""
        self._first_seen: float | None = None
        self._busy: deque[list[float]] = deque()
        """[second, busy seconds] of accepted results, per whole second of the clock."""
        self._window_busy = 0.0

    def __len__(self) -> int:
        return len(self._workers)

    def seen(self, worker_id: str, now: float) -> None:
        """Records a contact (any call) from this worker."""
        if self._first_seen is None:
            self._first_seen = now
        worker = self._workers.get(worker_id)
        if worker is None:
            self._workers[worker_id] = _Worker(now, now)
            if len(self._workers) > self.max_workers:
                self._workers.popitem(last=False)  # the least recently seen
        else:
            worker.last_seen = now
            self._workers.move_to_end(worker_id)
        self.forget(now)

    def told_complete(self, worker_id: str) -> None:
        """This worker was answered that the run is complete."""
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.told_complete = True

    def untold(self, now: float, within_s: float) -> int:
        """Workers seen in the last `within_s` seconds that were not yet told the run is over."""
        horizon, count = now - within_s, 0
        for worker in reversed(self._workers.values()):  # most recently seen first
            if worker.last_seen < horizon:
                break
            count += not worker.told_complete
        return count

    def credit(
        self, worker_id: str, episodes: int, frames: int, now: float, busy_s: float = 0.0
    ) -> None:
        """Adds an accepted result's episodes and frames to a worker seen at `now`, and the
        seconds it spent on them to the fleet's (utilisation)."""
        if busy_s > 0:
            self._add_busy(busy_s, now)
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        worker.evaluations += episodes
        worker.frames += frames
        worker.failing_streak = worker.hold_offs = 0
        self._last_accepted = now
        second = int(now)
        buckets = worker.buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += frames
        else:
            buckets.append([second, frames])
        worker.window_frames += frames
        self._trim(worker, now)

    def failed(self, worker_id: str, now: float) -> float:
        """This worker reported a task it held failed; returns the seconds it is now held off
        for (0: not held off). See FAILURES_BEFORE_HOLD_OFF."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return 0.0
        worker.failed += 1
        worker.failing_streak += 1
        others_succeed = now - self._last_accepted <= WORKER_SEEN_WINDOW_S
        if worker.failing_streak < FAILURES_BEFORE_HOLD_OFF or not others_succeed:
            return 0.0
        seconds = min(MAX_HOLD_OFF_S, HOLD_OFF_S * 2.0**worker.hold_offs)
        worker.hold_offs += 1
        worker.held_off_until = now + seconds
        return seconds

    def held_off(self, worker_id: str, now: float) -> bool:
        """Whether this worker is to be given nothing now (it failed everything lately)."""
        worker = self._workers.get(worker_id)
        return worker is not None and now < worker.held_off_until

    def holding(self, worker_id: str, task_ids: Iterable[str]) -> None:
        """These tasks were granted to (or kept by) this worker."""
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.held.update(task_ids)

    def not_holding(self, worker_id: str, task_ids: Iterable[str]) -> None:
        """This worker finished, dropped or handed back these tasks."""
        worker = self._workers.get(worker_id)
        if worker is not None and worker.held:
            worker.held.difference_update(task_ids)

    def holds_nothing(self, worker_id: str) -> None:
        """This worker's leases all ended (it is gone)."""
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.held.clear()

    def phase_ended(self, prefix: str = "") -> None:
        """A run's phase ended: its next phase's task ids share nothing with the last one's, so
        nobody holds any task of the run. `prefix`: the run's task ids begin with it (a fleet
        serving several runs); "" is every task id."""
        for worker in self._workers.values():
            if not prefix:
                worker.held.clear()
            elif worker.held:
                worker.held = {t for t in worker.held if not t.startswith(prefix)}

    def connected(self, now: float, within_s: float) -> int:
        """How many workers were seen in the last `within_s` seconds."""
        horizon, count = now - within_s, 0
        for worker in reversed(self._workers.values()):  # most recently seen first
            if worker.last_seen < horizon:
                break
            count += 1
        return count

    def forget(self, now: float) -> None:
        """Drops workers not seen for forget_after_s."""
        horizon = now - self.forget_after_s
        while self._workers:
            worker_id, worker = next(iter(self._workers.items()))
            if worker.last_seen >= horizon:
                break
            del self._workers[worker_id]

    def snapshot(
        self, now: float, holder: Callable[[str], str | None], limit: int | None = None
    ) -> list[WorkerStats]:
        """The figures of the `limit` most recently seen workers (all: None), by worker id.

        `holder(task_id)` names a lease's holder.
        """
        self.forget(now)
        recent = reversed(self._workers.items())  # most recently seen first
        if limit is not None:
            recent = itertools.islice(recent, limit)
        stats = []
        for worker_id, worker in sorted(recent):
            worker.held = {t for t in worker.held if holder(t) == worker_id}
            self._trim(worker, now)
            # Since it joined, if that was less than a window ago; at least a second, so a
            # first report does not read as a burst.
            span = max(1.0, min(self.rate_window_s, now - worker.first_seen))
            stats.append(
                WorkerStats(
                    worker_id=worker_id,
                    tasks_leased=len(worker.held),
                    evaluations=worker.evaluations,
                    frames=worker.frames,
                    frames_per_second=worker.window_frames / span,
                    seconds_since_contact=max(0.0, now - worker.last_seen),
                    tasks_failed=worker.failed,
                    held_off_s=max(0.0, worker.held_off_until - now),
                )
            )
        return stats

    def utilisation(self, now: float) -> float | None:
        """How busy the workers connected now were over the last UTILISATION_WINDOW_S: their
        accepted results' busy seconds / (workers x the window), at most 1 (a result's seconds
        count when it is accepted, so a long task's land at once). None before any worker
        called, with none connected, or less than MIN_UTILISATION_SPAN_S after the first."""
        if self._first_seen is None:
            return None
        span = min(UTILISATION_WINDOW_S, now - self._first_seen)
        workers = self.connected(now, WORKER_SEEN_WINDOW_S)
        if workers == 0 or span < MIN_UTILISATION_SPAN_S:
            return None
        self._trim_busy(now)
        return min(1.0, max(0.0, self._window_busy) / (workers * span))

    def _add_busy(self, seconds: float, now: float) -> None:
        second = int(now)
        busy = self._busy
        if busy and busy[-1][0] == second:
            busy[-1][1] += seconds
        else:
            busy.append([second, seconds])
        self._window_busy += seconds
        self._trim_busy(now)

    def _trim_busy(self, now: float) -> None:
        oldest = now - UTILISATION_WINDOW_S - 1
        busy = self._busy
        while busy and busy[0][0] <= oldest:
            self._window_busy -= busy.popleft()[1]

    def _trim(self, worker: _Worker, now: float) -> None:
        # Bucket s covers [s, s + 1): it leaves once all of it is older than the window.
        oldest = now - self.rate_window_s - 1
        buckets = worker.buckets
        while buckets and buckets[0][0] <= oldest:
            worker.window_frames -= buckets.popleft()[1]
