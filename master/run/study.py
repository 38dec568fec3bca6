"""Serving a study: its runs on one master, one port, one fleet.

The StudyRunner trains up to `max_concurrent_runs` runs at once, each a Trainer of its own on
the study's one Fleet (its RunFleet: its phases, its leases, its task ids qualified by its key
on the wire) with its own run dir, lock, config.json, metrics.jsonl, checkpoints, genomes and
TensorBoard, as a single run has them; the others wait in the study file's order, runs that
were running when the master stopped first. A run that ends starts the next. A run that fails
(its workers refuse its module, its checkpoint cannot be read) is failed with its error and the
others go on. Each run's state goes to the study dir as it changes (StudyStates: the study
room's StudyDir), so the same command after a stop resumes every unfinished run from its own
checkpoint, by the run room's usual resume path.

The runner is also the study's view for its watchers (master.observe.events.StudyView: each
run's state and snapshot, the fleet's utilisation) and the figures the Status call and
/metrics read (snapshot(): the fleet's, every run's together).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from master.config import RunConfig
from master.fleet.fleet import Fleet, RunFleet
from master.fleet.phases import FleetSettings
from master.fleet.service import EvolutionService
from master.observe.events import (
    COMPLETE,
    FAILED,
    QUEUED,
    RUN_STATES,
    RUNNING,
    Observer,
    RunSnapshot,
    RunState,
    RunView,
)
from master.run.checkpoint import algorithm_section, load_checkpoint
from master.run.final_test import tested
from master.run.run_setup import build_run, resume_config
from master.run.rundir import run_dir_lock
from master.run.s3_mirror import FINAL_SYNC_TIMEOUT_S, MirrorLoop, status_document
from master.run.study_mirror import StudyMirror
from master.run.trainer import Trainer

log = logging.getLogger(__name__)


class StudyStates(Protocol):
    """Where the runner records each run's state: master.study.studydir.StudyDir is one."""

    def set_state(self, name: str, state: str, error: str = "") -> None: ...


class StudyWatcher(Protocol):
    """What shows the study as it runs: master.observe.study_progress.StudyProgress is one."""

    def observer_for(
        self, run_name: str, generations: int | None = None, frames: int | None = None
    ) -> Observer: ...
    def run_state(self, name: str, state: str, error: str = "") -> None: ...


@dataclass(frozen=True)
class StudyRunPlan:
    """One run of the study as the runner serves it: plain values from the study room."""

    name: str
    env_id: str
    seed: int
    label: str
    config: RunConfig
    """Its settings and budget as the study file gives them (a resumed run keeps its own
    settings, from its checkpoint, and takes this budget)."""
    test_episodes: int
    run_dir: Path
    state: RunState
    """Its state when the study starts: complete and failed runs are not served again."""


@dataclass(frozen=True)
class StudySnapshot(RunSnapshot):
    """Where the whole study stands: the fleet's figures, every run served together, with the
    runs and the fleet's utilisation (what Status lists: master.fleet.service.StudyFigures)."""

    views: tuple[RunView, ...] = ()
    busy: float | None = None

    def runs(self) -> tuple[RunView, ...]:
        return self.views

    def utilisation(self) -> float | None:
        return self.busy


@dataclass
class _Served:
    """A run being served: its trainer, its task, the run dir's lock it holds and its S3 sync."""

    trainer: Trainer
    key: str
    task: asyncio.Future[object]
    locks: contextlib.ExitStack
    syncer: MirrorLoop | None = None


@dataclass
class _Run:
    plan: StudyRunPlan
    state: RunState
    error: str = ""
    trainer: Trainer | None = None
    """Its trainer, once it started in this process (its snapshot stays after it ends)."""


@dataclass
class StudyOptions:
    """How the study's runs train: checkpoints and the overlap, as a single run's."""

    checkpoint_seconds: float = 30.0
    overlap: bool = True
    watcher: StudyWatcher | None = None
    clock: Callable[[], float] = field(default=time.monotonic)
    mirror: StudyMirror | None = None
    """Set: each run dir goes to S3 as a single run's does, and the study's files with it."""
    s3_sync_seconds: float = 60.0


