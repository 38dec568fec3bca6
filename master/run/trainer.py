"""The master's loop: ask the algorithm -> evaluate on the fleet -> tell.

Observers (master.observe.events) record the rest; the loop never knows which algorithm runs.
While a phase runs, the requests the algorithm already knows of the next phase
(Algorithm.ask_ahead: the GA's next offspring during its elite phase) are played at lower
priority, and the next phase takes their results: the same episodes, the same results, less
waiting on a phase's slowest task. Once the budget is spent, the run's best elite plays its
final test (master.run.final_test).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from master.algorithms.base import OFFSPRING, Algorithm, EvaluationRequest, GenerationSummary
from master.fleet.fleet import Fleet, RunFleet
from master.fleet.phases import PhaseOutcome, TaskExtras
from master.observe.events import GenerationRecord, Observer, RunSnapshot
from master.run.checkpoint import ALGORITHM, save_checkpoint, save_sidecar
from master.run.final_test import FinalTest, final_test_document, tested, write_final_test
from master.run.rundir import RunDirectory

log = logging.getLogger(__name__)
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0
"""A failed checkpoint write (a full disk, no file descriptor left) is tried again after
RETRY_FIRST_S, doubled after each failure up to RETRY_MAX_S, while the run goes on."""
FINAL_TRIES = 4
"""Writes of the last checkpoint, as the run stops, before the master gives up on it (after
RETRY_FIRST_S, then twice as long each time: 7 s at most)."""


class CheckpointNotWritten(RuntimeError):
    """The run stopped without its last checkpoint on disk."""


class _Written(NamedTuple):
    """What one checkpoint write did: the generations whose files it wrote, or what failed."""

    records: list[GenerationRecord]
    error: BaseException | None = None


_FileWrite = tuple[Callable[[], None], "GenerationRecord | None"]
"""One of a generation's files to write, and the generation to announce once it is written."""


@dataclass(frozen=True)
class Budget:
    """When to stop: after `generations`, once `frames` are spent, or at `target_score`."""

    generations: int | None = None
    frames: int | None = None
    target_score: float | None = None

    def spent_by(self, frames: int) -> bool:
        """Whether `frames` spend the frames budget (the other bounds aside)."""
        return self.frames is not None and frames >= self.frames

    def exhausted(self, generation: int, frames: int, elite_score: float) -> bool:
        if self.generations is not None and generation >= self.generations:
            return True
        if self.spent_by(frames):
            return True
        return (
            self.target_score is not None
            and math.isfinite(elite_score)
            and elite_score >= self.target_score
        )


