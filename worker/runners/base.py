"""What both runners share: up to `capacity` tasks' episodes in lockstep through one Rollout.

The client's main loop feeds a runner with start() and drains it with step(); a runner holds
each task's env and whatever it loaded for it (a policy, a slot) until the task ends or is
dropped. Replay and bench play one spec at a time with play(), the same path. Two runners:
per_genome.py (the CPU default) and batched.py (--envs, a GPU).

Each finished task's Evaluation says how long the worker spent on it (busy_s, reported as
TaskResult.busy_seconds): the time its start() took (an env, the policy built and its
parameters loaded), and for every step() it was in, an equal share of that step's time among
the tasks in it. Tasks stepped together share one forward pass and one vector env call, so
none of them alone costs the step; shares of every task add up to the time the runner worked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from neuro.envs.make import EnvHandle
from worker.evaluation.evaluator import Evaluation, Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.play.atari_vector import SubEnv
from worker.play.envs import EnvCache
from worker.play.rollout import Rollout, StepTimers

__all__ = ["RunningTask", "StepTimers", "TaskRunner"]

_PLAYED = "played"
"""The task id of a spec play() plays."""


@dataclass
class RunningTask:
    spec: EvaluationSpec
    handle: EnvHandle
    actor: Any
    """What plays it: a loaded policy (per-genome) or a slot's actor (batched)."""


class TaskRunner:
    """What both runners share: up to `capacity` tasks' episodes in lockstep through one
    Rollout; the caller feeds them with start() and drains them with step()."""

    def __init__(self, evaluator: Evaluator, capacity: int, timers: StepTimers | None,
                 envs: EnvCache, contain_failures: bool = True) -> None:  # fmt: skip
        """`contain_failures`: one task's env or policy failing ends that task alone, reported
        as its error (a worker's tasks); False: the exception ends step() (replay's play_spec)."""
        if capacity < 1:
            raise ValueError(f"slot capacity must be >= 1, got {capacity}")
        self.evaluator = evaluator
        self.capacity = capacity
        self.timers = timers or StepTimers()
        self._rollout = Rollout(self.timers, contain_failures=contain_failures)
        self._tasks: dict[str, RunningTask] = {}
        self._envs = envs
        self._busy: dict[str, float] = {}
        """Seconds each held task has taken so far (the module's rule)."""
        self._starting: tuple[str, float] | None = None
        """The task being started and when its start began."""

    @property
    def free(self) -> int:
        return self.capacity - len(self._tasks)

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def step(self) -> list[tuple[str, Evaluation]]:
        """One agent step in every slot; returns the tasks that finished (id, evaluation),
        those whose env or policy raised with an Evaluation that names the error."""
        began = time.perf_counter()
        stepped = list(self._tasks)
        done = self._rollout.step()
        failures = self._rollout.take_failures()
        if stepped:
            share = (time.perf_counter() - began) / len(stepped)
            busy = self._busy
            for task_id in stepped:
                busy[task_id] = busy.get(task_id, 0.0) + share
        finished = []
        for task_id, episodes in done:
            self._release(task_id)
            finished.append((task_id, self._timed(task_id, Evaluation.of(episodes))))
        for task_id, error in failures:
            self._release(task_id, env_usable=False)
            finished.append((task_id, self._timed(task_id, Evaluation([], [], error=error))))
        return finished

    def _timed(self, task_id: str, evaluation: Evaluation) -> Evaluation:
        """The evaluation with the seconds its task took (the module's rule)."""
        seconds = self._busy.pop(task_id, 0.0)
        return dataclasses.replace(evaluation, busy_s=seconds)

    def play(self, spec: EvaluationSpec) -> Evaluation:
        """Plays one spec's episodes to the end as this idle runner's only task (replay, bench:
        play_spec), keeping its env and policy for the next, as a worker does between tasks."""
        if self.busy:
            raise RuntimeError(f"play() takes an idle runner: {self!r}")
        self.start(_PLAYED, spec)
        while True:
            for _, evaluation in self.step():
                return evaluation

    def drop(self, task_id: str) -> EvaluationSpec | None:
        """Abandons a task mid-episode; returns its spec (None if it is not here)."""
        if task_id not in self._tasks:
            return None
        self._rollout.remove(task_id)
        self._busy.pop(task_id, None)
        return self._release(task_id).spec

    def _take_env(self, task_id: str, spec: EvaluationSpec) -> EnvHandle:
        if not self.free:
            raise RuntimeError(f"no free slot for {task_id}: {self!r}")
        self._starting = (task_id, time.perf_counter())
        return self._envs.take(spec.env_id, spec.atari_dynamics, spec.behaviour_size > 0)

    def _give_env(self, spec: EvaluationSpec, handle: EnvHandle) -> None:
        self._envs.give(spec.env_id, spec.atari_dynamics, handle)

    def _begin(self, task_id: str, task: RunningTask, actor: Any) -> None:
        """Holds the task and starts its episodes with `actor`; released again if that fails."""
        starting, self._starting = self._starting, None
        if starting is not None and starting[0] == task_id:
            self._busy[task_id] = time.perf_counter() - starting[1]
        self._tasks[task_id] = task
        spec = task.spec
        try:
            self._rollout.add(task_id, task.handle, actor, spec.episodes, spec.max_episode_steps,
                              spec.env_seed, spec.behaviour_size,
                              bool(spec.observation_size))  # fmt: skip
        except BaseException:
            self._busy.pop(task_id, None)
            self._release(task_id)
            raise

    def _release(self, task_id: str, env_usable: bool = True) -> RunningTask:
        """Frees a task's slot: its env back to the pool (closed instead if it failed: its
        state is unknown), and what it loaded (_unload)."""
        task = self._tasks.pop(task_id)
        if env_usable or isinstance(task.handle.env, SubEnv):
            # A vector sub-env goes back to its group either way: the group keeps count.
            self._give_env(task.spec, task.handle)
        else:
            with contextlib.suppress(Exception):  # it failed already; closing is best effort
                task.handle.env.close()
        self._unload(task)
        return task

    def start(self, task_id: str, spec: EvaluationSpec) -> None:
        """Takes a task into a free slot; EnvBuildError if its env cannot be built here,
        ValueError if its parameters cannot be loaded (the caller reports either)."""
        raise NotImplementedError

    def _unload(self, task: RunningTask) -> None:
        """Frees what the runner loaded for the task."""
        raise NotImplementedError
