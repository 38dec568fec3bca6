"""The fleet's tasks on one core: up to `capacity` tasks played at once through one Rollout.

Episodes of the same genome (an elite re-evaluated over many episodes) share one loaded
policy, so the rollout gives them a single batched forward pass, which costs about half as
much per sample as batch-1 passes; episodes of different genomes each get their own network,
loaded once per task.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from neuro.envs.make import EnvHandle
from worker.envs import EnvPool
from worker.evaluator import Evaluation, EvaluationSpec, Evaluator
from worker.policies import Policy, build_policy
from worker.rollout import Rollout, StepTimers
from worker.static_int8 import calibration_for

__all__ = ["RunningTask", "SlotRunner", "StepTimers", "TaskRunner"]


_SHAPE_FIELDS = 5
"""Leading fields of a genome key that decide which built network (a spare) fits it."""


@dataclass
class RunningTask:
    task: Any
    spec: EvaluationSpec
    handle: EnvHandle
    actor: Any
    """What the runner loaded for it: a genome key (SlotRunner) or a slot (batched)."""


@dataclass
class _LoadedPolicy:
    policy: Policy
    users: int


class TaskRunner:
    """What both runners share: up to `capacity` tasks' episodes in lockstep through one
    Rollout; the caller feeds them with start() and drains them with step()."""

    def __init__(self, evaluator: Evaluator, capacity: int, timers: StepTimers | None,
                 envs: EnvPool) -> None:  # fmt: skip
        if capacity < 1:
            raise ValueError(f"slot capacity must be >= 1, got {capacity}")
        self.evaluator = evaluator
        self.capacity = capacity
        self.timers = timers or StepTimers()
        # One task's env or policy failing ends that task alone, reported as its error.
        self._rollout = Rollout(self.timers, contain_failures=True)
        self._tasks: dict[str, RunningTask] = {}
        self._envs = envs

    @property
    def free(self) -> int:
        return self.capacity - len(self._tasks)

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    def task_ids(self) -> list[str]:
        return list(self._tasks)

    def step(self) -> list[tuple[str, Any, Evaluation]]:
        """One agent step in every slot; returns the tasks that finished (id, task, returns),
        those whose env or policy raised with an Evaluation that names the error."""
        finished = []
        for task_id, episodes in self._rollout.step():
            task = self._release(task_id)
            finished.append((task_id, task.task, Evaluation.of(episodes)))
        for task_id, error in self._rollout.take_failures():
            task = self._release(task_id, env_usable=False)
            finished.append((task_id, task.task, Evaluation([], [], error=error)))
        return finished

    def drop(self, task_id: str) -> Any | None:
        """Abandons a task mid-episode; returns it (None if it is not here)."""
        if task_id not in self._tasks:
            return None
        self._rollout.remove(task_id)
        return self._release(task_id).task

    def _take_env(self, task_id: str, spec: EvaluationSpec) -> EnvHandle:
        if not self.free:
            raise RuntimeError(f"no free slot for {task_id}: {self!r}")
        return self._envs.take(spec.env_id, spec.atari_dynamics, spec.behaviour_size > 0)

    def _give_env(self, spec: EvaluationSpec, handle: EnvHandle) -> None:
        self._envs.give(spec.env_id, spec.atari_dynamics, handle)

    def _play(self, task_id: str, task: RunningTask, actor: Any) -> None:
        """Holds the task and starts its episodes with `actor`; released again if that fails."""
        self._tasks[task_id] = task
        spec = task.spec
        try:
            self._rollout.add(task_id, task.handle, actor, spec.episodes, spec.max_episode_steps,
                              spec.env_seed, spec.behaviour_size,
                              bool(spec.observation_size))  # fmt: skip
        except BaseException:
            self._release(task_id)
            raise

    def _release(self, task_id: str, env_usable: bool = True) -> RunningTask:
        """Frees a task's slot: its env back to the pool (closed instead if it failed: its
        state is unknown), and what it loaded (_unload)."""
        task = self._tasks.pop(task_id)
        if env_usable or getattr(task.handle.env, "group", None) is not None:
            # A vector sub-env goes back to its group either way: the group keeps count.
            self._give_env(task.spec, task.handle)
        else:
            with contextlib.suppress(Exception):  # it failed already; closing is best effort
                task.handle.env.close()
        self._unload(task)
        return task

    def _unload(self, task: RunningTask) -> None:
        raise NotImplementedError


class SlotRunner(TaskRunner):
    """Runs up to `capacity` tasks' episodes in lockstep; the caller feeds and drains it."""

    def __init__(self, evaluator: Evaluator, capacity: int, timers: StepTimers | None = None):
        # One single-env C++ group per busy slot, not one group of `capacity` sub-envs: a
        # vector env steps all of its sub-envs on every call, and in the offspring phase a
        # worker holds one or two tasks, so idle sub-envs would multiply the emulator's work.
        super().__init__(evaluator, capacity, timers, EnvPool(evaluator.atari_engine, 1))
        self._loaded: dict[tuple, _LoadedPolicy] = {}
        self._spare_policies: dict[tuple, list[Policy]] = defaultdict(list)

    def __repr__(self) -> str:
        return f"SlotRunner(busy={len(self._tasks)}/{self.capacity}, genomes={len(self._loaded)})"

    def start(self, task_id: str, task: Any, spec: EvaluationSpec) -> None:
        """Takes a task into a free slot; EnvBuildError if its env cannot be built here."""
        handle = self._take_env(task_id, spec)
        # The first five fields make a network's shape and dtype (spares are reused by them).
        genome_key = (spec.architecture, spec.hidden_sizes, spec.env_id, spec.atari_dynamics,
                      spec.inference_dtype, spec.noise_table, spec.mutation_power, spec.seeds,
                      spec.perturbation, spec.parameters_file)  # fmt: skip
        try:
            policy = self._acquire_policy(genome_key, spec, handle)
        except BaseException:
            self._give_env(spec, handle)
            raise
        self._play(task_id, RunningTask(task, spec, handle, genome_key), policy)

    def _acquire_policy(self, key: tuple, spec: EvaluationSpec, handle: EnvHandle) -> Policy:
        loaded = self._loaded.get(key)
        if loaded is not None:
            loaded.users += 1
            return loaded.policy
        shape_key = key[:_SHAPE_FIELDS]
        spares = self._spare_policies[shape_key]
        env = handle.env
        policy = (
            spares.pop()
            if spares
            else build_policy(
                spec.architecture,
                env.observation_space,
                env.action_space,
                spec.hidden_sizes,
                inference_dtype=spec.inference_dtype,
                inference_engine=self.evaluator.inference_engine,
                calibration=calibration_for(spec.inference_dtype, spec.env_id, spec.atari_dynamics),
            )
        )
        started = time.perf_counter()
        self.evaluator.load(spec, policy)
        self.timers.decode_s += time.perf_counter() - started
        self._loaded[key] = _LoadedPolicy(policy, 1)
        return policy

    def _unload(self, task: RunningTask) -> None:
        """Its policy goes to the spares once no running task uses it."""
        loaded = self._loaded[task.actor]
        loaded.users -= 1
        if loaded.users == 0:
            del self._loaded[task.actor]
            self._spare_policies[task.actor[:_SHAPE_FIELDS]].append(loaded.policy)