class Trainer:
    """Drives one run. The algorithm stays pure; this class owns counters, clocks, the run dir."""

    def __init__(
        self,
        algorithm: Algorithm,
        fleet: Fleet | RunFleet,
        budget: Budget,
        run_dir: RunDirectory,
        genome_document: Callable[[Any], dict[str, Any]],
        env_id: str,
        observers: Sequence[Observer] = (),
        clock: Callable[[], float] = time.monotonic,
        config: dict[str, Any] | None = None,
        checkpoint_seconds: float = 30.0,
        resume: dict[str, Any] | None = None,
        overlap: bool = False,
        final_test: FinalTest | None = None,
    ) -> None:
        """`overlap`: play the next phase's requests ahead (False: a barrier between phases).
        `final_test`: the best elite's fresh episodes once the budget is spent (None: none)."""
        self.algorithm = algorithm
        self.fleet = fleet
        self.budget = budget
        self.run_dir = run_dir
        self.genome_document = genome_document
        self.env_id = env_id
        self.observers = list(observers)
        self.clock = clock
        self.frames = 0
        self.evaluations = 0
        self.records: list[GenerationRecord] = []
        self.config = config or {}
        self.checkpoint_seconds = checkpoint_seconds
        self._started = clock()
        self._saving: asyncio.Future[_Written] | None = None
        self._unwritten: list[_FileWrite] = []
        """Generations' files not yet written, in order: the next checkpoint write starts with
        them."""
        self.write_failures = 0
        """Checkpoint writes that failed in a row (0: the last one is on disk)."""
        self._last_write_error: BaseException | None = None
        self._write_failed = asyncio.Event()
        # Counters when the current generation began: its record spans a restart.
        self._generation_start = (0, 0, 0)
        self._recorded: dict[str, tuple[list[float], int]] = {}
        self._recorded_extras: dict[str, TaskExtras] = {}
        self.overlap = overlap
        self.final_test = final_test
        self._phase_frames: dict[str, int] = {}
        """The frames each phase of the algorithm played last time (by phase name): what the
        running one will likely add, to tell the last generation before it ends."""
        self._worker_s_before = 0.0
        """Worker-seconds of the run's earlier master processes (from the checkpoint)."""
        if resume is not None:
            self._restore(resume)

    def _restore(self, payload: dict[str, Any]) -> None:
        trainer = payload["trainer"]
        self.frames = trainer["frames"]
        self.evaluations = trainer["evaluations"]
        self._started = self.clock() - trainer["wall_s"]
        self._generation_start = tuple(trainer["generation_start"])
        self._worker_s_before = float(trainer.get("worker_s", 0.0))  # absent before the field
        self.fleet.restore_counters(leases_reissued=trainer["leases_reissued"])
        self._recorded = {
            task_id: ([math.nan if r is None else r for r in returns], frames)
            for task_id, (returns, frames) in payload["phase_recorded"].items()
        }
        # Absent from checkpoints of runs whose tasks carried nothing else.
        self._recorded_extras = {
            task_id: TaskExtras.from_json(document)
            for task_id, document in payload.get("phase_extras", {}).items()
        }

    def wall_s(self) -> float:
        """Seconds the run has trained, across restarts."""
        return self.clock() - self._started

    def worker_s(self) -> float:
        """Seconds workers spent on the run's accepted results, across restarts."""
        return self._worker_s_before + self.fleet.worker_s

    def checkpoint_payload(self) -> dict[str, Any]:
        """Everything needed to continue: algorithm, counters, and the running phase's results.

        (The algorithm's arrays, if it has any, are not in it: see _checkpoint_contents.)
        """
        recorded = {
            task_id: ([_json_float(r) for r in returns], frames)
            for task_id, (returns, frames) in self.fleet.recorded().items()
        }
        return {
            "config": self.config,
            ALGORITHM: {"name": self.algorithm.name, "state": self.algorithm.state_dict()},
            "trainer": {
                "frames": self.frames,
                "evaluations": self.evaluations,
                "wall_s": self.clock() - self._started,
                "generation_start": list(self._generation_start),
                "leases_reissued": self.fleet.counters().reissued,
                "worker_s": self.worker_s(),
            },
            "phase_recorded": recorded,
            "phase_extras": {
                task_id: extras.to_json()
                for task_id, extras in self.fleet.recorded_extras().items()
            },
        }

    def _checkpoint_contents(self) -> tuple[dict[str, Any], tuple[int, Any] | None]:
        """The checkpoint payload and, if the algorithm has arrays, (generation, arrays)."""
        payload = self.checkpoint_payload()
        # Taken now, on the loop, with the payload: the file is written later, on a thread.
        arrays = self.algorithm.arrays()
        if arrays is None:
            return payload, None
        return payload, (self.algorithm.generation, arrays)

    async def _save(self, generation: Sequence[_FileWrite] = ()) -> None:
        """Starts writing the run's checkpoint, after the files of any generation not yet
        written (and of `generation`'s: its metrics line and elite).

        The one way a checkpoint is saved. The files are written and fsynced on a thread, so a
        slow disk stalls no worker's call; one write at a time keeps them in order. Observers
        hear `generation` once its files are written and `checkpointed` once the checkpoint
        is. A write that fails (a full disk, no file descriptor left) is logged and written
        again, with whatever the run holds by then, by the next save: the periodic one comes
        after a back-off (_checkpoint_periodically). The run goes on meanwhile.
        """
        payload, sidecar = self._checkpoint_contents()
        await self._saved()
        self._unwritten.extend(generation)
        saving = asyncio.ensure_future(asyncio.to_thread(self._write_checkpoint, payload, sidecar))
        saving.add_done_callback(self._checkpoint_written)
        self._saving = saving

    def _write_checkpoint(
        self, payload: dict[str, Any], sidecar: tuple[int, Any] | None
    ) -> _Written:
        """On a thread: the generations' files in order, then the checkpoint; never raises."""
        written: list[GenerationRecord] = []
        # The loop adds to the list only between writes, never during one.
        files = self._unwritten
        try:
            while files:
                write, record = files[0]
                write()
                files.pop(0)  # written: the next try must not append its metrics line again
                if record is not None:
                    written.append(record)
            # The sidecar goes first: a checkpoint on disk never names arrays that are not.
            if sidecar is not None:
                payload = {**payload, "sidecar": save_sidecar(self.run_dir.path, *sidecar)}
            save_checkpoint(self.run_dir.path, payload)
        except Exception as error:
            return _Written(written, error)
        return _Written(written)

    async def checkpoint(self) -> bool:
        """Writes a checkpoint now (after any file still being written); whether it is on
        disk."""
        await self._save()
        await self._saved()
        return self.write_failures == 0

    async def _checkpoint_periodically(self) -> None:
        """Every checkpoint_seconds; after a failed write, sooner: after the back-off."""
        while True:
            if self.write_failures:
                await asyncio.sleep(self._retry_delay())
            else:
                self._write_failed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.checkpoint_seconds):
                        await self._write_failed.wait()
                if self.write_failures:
                    continue  # a generation's write failed meanwhile: retry after the back-off
            try:
                await self.checkpoint()
            except Exception:
                # Never silently: a bug in making the payload is logged, and tried again.
                log.exception("checkpoint failed; trying again in %.0f s", RETRY_MAX_S)
                await asyncio.sleep(RETRY_MAX_S)

    def _retry_delay(self) -> float:
        return min(RETRY_MAX_S, RETRY_FIRST_S * 2.0 ** max(0, self.write_failures - 1))

    async def _final_checkpoint(self) -> None:
        """The checkpoint the run stops with, tried FINAL_TRIES times; CheckpointNotWritten if
        none of them is written."""
        for attempt in range(FINAL_TRIES):
            if attempt:
                await asyncio.sleep(RETRY_FIRST_S * 2.0 ** (attempt - 1))
            if await self.checkpoint():
                return
        raise CheckpointNotWritten(
            f"the run's last checkpoint could not be written to {self.run_dir.path} "
            f"({self._last_write_error}); the one before it is kept"
        )

    async def run(self) -> list[GenerationRecord]:
        """Trains until the budget is spent; returns every generation's record.

        Cancelled (SIGTERM), it writes a checkpoint and leaves the run resumable: workers are
        not told the run is complete, so they wait for the master to come back.
        """
        periodic = asyncio.ensure_future(self._checkpoint_periodically())
        self._tell_observers("started", self.snapshot)
        try:
            while not self._budget_spent():
                await self._generation()
            self.fleet.drop_ahead()
            await self._play_final_test()
            self.fleet.complete_run()
        finally:
            periodic.cancel()
            try:
                await asyncio.shield(self._final_checkpoint())
            finally:
                self._tell_observers("stopped")
        return self.records

    def _budget_spent(self) -> bool:
        algorithm = self.algorithm
        return self.budget.exhausted(algorithm.generation, self.frames, algorithm.elite_score)

    def _ahead(self) -> list[EvaluationRequest]:
        """The next phase's requests to play ahead: none without the overlap, nor where the
        generations budget ends with this generation (nobody would ask for them)."""
        if not self.overlap:
            return []
        generations = self.budget.generations
        if generations is not None and self.algorithm.generation + 1 >= generations:
            return []
        # Nor where this phase will likely spend the frames budget: offspring played ahead of
        # a run's last generation are work thrown away, and at a study's end the fleet plays
        # them instead of other runs' tasks. A guess from the phase's last frames: if it is
        # wrong, the next generation runs without the overlap and nothing else changes.
        if self.budget.spent_by(self.frames + self._phase_frames.get(self.algorithm.phase, 0)):
            return []
        return self.algorithm.ask_ahead()

    async def _play_final_test(self) -> None:
        """The best elite's fresh episodes, once (a resumed run that played them plays nothing);
        their frames and episodes are not the training budget's. Checkpointed as a phase is:
        a resumed test keeps what it recorded."""
        test = self.final_test
        if test is None or test.episodes < 1 or tested(self.run_dir.path):
            return
        # The last generation's elite files first: the best elite is read from the run dir.
        await self.checkpoint()
        candidate = test.candidate()
        if candidate is None:
            log.warning("run %s has no elite to test", self.run_dir.path)
            return
        recorded, self._recorded = self._recorded, {}
        extras, self._recorded_extras = self._recorded_extras, {}
        outcome = await self.fleet.evaluate([test.request(candidate)], recorded, extras)
        (returns,) = outcome.returns.values()
        document = final_test_document(candidate, returns, outcome.frames)
        await asyncio.to_thread(write_final_test, self.run_dir.path, document)
        log.info("run %s: final test of %d episodes, mean %s", self.run_dir.path,
                 document["episodes"], document["mean"])  # fmt: skip

    async def _generation(self) -> None:
        if self.algorithm.phase == OFFSPRING and not self._recorded:
            self._generation_start = (
                self.frames, self.evaluations, self.fleet.counters().reissued
            )  # fmt: skip
        frames_before, evaluations_before, reissued_before = self._generation_start
        summary = None
        tail = _Tail()
        while summary is None:
            recorded, self._recorded = self._recorded, {}
            extras, self._recorded_extras = self._recorded_extras, {}
            phase = self.algorithm.phase
            outcome = await self.fleet.evaluate(
                self.algorithm.ask(), recorded, extras, ahead=self._ahead()
            )
            self._phase_frames[phase] = outcome.frames
            self.frames += outcome.frames
            self.evaluations += outcome.episodes
            tail.add(outcome)
            summary = self.algorithm.tell(outcome.returns, outcome.behaviours, outcome.observations)
        record = self._record(
            summary,
            self.frames - frames_before,
            self.evaluations - evaluations_before,
            self.fleet.counters().reissued - reissued_before,
            tail,
        )
        self.records.append(record)
        document = None
        if summary.elite is not None:
            document = self.genome_document(summary.elite)
            document.update(
                generation=summary.generation, elite_score=_json_float(summary.elite_score)
            )
        # Written while the next generation runs. Observers hear of a generation once its
        # files are on disk: what they write (e.g. TensorBoard steps) then belongs to a
        # generation a resumed run never plays again.
        # Metrics before the checkpoint: a crash in between leaves a metrics line the resumed
        # run drops (it truncates metrics.jsonl to the checkpoint's generation). One step per
        # file, so that a write tried again repeats none that succeeded.
        files: list[_FileWrite] = [(functools.partial(self.run_dir.append_metrics, record), None)]
        if document is not None:
            save = functools.partial(self.run_dir.save_elite, document, summary.elite_score)
            files.append((save, None))
        files[-1] = (files[-1][0], record)
        await self._save(files)

    def _checkpoint_written(self, saving: asyncio.Future[_Written]) -> None:
        if saving.cancelled():
            return
        written = saving.result()
        for record in written.records:
            self._tell_observers("generation", record, self.fleet.workers_connected())
        if written.error is None:
            if self.write_failures:
                log.warning("checkpoint written again after %d failed write(s)",
                            self.write_failures)  # fmt: skip
            self.write_failures = 0
            self._tell_observers("checkpointed")
            return
        self.write_failures += 1
        self._last_write_error = written.error
        self._write_failed.set()
        args = (self.run_dir.path, written.error, self.write_failures, self._retry_delay())
        if isinstance(written.error, OSError):
            log.warning("checkpoint not written to %s (%s; %d failed in a row): the run goes "
                        "on and writes it again in %.0f s", *args)  # fmt: skip
        else:
            log.error("checkpoint not written to %s (%r; %d failed in a row): the run goes on "
                      "and writes it again in %.0f s", *args, exc_info=written.error)  # fmt: skip

    def _tell_observers(self, event: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, event)(*args)
            except Exception:
                # An observer is a view of the run; its failure must not end the run.
                log.exception("observer %r failed on %s", observer, event)

    async def _saved(self) -> None:
        """Waits for the write under way, if any (a failed one is counted, not raised)."""
        if self._saving is not None:
            # Shielded: a cancelled run still finishes the files it started writing.
            await asyncio.shield(self._saving)
            self._saving = None

    def _record(
        self,
        summary: GenerationSummary,
        frames: int,
        evaluations: int,
        reissued: int,
        tail: _Tail,
    ) -> GenerationRecord:
        if evaluations != summary.evaluations:
            raise AssertionError(
                f"fleet played {evaluations} episodes, the algorithm counted {summary.evaluations}"
            )
        return GenerationRecord(
            generation=summary.generation,
            frames=self.frames,
            evaluations=self.evaluations,
            wall_s=round(self.clock() - self._started, 3),
            score_mean=summary.score_mean,
            score_max=summary.score_max,
            elite_score=summary.elite_score,
            elite_seeds=list(summary.elite.seeds) if summary.elite else [],
            extra=summary.metrics(),
            generation_evaluations=evaluations,
            generation_frames=frames,
            failed_evaluations=summary.failed,
            leases_reissued=reissued,
            tail_s=round(tail.seconds, 3),
            backup_tasks=tail.backups,
            backup_wins=tail.wins,
            workers_lost=tail.workers_lost,
            worker_s=round(self.worker_s(), 3),
        )

    def snapshot(self, workers: bool = False) -> RunSnapshot:
        """Where the run stands right now; with `workers`, the per-worker table too."""
        fleet = self.fleet.figures(workers)
        counters = fleet.counters
        elite = self.algorithm.elite
        return RunSnapshot(
            run_id=self.fleet.settings.run_id,
            env_id=self.env_id,
            generation=self.algorithm.generation,
            phase=self.algorithm.phase,
            frames=self.frames,
            evaluations=self.evaluations,
            elite_score=self.algorithm.elite_score,
            elite_seeds=tuple(elite.seeds) if elite is not None else (),
            tasks_pending=counters.pending,
            tasks_leased=counters.leased,
            tasks_done=counters.done,
            workers=fleet.workers,
            leases_reissued=counters.reissued,
            run_complete=fleet.run_complete,
            wall_s=self.wall_s(),
            last_record=self.records[-1] if self.records else None,
            worker_status=fleet.worker_stats,
            worker_s=self.worker_s(),
        )


@dataclass
class _Tail:
    """The phases' tails of one generation, added up (metrics.jsonl's tail_s, backup_...)."""

    seconds: float = 0.0
    backups: int = 0
    wins: int = 0
    workers_lost: int = 0

    def add(self, outcome: PhaseOutcome) -> None:
        self.seconds += outcome.tail_s
        self.backups += outcome.backup_tasks
        self.wins += outcome.backup_wins
        self.workers_lost += outcome.workers_lost


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None
