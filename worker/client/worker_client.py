"""WorkerClient: lease tasks, run them, report; heartbeat while running; hand back on stop.

Three threads: the main thread plays episodes (torch and ALE release the GIL), a link thread
talks to the master (link.py: lease ahead, report, heartbeat, reconnect with backoff), and a
presence thread holds an Attach call open (presence.py). They share what the worker holds
(held.py) under one Condition. Nothing of the run lives here, so a worker can be killed at any
moment and the master re-issues its tasks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from worker.client.held import HeldTasks
from worker.client.link import MasterLink
from worker.client.presence import Presence
from worker.client.stats import StatsFile, WorkerCounters, worker_stats
from worker.client.wire import CALL_TIMEOUT_S, LeasedTask, failed_result, task_result
from worker.evaluation.evaluator import Evaluation, Evaluator
from worker.limits import unavailable_module
from worker.play.envs import EnvBuildError, NotRunnableHere
from worker.play.rollout import StepTimers
from worker.runners.per_genome import PerGenomeRunner

log = logging.getLogger(__name__)


class WorkerClient:
    """Connects to a master and works until the run completes or stop() is called."""

    def __init__(
        self,
        address: str,
        worker_id: str,
        evaluator: Evaluator,
        prefetch: int = 1,
        give_up_after_s: float = 0.0,
        slots: int = 1,
        stats_path: str | None = None,
        stats_interval_s: float = 5.0,
        token: str | None = None,
        root_certificates: bytes | None = None,
        runner_factory: Callable[[Evaluator, int, StepTimers], Any] | None = None,
    ) -> None:
        self.address = address
        self.worker_id = worker_id
        self.evaluator = evaluator
        self.prefetch = prefetch
        self.give_up_after_s = give_up_after_s
        self.slots = slots
        self.stats_path = stats_path
        self.stats_interval_s = stats_interval_s
        self._token = token  # private and out of __repr__: it must never reach a log line
        self._root_certificates = root_certificates
        self._runner_factory = runner_factory
        self.counters = WorkerCounters()
        self.timers = StepTimers()
        self.held = HeldTasks(slots, prefetch, batched=runner_factory is not None)
        """What this worker holds, shared by its threads (worker.client.held)."""
        self._stop = threading.Event()
        self._stats_file = StatsFile(stats_path, worker_id) if stats_path else None

    def __repr__(self) -> str:
        return f"WorkerClient({self.worker_id!r} -> {self.address}, {self.counters})"

    @property
    def batched(self) -> bool:
        """Runs tasks of different genomes together (worker.runners.batched): it leases and
        starts up to `slots` of them at once, where a PerGenomeRunner runs one genome at a time."""
        return self.held.batched

    def stop(self) -> None:
        """Stop leasing, abandon the running episode, hand everything back, exit. Signal-safe."""
        self._stop.set()

    def run(self) -> int:
        """Works until done; returns a process exit code."""
        master = MasterLink(
            self.address, self.worker_id, self.held, self._stop, self.counters, self.evaluator,
            give_up_after_s=self.give_up_after_s, token=self._token,
            root_certificates=self._root_certificates,
            write_stats=self.write_stats if self._stats_file else None,
            stats_interval_s=self.stats_interval_s,
        )  # fmt: skip
        presence = Presence(self.address, self.worker_id, self.held, self._stop,
                            self._token, self._root_certificates)  # fmt: skip
        link = threading.Thread(target=master.run, name="master-link", daemon=True)
        attached = threading.Thread(target=presence.run, name="presence", daemon=True)
        link.start()
        attached.start()
        try:
            self._work_loop()
        finally:
            self._stop.set()
            with self.held.wake:
                self.held.wake.notify_all()
            link.join(timeout=CALL_TIMEOUT_S * 2)
            # Only now, the tasks handed back: a presence call ending earlier would make the
            # master take them back as a lost worker's, an attempt spent on each.
            presence.cancel()
            attached.join(timeout=CALL_TIMEOUT_S)
        if self.held.fatal:
            log.error("worker %s stopped: %s", self.worker_id, self.held.fatal)
            return 2
        return 0

    def stats(self) -> dict:
        """Counters and the time breakdown so far."""
        return worker_stats(self.worker_id, self.slots, self.evaluator, self.counters, self.timers)

    def write_stats(self) -> bool:
        """Replaces the stats file atomically, so a reader never sees half of it; False (and a
        warning) if the disk refuses: the stats are a report, never a reason to stop working."""
        if self._stats_file is None:
            raise ValueError(f"worker {self.worker_id} has no stats file to write")
        return self._stats_file.write(self.stats())

    # -- main thread: episodes -------------------------------------------------------------

    def _work_loop(self) -> None:
        held = self.held
        if self._runner_factory is not None:
            runner = self._runner_factory(self.evaluator, self.slots, self.timers)
        else:
            runner = PerGenomeRunner(self.evaluator, self.slots, self.timers)
        while True:
            with held.wake:
                for task_id in held.cancelled:
                    if runner.drop(task_id) is not None:
                        self.counters.tasks_dropped += 1
                    held.running.pop(task_id, None)
                held.cancelled.clear()
                if self._stop.is_set() or held.fatal:
                    self._abandon(runner)
                    return
                starting = held.take_startable(runner.free) if held.inbox else []
                if not starting and not runner.busy:
                    if self._finished():
                        return
                    waited = time.perf_counter()
                    held.wake.wait(0.5)
                    self.timers.wait_s += time.perf_counter() - waited
                    continue
            for task in starting:
                self._start(runner, task)
            if runner.busy:
                finished = runner.step()
                if finished:
                    self._finish(finished)

    def _start(self, runner: Any, task: LeasedTask) -> None:
        if task.spec is None:
            # Refused when its lease arrived (worker.client.wire): reported now, as a task that
            # cannot start, so the master decides.
            log.error("task %s could not start: %s", task.task_id, task.refusal)
            self._report_failure(task, task.refusal)
            return
        if self._refused(task):
            return
        try:
            runner.start(task.task_id, task.spec)
        except NotRunnableHere as error:
            # No task of this run can run here: it stays held, and is handed back on the way out.
            self.held.fail(str(error))
        except Exception as error:  # a task that cannot start is reported; the master decides
            if isinstance(error, EnvBuildError):
                self.held.note_unsupported(task.env_id)
            else:
                log.exception("task %s could not start", task.task_id)
            self._report_failure(task, str(error) or type(error).__name__)

    def _refused(self, task: LeasedTask) -> bool:
        """Whether `task`'s run is refused here (a module it needs cannot be imported): the task
        is then handed back, not failed, and the master hears why with every lease request."""
        held = self.held
        if not held.refuses(task.run_id):
            assert task.spec is not None
            missing = unavailable_module(task.spec)
            if missing is None:
                return False
            log.error("worker %s refuses the tasks of run %s: %s", self.worker_id, task.run_id,
                      missing)  # fmt: skip
            held.refuse(task.run_id, str(missing))
        held.give_back(task.task_id)
        return True

    def _report_failure(self, task: LeasedTask, error: str) -> None:
        result = failed_result(task, error)
        self.counters.tasks_failed += 1
        held = self.held
        with held.wake:
            held.running.pop(task.task_id, None)
            held.outbox.append(result)
            held.wake.notify_all()

    def _finish(self, finished: list[tuple[str, Evaluation]]) -> None:
        held = self.held
        with held.wake:
            tasks = {task_id: held.running[task_id] for task_id, _ in finished
                     if task_id in held.running}  # fmt: skip
        results = []
        for task_id, evaluation in finished:
            task = tasks.get(task_id)
            if task is None:
                continue  # handed back meanwhile (a stop): the master re-issues it
            if evaluation.error:
                log.warning("task %s failed mid-episode: %s", task_id, evaluation.error)
                self.counters.tasks_failed += 1
            else:
                self.counters.tasks_done += 1
                self.counters.frames += sum(evaluation.frames)
            results.append(task_result(task, evaluation))
        with held.wake:
            for result in results:
                held.running.pop(result.task_id, None)
            held.outbox.extend(results)
            held.wake.notify_all()

    def _abandon(self, runner: Any) -> None:
        """On stop: drop every running episode; the link thread hands the tasks back."""
        held = self.held
        for task_id in list(held.running):
            runner.drop(task_id)
            held.abandoned.append(task_id)
            self.counters.tasks_dropped += 1
        held.running.clear()
        held.wake.notify_all()

    def _finished(self) -> bool:
        held = self.held
        return (
            self._stop.is_set() or held.fatal is not None or (held.run_complete and not held.inbox)
        )
