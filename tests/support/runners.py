"""Driving a task runner as the worker's main loop does, for tests that compare runners."""

from __future__ import annotations

from typing import Any

from worker.evaluation.spec import EvaluationSpec


def run_all(runner: Any, specs: dict[str, EvaluationSpec]) -> dict[str, tuple[list, list]]:
    """Feeds every task as slots free up, in order; each task's (returns, frames). A task
    that failed fails the test, naming its error."""
    waiting, results = list(specs), {}
    while waiting or runner.busy:
        while waiting and runner.free:
            task_id = waiting.pop(0)
            runner.start(task_id, specs[task_id])
        for task_id, evaluation in runner.step():
            assert not evaluation.error, evaluation.error
            results[task_id] = (evaluation.returns, evaluation.frames)
    return results
