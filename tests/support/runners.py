"""Driving a task runner as the worker's main loop does, and playing a spec by hand outside
every runner, for tests that compare runners."""

from __future__ import annotations

from typing import Any

from neuro.envs.make import make_env
from worker.evaluation.evaluator import Evaluation, Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.play.rollout import run_episode


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


def played_by_hand(spec: EvaluationSpec, evaluator: Evaluator) -> Evaluation:
    """The protocol by hand, outside every runner: a fresh env, the spec's policy built and
    loaded through `evaluator`, then one episode after another, the first reset seeded and the
    rest continuing the env's RNG."""
    handle = make_env(spec.env_id, spec.atari_dynamics)
    try:
        policy = evaluator.build_policy(spec, handle)
        evaluator.load(spec, policy)
        episodes = [run_episode(policy.act, handle, spec.max_episode_steps,
                                spec.env_seed if episode == 0 else None)
                    for episode in range(spec.episodes)]  # fmt: skip
    finally:
        handle.env.close()
    return Evaluation.of(episodes)
