"""One run's evaluation phases, one at a time: the seam between the algorithm and the leases.

A phase is the algorithm's requests split into tasks (an env seed each, fixed by the run seed);
the PhaseLoop puts them in a master.fleet.leases.LeaseTable and gathers the results,
behaviours and observation sums until every task is recorded. Who the workers are is
master.fleet.roster's; the calls they make are answered by master.fleet.fleet, which leases
the loop's tables (the running phase's, then the next phase's tasks played ahead) through
master.fleet.shares.

Tasks played ahead (master.algorithms.base.Algorithm.ask_ahead) wait in a table of their own,
leased only when the running phase has nothing pending; when the next phase asks for them,
that table becomes the next phase's, its results and leases kept, with the phase's other
tasks added. Task ids are the same either way, so are the env seeds: a run plays the same
episodes with the overlap or without it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
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
    moving_task_seconds,
)
from master.fleet.roster import FAILURES_BEFORE_HOLD_OFF, WorkerRoster
from neuro.observation_stats import ObservationStats

log = logging.getLogger(__name__)
ERROR_LOG_LINES = 10
ERROR_LOG_WINDOW_S = 60.0
"""Task failures are logged at most ERROR_LOG_LINES times per window; the rest are counted."""


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
    busy_s: float = 0.0
    """Seconds the worker says it spent on the task (bounded here by its lease's age)."""


class RunRefused(RuntimeError):
    """Every attached worker refuses the run's tasks (a module the run needs cannot be imported
    on any of them): the run stops with this error, resumable once the module is installed."""


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


def request_of(task_id: str) -> str:
    """The request key a task id of split_into_tasks names ("<request key>/<first episode>")."""
    return task_id.rsplit("/", 1)[0]


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


class PhaseLoop:
    """Runs one run's phases, one at a time, and keeps the roster's leases held up to date.

    evaluate() is awaited by the training loop; the other methods act on the running phase (and
    the tasks played ahead) and never block. Time comes from `clock` so tests can drive lease
    expiry. `wire_prefix` goes before each task id the roster holds (the ids workers see: a
    fleet serving several runs tells their tasks apart by it); `on_tables` hears the loop's
    tables whenever they change, highest priority first.
    """

    def __init__(
        self,
        settings: FleetSettings,
        roster: WorkerRoster,
        clock: Callable[[], float] = time.monotonic,
        wire_prefix: str = "",
        on_tables: Callable[[tuple[LeaseTable, ...]], None] | None = None,
    ) -> None:
        self.settings = settings
        self._roster = roster
        self._clock = clock
        self._prefix = wire_prefix
        self._on_tables = on_tables
        self._table: LeaseTable | None = None
        self._ahead: LeaseTable | None = None
        """The next phase's tasks played ahead of it, while this phase runs and after."""
        self._ahead_observations: ObservationStats | None = None
        self.worker_s = 0.0
        """Seconds workers spent on this run's accepted results (each bounded by its lease's
        age), in this process."""
        self.task_seconds: float | None = None
        """What one of its tasks keeps a worker busy, lately (a moving average of the accepted
        results' busy seconds); None until one says. A study's fair share weighs each run's
        tasks in flight by it (master.fleet.shares)."""
        self.played_ahead = 0
        """Tasks a phase found done when it began, played ahead of it, in this process."""
        self._split: set[str] = set()
        """The running phase's (and the tasks played ahead's) requests of several tasks."""
        self._interrupted: dict[str, tuple[tuple[float, ...], int]] = {}
        self._interrupted_extras: dict[str, TaskExtras] = {}
        self._observations: ObservationStats | None = None
        """The running phase's accepted observation sums so far, to refuse a result that would
        take them past what a normaliser can use (the phase's own sum is made at its end)."""
        self._phase_done = asyncio.Event()
        self._finished_task_ids: set[str] = set()
        self._error_log = _RateLimitedLog(ERROR_LOG_LINES, ERROR_LOG_WINDOW_S)
        self._hold_off_log = _RateLimitedLog(ERROR_LOG_LINES, ERROR_LOG_WINDOW_S)
        self._reissued_total = 0
        self.frames_accepted = 0
        """Frames of every accepted result so far, for throughput figures."""
        self._refusals: dict[str, str] = {}
        """worker id -> why it refuses the run's tasks (a module it cannot import)."""
        self._refused: RunRefused | None = None
        """Set once every attached worker refuses: evaluate() raises it."""

    @property
    def table(self) -> LeaseTable | None:
        """The running phase's lease table; None between phases."""
        return self._table

    @property
    def tables(self) -> tuple[LeaseTable, ...]:
        """The tables workers are leased from, highest priority first: the running phase's,
        then the next phase's tasks played ahead."""
        return tuple(t for t in (self._table, self._ahead) if t is not None)

    async def evaluate(
        self,
        requests: Sequence[EvaluationRequest],
        recorded: Mapping[str, tuple[Sequence[float], int]] | None = None,
        recorded_extras: Mapping[str, TaskExtras] | None = None,
        ahead: Sequence[EvaluationRequest] = (),
    ) -> PhaseOutcome:
        """Hands the requests out as tasks and waits until every one is recorded.

        `recorded` holds tasks of this phase already done before a restart (from a
        checkpoint), with what else they carried in `recorded_extras`; they are not handed
        out again. `ahead`: requests of the next phase, played at lower priority meanwhile
        (Algorithm.ask_ahead); the next evaluate() that asks for them takes what they did.
        """
        if self._table is not None:
            raise RuntimeError("a phase is already running")
        if self._refused is not None:
            raise self._refused
        tasks = split_into_tasks(requests, self.settings)
        per_task = self.settings.episodes_per_task
        # Requests of several tasks: a worker holding one of their tasks is given the others
        # first (reevaluated), and plays them in one pass.
        self._split = {r.key for r in (*requests, *ahead) if r.episodes > per_task}
        table = self._adopted(tasks)
        if table is None:
            table = self._new_table(tasks)
            self._observations = None
        extras = recorded_extras or {}
        for task_id, (returns, frames) in (recorded or {}).items():
            if task_id in table:
                extra = extras.get(task_id)
                table.complete_task(task_id, returns, frames, extras=extra)
                if extra is not None:
                    self._observations = _plus(self._observations, extra.observations)
        self._phase_done.clear()
        self._table = table
        if ahead:
            self._ahead = self._new_table(split_into_tasks(ahead, self.settings))
            self._ahead_observations = None
        self._tables_changed()
        self._wake_if_complete()
        try:
            while not table.complete:
                if self._refused is not None:
                    raise self._refused
                # Lapsed leases are also re-issued on every lease call; this wakes up for the
                # case where no worker is asking. asyncio.timeout, not wait_for: on Python
                # 3.11 wait_for swallows a cancel (SIGTERM) that arrives as the phase
                # completes, and the run would go on.
                try:
                    async with asyncio.timeout(self.settings.lease_seconds):
                        await self._phase_done.wait()
                except TimeoutError:
                    self.expire()
        finally:
            self._table = None
            if not table.complete:
                self._discard_ahead()  # stopped mid-phase: the run plays nothing ahead now
            self._tables_changed()
            self._roster.phase_ended(self._prefix)
            self._reissued_total += table.reissued
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

    def drop_ahead(self) -> None:
        """Stops playing the next phase's tasks ahead (the run ends, or will not play them)."""
        if self._ahead is not None:
            self._discard_ahead()
            self._tables_changed()

    def _discard_ahead(self) -> None:
        # Its leases re-issued so far happened: they stay in the run's count.
        if self._ahead is not None:
            self._reissued_total += self._ahead.reissued
            self._ahead = None

    def _new_table(self, tasks: Sequence[PhaseTask]) -> LeaseTable:
        return LeaseTable(tasks, self.settings.lease_seconds, self.settings.max_attempts,
                          backups=self.settings.backups)  # fmt: skip

    def _adopted(self, tasks: Sequence[PhaseTask]) -> LeaseTable | None:
        """The table of tasks played ahead, with the phase's other tasks added, if it holds
        tasks of this phase only, each exactly as the phase has it (the algorithm's contract:
        ask() holds every ask_ahead() request unchanged); None otherwise."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        phase = {task.task_id: task for task in tasks}
        played = ahead.tasks()
        keys = {task.request_key for task in played}
        rest = [task for task in tasks if task.task_id not in ahead]
        if any(phase.get(t.task_id) != t for t in played) or any(
            t.request_key in keys for t in rest
        ):
            log.warning("the tasks played ahead are not this phase's: played again")
            self._reissued_total += ahead.reissued
            return None
        self.played_ahead += ahead.counters.done
        ahead.add(rest)
        self._observations = self._ahead_observations
        return ahead

    def _tables_changed(self) -> None:
        if self._on_tables is not None:
            self._on_tables(self.tables)

    def _table_of(self, task_id: str) -> LeaseTable | None:
        """The table holding this task (the running phase's, or the tasks played ahead)."""
        for table in (self._table, self._ahead):
            if table is not None and task_id in table:
                return table
        return None

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

    def granted(self, worker_id: str, tasks: Iterable[PhaseTask]) -> None:
        """These tasks of the loop's tables were leased to this worker (master.fleet.shares)."""
        prefix = self._prefix
        self._roster.holding(worker_id, (prefix + task.task_id for task in tasks))

    def check(self, outcomes: Sequence[TaskOutcome]) -> None:
        """Raises ValueError, having recorded nothing, if a result of this phase (or of the tasks
        played ahead) carries a number of episode returns other than its task's, or sums that
        would spoil the phase's."""
        trials = {id(self._table): self._observations, id(self._ahead): self._ahead_observations}
        for outcome in outcomes:
            task_id, returns, error = outcome.task_id, outcome.returns, outcome.error
            table = self._table_of(task_id)
            if error or table is None:
                continue
            expected = table.episodes_of(task_id)
            if expected != len(returns):
                raise ValueError(
                    f"task {task_id[:80]}: {len(returns)} episode_returns, "
                    f"the task has {expected} episodes"
                )
            try:
                trials[id(table)] = _plus(trials[id(table)], outcome.observations)
            except ValueError as problem:
                raise ValueError(
                    f"task {task_id[:80]}: its observation sums and the phase's do not add "
                    f"up to usable ones ({problem})"
                ) from None

    def record(self, worker_id: str, outcomes: Sequence[TaskOutcome]) -> list[Disposition]:
        """Records a batch of checked results and failures; one disposition per outcome."""
        dispositions = []
        episodes_accepted = frames_accepted = 0
        busy_accepted = 0.0
        now = self._clock()
        prefix = self._prefix
        try:
            for task_id, returns, frames, error, behaviours, observations, busy in outcomes:
                table = self._table_of(task_id)
                if table is None:
                    dispositions.append(self._unknown(task_id))
                    continue
                if error:
                    disposition = table.fail_task(task_id, error, worker_id)
                    if disposition is Disposition.ACCEPTED:
                        self._log_failure(worker_id, task_id, error)
                        self._count_failure(worker_id)
                else:
                    extras = None
                    if behaviours is not None or observations is not None:
                        extras = TaskExtras(behaviours, observations)
                    # The lease's age before the result ends it: what the worker may have spent.
                    age = table.lease_age(task_id, worker_id, now) or 0.0
                    disposition = table.complete_task(task_id, returns, frames, worker_id, extras)
                    if disposition is Disposition.ACCEPTED:
                        episodes_accepted += len(returns)
                        frames_accepted += frames
                        # NaN and negative are no time; more than the lease's age is not ours.
                        spent = min(busy, age) if busy > 0 else 0.0
                        busy_accepted += spent
                        if spent > 0:
                            self._note_task_seconds(spent)
                        if table is self._table:
                            self._observations = _plus(self._observations, observations)
                        else:
                            self._ahead_observations = _plus(self._ahead_observations, observations)
                if disposition is Disposition.STALE:
                    disposition = self._unknown(task_id)
                dispositions.append(disposition)
        finally:
            self.frames_accepted += frames_accepted
            self.worker_s += busy_accepted
            self._roster.not_holding(worker_id, (prefix + o.task_id for o in outcomes))
            if episodes_accepted:
                self._roster.credit(worker_id, episodes_accepted, frames_accepted, self._clock(),
                                    busy_accepted)  # fmt: skip
            self._wake_if_complete()
        return dispositions

    def _note_task_seconds(self, seconds: float) -> None:
        self.task_seconds = moving_task_seconds(self.task_seconds, seconds)

    def heartbeat(self, worker_id: str, task_ids: Iterable[str]) -> list[str]:
        """Extends this worker's leases; the ids it should drop (done, not its own, or of no
        table here), in the order asked."""
        task_ids = list(task_ids)
        gone: set[str] = set()
        by_table: dict[int, tuple[LeaseTable, list[str]]] = {}
        for task_id in task_ids:
            table = self._table_of(task_id)
            if table is None:
                gone.add(task_id)
            else:
                by_table.setdefault(id(table), (table, []))[1].append(task_id)
        now, prefix = self._clock(), self._prefix
        for table, ids in by_table.values():
            lost = set(table.heartbeat(worker_id, ids, now))
            self._roster.holding(worker_id, (prefix + t for t in ids if t not in lost))
            gone |= lost
        dropped = [task_id for task_id in task_ids if task_id in gone]
        self._roster.not_holding(worker_id, (prefix + t for t in dropped))
        return dropped

    def release(self, worker_id: str, task_ids: Iterable[str]) -> int:
        """Hands this worker's unfinished tasks back; returns how many."""
        task_ids = list(task_ids)
        self._roster.not_holding(worker_id, (self._prefix + t for t in task_ids))
        released = 0
        for table in self.tables:
            released += table.release(worker_id, [t for t in task_ids if t in table])
        return released

    def worker_gone(self, worker_id: str) -> int:
        """A worker's connection closed: its leases end now, not when they lapse, and its tasks
        go to others. Returns how many it held."""
        held = sum(table.worker_gone(worker_id) for table in self.tables)
        if held:
            log.info("worker %r is gone: its %d task(s) go to other workers", worker_id, held)
            self._roster.holds_nothing(worker_id)
        self._wake_if_complete()
        return held

    def refuse(self, worker_id: str, reason: str, attached: Collection[str]) -> None:
        """A worker refuses every task of the run (its Release hands back those it held): the
        refusal is kept for Status, and once every worker in `attached` refuses, the run stops
        with the reason (evaluate() raises RunRefused) instead of leasing on forever."""
        if self._refusals.get(worker_id) != reason:
            # repr: the text comes from the worker and may hold newlines or terminal escapes.
            log.warning("worker %r refuses this run's tasks: %r", worker_id, reason)
        self._refusals[worker_id] = reason
        self.check_refusals(attached)

    def withdraw_refusal(self, worker_id: str, attached: Collection[str]) -> None:
        """A worker no longer refuses (it asked for tasks without a refusal), or is gone; the
        rest may now all refuse."""
        if self._refusals.pop(worker_id, None) is not None:
            log.info("worker %r no longer refuses this run's tasks", worker_id)
        if self._refusals:
            self.check_refusals(attached)

    def check_refusals(self, attached: Collection[str]) -> None:
        """Stops the run if at least one worker is attached and every one of them refuses."""
        # Sizes first: a fleet of thousands is walked only when enough of them refuse.
        if self._refused is not None or not attached or len(self._refusals) < len(attached):
            return
        reasons = [self._refusals.get(worker_id) for worker_id in attached]
        if any(reason is None for reason in reasons):
            return
        reason, count = Counter(reasons).most_common(1)[0]
        others = (
            f" ({len(reasons) - count} of them for other reasons)" if count < len(reasons) else ""
        )
        self._refused = RunRefused(
            f"every attached worker ({len(reasons)}) refuses this run's tasks{others}: {reason}"
        )
        log.error("stopping the run: %s", self._refused)
        self._phase_done.set()

    def refusals(self) -> dict[str, str]:
        """worker id -> why it refuses the run's tasks, for the workers that do."""
        return dict(self._refusals)

    def refusing(self, worker_id: str) -> bool:
        return worker_id in self._refusals

    def expire(self) -> None:
        """Re-issues the lapsed leases of the running phase (and of the tasks played ahead)."""
        now = self._clock()
        for table in self.tables:
            table.expire(now)
        self._wake_if_complete()

    def holder(self, task_id: str) -> str | None:
        """Who holds the lease of this task (of the running phase, or played ahead), if anyone."""
        table = self._table_of(task_id)
        return table.holder(task_id) if table is not None else None

    def reevaluated(self, worker_id: str) -> set[str] | None:
        """The requests of the tasks whose lease this worker holds, if each is split into
        several tasks (an elite's re-evaluation); None if one of them is not."""
        requests = {request_of(t) for table in self.tables for t in table.leased_to(worker_id)}
        return requests if requests <= self._split else None

    def leased_to(self, worker_id: str) -> list[str]:
        """The tasks whose lease (not a backup copy) this worker holds, by task id."""
        return sorted(t for table in self.tables for t in table.leased_to(worker_id))

    def recorded(self) -> dict[str, tuple[tuple[float, ...], int]]:
        """The current (or an interrupted) phase's recorded tasks; empty between phases."""
        return self._table.done() if self._table is not None else dict(self._interrupted)

    def recorded_extras(self) -> dict[str, TaskExtras]:
        """What the recorded tasks carried besides returns (behaviours, observation sums)."""
        if self._table is not None:
            return self._table.extras()  # type: ignore[return-value]
        return dict(self._interrupted_extras)

    def counters(self) -> LeaseCounters:
        """The running phase's tasks by state, and leases re-issued over the whole run: those of
        the tasks played ahead count when they happen, in the generation that played them, not
        when the next phase adopts the table."""
        reissued = self._reissued_total + sum(t.reissued for t in self.tables)
        if self._table is None:
            return LeaseCounters(0, 0, 0, reissued)
        c = self._table.counters
        return LeaseCounters(c.pending, c.leased, c.done, reissued)

    def restore_counters(self, leases_reissued: int) -> None:
        """Continues the run's count of re-issued leases from a checkpoint's."""
        if self._table is not None:
            raise RuntimeError("counters are restored before the first phase, not during one")
        self._reissued_total = leases_reissued

    def _log_failure(self, worker_id: str, task_id: str, error: str) -> None:
        # repr: the text comes from the worker and may hold newlines or terminal escapes.
        self._error_log.warning(
            self._clock(),
            "task %r failed on worker %r: %r",
            task_id[:80],
            worker_id,
            bounded_error(error),
        )

    def _count_failure(self, worker_id: str) -> None:
        """Adds a failure to the worker's figures; says so when it is held off for it."""
        now = self._clock()
        held_off_s = self._roster.failed(worker_id, now)
        if held_off_s:
            self._hold_off_log.warning(
                now,
                "worker %r failed its last %d tasks while other workers' results are accepted: "
                "it is given nothing for %.0f s (`neuro-master status` shows it)",
                worker_id,
                FAILURES_BEFORE_HOLD_OFF,
                held_off_s,
            )

    def _unknown(self, task_id: str) -> Disposition:
        # A task of an earlier phase was done already; anything else is not ours.
        if task_id in self._finished_task_ids:
            return Disposition.DUPLICATE
        return Disposition.STALE

    def _wake_if_complete(self) -> None:
        if self._table is not None and self._table.complete:
            self._phase_done.set()


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