class StudyRunner:
    """Serves a study's runs on one fleet, `max_concurrent` at a time; see the module."""

    def __init__(
        self,
        name: str,
        plans: Sequence[StudyRunPlan],
        fleet: Fleet,
        service: EvolutionService,
        states: StudyStates,
        max_concurrent: int,
        options: StudyOptions | None = None,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self.name = name
        self._runs = {plan.name: _Run(plan, plan.state) for plan in plans}
        self._fleet = fleet
        self._service = service
        self._states = states
        self.max_concurrent = max_concurrent
        self.options = options or StudyOptions()
        self._served: dict[str, _Served] = {}
        self._started = self.options.clock()

    def __repr__(self) -> str:
        counts = {state: sum(r.state == state for r in self._runs.values()) for state in RUN_STATES}
        return f"StudyRunner({self.name!r}, {counts})"

    # -- serving ------------------------------------------------------------------------------

    async def run(self) -> dict[str, RunState]:
        """Serves every run not yet complete or failed; returns each run's state at the end.

        Once every run is complete or failed, workers are told the study is over. Cancelled
        (SIGTERM), each run served checkpoints and stays `running` in the study dir, so the
        same command resumes it; workers are not told anything is over.
        """
        watcher = self.options.watcher
        waiting: deque[str] = deque()
        # Started runs first (they resume), then the queued ones, in the file's order.
        for state in (RUNNING, QUEUED):
            waiting += (name for name, run in self._runs.items() if run.state == state)
        for name, run in self._runs.items():
            if watcher is not None:
                watcher.run_state(name, QUEUED if name in waiting else run.state, run.error)
        try:
            while waiting or self._served:
                while waiting and len(self._served) < self.max_concurrent:
                    self._start(waiting.popleft())
                if not self._served:
                    continue
                tasks = {served.task: name for name, served in self._served.items()}
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    await self._finish(tasks[task])
            self._fleet.complete_run()
        finally:
            await self._stop_served()
        return {name: run.state for name, run in self._runs.items()}

    def _start(self, name: str) -> None:
        """Starts serving a run: its lock, its checkpoint if it has one, its trainer; a run that
        cannot start is failed, naming why."""
        run = self._runs[name]
        plan = run.plan
        locks = contextlib.ExitStack()
        added: list[RunFleet] = []

        def add_run(settings: FleetSettings) -> RunFleet:
            added.append(self._fleet.add_run(settings))
            return added[-1]

        try:
            locks.enter_context(run_dir_lock(plan.run_dir))
            trainer, template = self._build(plan, add_run)
        except Exception as error:
            for fleet_run in added:
                self._fleet.remove_run(fleet_run.key)
            locks.close()
            log.exception("run %s could not start", name)
            self._set_state(name, FAILED, _error_text(error))
            return
        key = added[0].key
        self._service.serve_run(key, template)
        run.trainer = trainer
        syncer = self._syncer(name, trainer)
        self._served[name] = _Served(trainer, key, asyncio.ensure_future(trainer.run()), locks,
                                     syncer)  # fmt: skip
        self._set_state(name, RUNNING)

    def _syncer(self, name: str, trainer: Trainer) -> MirrorLoop | None:
        """The run dir's S3 sync, started, as a single run's (after each checkpoint too)."""
        mirror = self.options.mirror
        if mirror is None:
            return None
        syncer = MirrorLoop(mirror.run(name), trainer.run_dir.path,
                            lambda: status_document(trainer.snapshot()),
                            self.options.s3_sync_seconds)  # fmt: skip
        trainer.observers.append(syncer)
        syncer.start()
        return syncer

    def _build(
        self, plan: StudyRunPlan, add_run: Callable[[FleetSettings], RunFleet]
    ) -> tuple[Trainer, object]:
        """The run's trainer over a run of the study's fleet, resumed from its checkpoint if its
        run dir holds one (its own settings, the study's budget), and its task template."""
        resume = load_checkpoint(plan.run_dir)
        config = plan.config
        if resume is not None:
            budget = {"generations": config.generations, "frames": config.frames,
                      "target_score": config.target_score}  # fmt: skip
            config = resume_config(resume, **budget)
            generation = algorithm_section(resume)[1].get("generation")
            log.info("run %s resumes from its checkpoint at generation %s", plan.name, generation)
        watcher = self.options.watcher
        observers = []
        if watcher is not None:
            observers.append(watcher.observer_for(plan.name, config.generations, config.frames))
        built = build_run(config, plan.run_dir, add_run, observers, resume,
                          self.options.checkpoint_seconds, self.options.overlap,
                          plan.test_episodes)  # fmt: skip
        return built.trainer, built.template

    async def _finish(self, name: str) -> None:
        """A run's trainer returned or failed: the run leaves the fleet, its lock is released,
        and its state is recorded."""
        served = self._served.pop(name)
        self._fleet.remove_run(served.key)
        self._service.stop_serving_run(served.key)
        if served.syncer is not None:
            # Bounded: a dead S3 cannot hold up the study (the run dir has everything).
            await served.syncer.close(FINAL_SYNC_TIMEOUT_S)
        served.locks.close()
        task = served.task
        error = None if task.cancelled() else task.exception()
        if task.cancelled():
            error = asyncio.CancelledError("the run was cancelled")
        plan = self._runs[name].plan
        if error is not None:
            log.error("run %s failed: %s", name, _error_text(error))
            self._set_state(name, FAILED, _error_text(error))
        elif plan.test_episodes > 0 and not tested(plan.run_dir):
            self._set_state(name, FAILED, "its budget is spent but it wrote no final test")
        else:
            self._set_state(name, COMPLETE)

    async def _stop_served(self) -> None:
        """Cancels every run still served (each checkpoints) and waits for them; their state
        stays `running`, for the same command to resume them."""
        served, self._served = list(self._served.values()), {}
        for each in served:
            each.task.cancel()
        for each in served:
            with contextlib.suppress(BaseException):
                await each.task
            self._fleet.remove_run(each.key)
            self._service.stop_serving_run(each.key)
            if each.syncer is not None:
                with contextlib.suppress(Exception):
                    await each.syncer.close(FINAL_SYNC_TIMEOUT_S)
            each.locks.close()

    def _set_state(self, name: str, state: RunState, error: str = "") -> None:
        run = self._runs[name]
        run.state, run.error = state, error
        try:
            self._states.set_state(name, state, error)
        except (OSError, ValueError) as problem:
            # study.json is the study's record; its run dirs hold the truth it is read from.
            log.error("study.json: run %s's state %s not recorded: %s", name, state, problem)
        if self.options.mirror is not None:
            self.options.mirror.put_study_files()
        if self.options.watcher is not None:
            self.options.watcher.run_state(name, state, error)

    # -- what watchers read -------------------------------------------------------------------

    def runs(self) -> tuple[RunView, ...]:
        """Every run of the study, in the file's order, as its watchers see it."""
        views = []
        for name, run in self._runs.items():
            plan = run.plan
            snapshot = run.trainer.snapshot() if run.trainer is not None else None
            views.append(RunView(name, plan.env_id, plan.seed, plan.label, run.state, snapshot,
                                 run.error))  # fmt: skip
        return tuple(views)

    def utilisation(self) -> float | None:
        """How busy the fleet's workers were over the last minute (None: unknown yet)."""
        return self._fleet.utilisation()

    def states(self) -> dict[str, RunState]:
        return {name: run.state for name, run in self._runs.items()}

    def snapshot(self, workers: bool = False) -> StudySnapshot:
        """The study as one snapshot: the runs served now added up, the fleet's workers, and
        every run's view; `workers`: with the per-worker table."""
        views = self.runs()
        served = [view.snapshot for view in views if view.snapshot is not None]
        running = [v.snapshot for v in views if v.snapshot is not None and v.state == RUNNING]
        return StudySnapshot(
            run_id=self.name,
            env_id=f"study of {len(views)} runs",
            generation=sum(s.generation for s in served),
            phase=", ".join(sorted({s.phase for s in running})),
            frames=sum(s.frames for s in served),
            evaluations=sum(s.evaluations for s in served),
            elite_score=math.nan,
            elite_seeds=(),
            tasks_pending=sum(s.tasks_pending for s in running),
            tasks_leased=sum(s.tasks_leased for s in running),
            tasks_done=sum(s.tasks_done for s in running),
            workers=self._fleet.workers_connected(),
            leases_reissued=sum(s.leases_reissued for s in served),
            run_complete=self._fleet.run_complete,
            wall_s=self.options.clock() - self._started,
            worker_status=tuple(self._fleet.worker_stats()) if workers else (),
            worker_s=sum(s.worker_s for s in served),
            views=views,
            busy=self.utilisation(),
        )


def _error_text(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return " ".join(text.split())[:1000]
