"""Many tasks of different individuals in one worker: one batched forward pass per step.

`BatchedRunner` is `PerGenomeRunner`'s counterpart for `neuro-worker --envs N` (and a CUDA
device): it holds up to N tasks at once, whatever their genomes, keeps each task's weights in
a slot of the batched engine's GroupedForward on the device (worker/inference/engines/
torch_grouped), and evaluates every live episode of every task in one forward pass per step.
Paper-protocol Atari plays on two C++ vector envs of N/2 sub-envs that take turns (pipelined,
as Uber's accelerated Deep GA did): while the emulator's threads step one half, the device
computes the other half's actions, so neither waits for the other. Episodes of different
lengths free their slot at once for the next task. On a CUDA device a genome's
seeds are decoded there (worker/evaluation/device_decode.py): only the seeds cross.

The forward pass is float32 (TF32 off on CUDA): a genome is the same policy as on a CPU
worker up to float32 summation order (tests/worker/runners/test_batched_runner.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuro.envs.make import EnvHandle
from neuro.inference import BATCHED, CPU, dtypes_for
from neuro.observation_stats import normalise
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec, NetworkKey
from worker.inference.actions import actions_from_outputs
from worker.inference.base import GroupedForward, NetSpec
from worker.inference.devices import resolve_device
from worker.inference.policy import network_spec
from worker.inference.registry import select
from worker.play.envs import EnvCache, NotRunnableHere
from worker.play.rollout import StepTimers
from worker.runners.base import RunningTask, TaskRunner

__all__ = ["BatchedRunner"]


@dataclass(eq=False)
class _SlotGroup:
    """One GroupedForward, its network and the slots its tasks hold; the rollout's batch key."""

    forward: GroupedForward
    network: NetSpec
    action_space: Any
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
        outputs = self.forward([actor.slot for actor in actors], observations)
        return actions_from_outputs(outputs, self.action_space)


@dataclass(eq=False)
class _SlotActor:
    """A task's individual: a slot of its group. The rollout batches all lanes of a group."""

    batch_group: _SlotGroup
    slot: int
    observation_norm: tuple[np.ndarray, np.ndarray] | None = None

    def act_batch(self, observations: np.ndarray) -> np.ndarray:
        return self.batch_group.act_rows([self] * len(observations), observations)


class BatchedRunner(TaskRunner):
    """Runs up to `capacity` tasks' episodes in lockstep, one forward pass per step for all.

    The interface is PerGenomeRunner's: the worker's main loop feeds it with start() and drains it
    with step(). `decode_on_device`: decode genomes on the device (default: on a CUDA one).
    `pipelined`: Atari slots in two halves that take turns (False: one vector env, stepped
    after the forward pass of every slot).
    """

    def __init__(
        self,
        evaluator: Evaluator,
        capacity: int,
        device: str = CPU,
        timers: StepTimers | None = None,
        env_threads: int = 1,
        decode_on_device: bool | None = None,
        pipelined: bool = True,
    ) -> None:
        # Per game, `capacity` sub-envs in vector envs stepped by one call each: pipelined, two
        # halves that take turns, one stepping in the emulator's threads while the other's
        # actions are computed; else one vector env, stepped after every slot's forward pass.
        envs = EnvCache(evaluator.atari_backend, capacity, env_threads, pipelined=pipelined)
        super().__init__(evaluator, capacity, timers, envs)
        self.pipelined = envs.pipelined
        self.device = resolve_device(device)
        self.decode_on_device = self.device != CPU if decode_on_device is None else decode_on_device
        self._groups: dict[NetworkKey, _SlotGroup] = {}

    def __repr__(self) -> str:
        return f"BatchedRunner(busy={len(self._tasks)}/{self.capacity}, {self.device})"

    def start(self, task_id: str, spec: EvaluationSpec) -> None:
        """Takes a task into a free slot; EnvBuildError if its env cannot be built here,
        ValueError if its parameters cannot be loaded (the caller reports either)."""
        served = dtypes_for(spec.architecture, BATCHED, self.device)
        if spec.policy is not None:
            raise NotRunnableHere(
                f"the batched worker (--envs, or a GPU) runs the networks neuro builds; a user's "
                f"network ({spec.policy.factory}) runs on the per-genome worker's torch engine: "
                "run this worker with --device cpu and no --envs"
            )
        if spec.inference_dtype not in served:
            raise NotRunnableHere(
                f"the batched worker (--envs, or a GPU) runs {', '.join(served)} only; this "
                f"task asks for {spec.inference_dtype!r}: run this worker with --device cpu "
                "and no --envs, or start the run with neuro-master --inference-dtype float32 "
                "(a new Atari run on CPU workers defaults to int8-static)"
            )
        handle = self._take_env(task_id, spec)
        try:
            group = self._group(spec, handle)
            started = time.perf_counter()
            if self.decode_on_device:
                flat = self.evaluator.device_parameters(spec, group.network, self.device)
            else:
                flat = self.evaluator.parameters(spec, group.network)
            norm = self.evaluator.observation_norm(spec, group.network)
            slot = group.free.pop()
            try:
                group.forward.load(slot, flat)
            except BaseException:
                group.free.append(slot)
                raise
            self.timers.decode_s += time.perf_counter() - started
        except BaseException:
            self._give_env(spec, handle)
            raise
        actor = _SlotActor(group, slot, norm)
        self._begin(task_id, RunningTask(spec, handle, actor), actor)

    def _group(self, spec: EvaluationSpec, handle: EnvHandle) -> _SlotGroup:
        """The slot group of this network, built on first use."""
        group = self._groups.get(spec.network_key)
        if group is None:
            env = handle.env
            network = network_spec(spec.architecture, env.observation_space, env.action_space,
                                   spec.hidden_sizes, spec.inference_dtype)  # fmt: skip
            engine = select(network.dtype, network.architecture, BATCHED, self.device)
            forward = engine.grouped(network, self.capacity, self.device)
            group = _SlotGroup(forward, network, env.action_space,
                               list(range(self.capacity - 1, -1, -1)))  # fmt: skip
            self._groups[spec.network_key] = group
        return group

    def _unload(self, task: RunningTask) -> None:
        """Its slot is free for the next task."""
        task.actor.batch_group.free.append(task.actor.slot)
