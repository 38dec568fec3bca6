"""Many tasks of different individuals in one worker: one batched forward pass per step.

`BatchedSlotRunner` is `SlotRunner`'s counterpart for `neuro-worker --envs N` (and a CUDA
device): it holds up to N tasks at once, whatever their genomes, keeps each task's weights in
a slot of a `BatchedPolicies` on the device, and evaluates every live episode of every task
in one forward pass per step. Paper-protocol Atari plays on one C++ vector env of N sub-envs,
stepped by one call. Episodes of different lengths free their slot at once for the next task.

The forward pass is float32 (TF32 off on CUDA): a genome is the same policy as on a CPU
worker up to float32 summation order (tests/test_batched.py).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from neuro.envs.make import EnvHandle
from neuro.observation_stats import normalise
from worker.batched import BatchedPolicies
from worker.envs import EnvPool, NotRunnableHere
from worker.evaluator import EvaluationSpec, Evaluator
from worker.policies import Policy, build_policy
from worker.rollout import StepTimers
from worker.slots import RunningTask, TaskRunner

__all__ = ["BatchedSlotRunner", "resolve_device"]


def resolve_device(device: str) -> str:
    """ "auto" -> "cuda" when torch sees a CUDA device, else "cpu"; ValueError naming a device
    that is neither or that is not here."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch sees no CUDA device here")
    return device


@dataclass(eq=False)
class _SlotGroup:
    """One BatchedPolicies and the slots its tasks hold; the rollout's batch key."""

    policies: BatchedPolicies
    template: Policy
    free: list[int] = field(default_factory=list)

    def act_rows(self, actors: Sequence[_SlotActor], observations: np.ndarray) -> np.ndarray:
        """Row i acts as actors[i]'s individual, normalised with its own statistics (ES)."""
        if any(actor.observation_norm is not None for actor in actors):
            rows = []
            for actor, row in zip(actors, observations, strict=True):
                if actor.observation_norm is None:
                    rows.append(np.asarray(row, dtype=np.float32))
                else:
                    mean, std = actor.observation_norm
                    rows.append(normalise(row[None], mean, std).reshape(row.shape))
            observations = np.stack(rows)
        return self.policies.act([actor.slot for actor in actors], observations)


@dataclass(eq=False)
class _SlotActor:
    """A task's individual: a slot of its group. The rollout batches all lanes of a group."""

    batch_group: _SlotGroup
    slot: int
    observation_norm: tuple[np.ndarray, np.ndarray] | None = None

    def act_batch(self, observations: np.ndarray) -> np.ndarray:
        return self.batch_group.act_rows([self] * len(observations), observations)


class BatchedSlotRunner(TaskRunner):
    """Runs up to `capacity` tasks' episodes in lockstep, one forward pass per step for all.

    The interface is SlotRunner's: the worker's main loop feeds it with start() and drains it
    with step().
    """

    def __init__(
        self,
        evaluator: Evaluator,
        capacity: int,
        device: str = "cpu",
        timers: StepTimers | None = None,
        env_threads: int = 1,
    ) -> None:
        # One vector env of `capacity` sub-envs per game: every busy slot steps in one call.
        super().__init__(evaluator, capacity, timers,
                         EnvPool(evaluator.atari_engine, capacity, env_threads))  # fmt: skip
        self.device = resolve_device(device)
        self._groups: dict[Hashable, _SlotGroup] = {}

    def __repr__(self) -> str:
        return f"BatchedSlotRunner(busy={len(self._tasks)}/{self.capacity}, {self.device})"

    def start(self, task_id: str, task: Any, spec: EvaluationSpec) -> None:
        """Takes a task into a free slot; EnvBuildError if its env cannot be built here,
        ValueError if its parameters cannot be loaded (the caller reports either)."""
        if spec.inference_dtype != "float32":
            raise NotRunnableHere(
                f"the batched worker (--envs, or a GPU) runs float32 only; this task asks for "
                f"{spec.inference_dtype!r}: run this worker with --device cpu and no --envs"
            )
        handle = self._take_env(task_id, spec)
        try:
            group = self._group(spec, handle)
            started = time.perf_counter()
            flat = self.evaluator.parameters(spec, group.template)
            norm = self.evaluator.observation_norm(spec, group.template)
            slot = group.free.pop()
            try:
                group.policies.load(slot, flat)
            except BaseException:
                group.free.append(slot)
                raise
            self.timers.decode_s += time.perf_counter() - started
        except BaseException:
            self._give_env(spec, handle)
            raise
        actor = _SlotActor(group, slot, norm)
        self._play(task_id, RunningTask(task, spec, handle, actor), actor)

    def _group(self, spec: EvaluationSpec, handle: EnvHandle) -> _SlotGroup:
        """The slot group of this network shape, built on first use."""
        key = (spec.architecture, spec.hidden_sizes, spec.env_id, spec.atari_dynamics)
        group = self._groups.get(key)
        if group is None:
            env = handle.env
            # The batched pass is torch's (CUDA or CPU); the template only lends its layout.
            template = build_policy(spec.architecture, env.observation_space, env.action_space,
                                    spec.hidden_sizes, inference_engine="torch")  # fmt: skip
            policies = BatchedPolicies(template, self.capacity, self.device)
            group = _SlotGroup(policies, template, list(range(self.capacity - 1, -1, -1)))
            self._groups[key] = group
        return group

    def _unload(self, task: RunningTask) -> None:
        """Its slot is free for the next task."""
        task.actor.batch_group.free.append(task.actor.slot)
