"""Several episodes at once on one core: one env per slot, one forward pass per genome.

Episodes of the same genome (an elite re-evaluated over many episodes) share a single
batched forward pass, which costs about half as much per sample as batch-1 passes; episodes
of different genomes each get their own network, loaded once per episode.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuro.envs.make import EnvHandle, make_env
from worker.evaluator import EnvBuildError, Evaluation, EvaluationSpec, Evaluator
from worker.policies import Policy, build_policy


@dataclass
class StepTimers:
    """Where a worker's time goes; the benchmark prints these."""

    env_s: float = 0.0
    forward_s: float = 0.0
    decode_s: float = 0.0
    wait_s: float = 0.0
    """Time with every slot empty, waiting on the master for work."""
    steps: int = 0
    forward_calls: int = 0
    episodes: int = 0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class _Slot:
    task: Any
    spec: EvaluationSpec
    handle: EnvHandle
    genome_key: tuple
    observation: Any = None
    total: float = 0.0
    steps: int = 0
    returns: list[float] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)


@dataclass
class _LoadedPolicy:
    policy: Policy
    users: int


class SlotRunner:
    """Runs up to `capacity` tasks' episodes in lockstep; the caller feeds and drains it."""

    def __init__(self, evaluator: Evaluator, capacity: int, timers: StepTimers | None = None):
        if capacity < 1:
            raise ValueError(f"slot capacity must be >= 1, got {capacity}")
        self.evaluator = evaluator
        self.capacity = capacity
        self.timers = timers or StepTimers()
        self._slots: dict[str, _Slot] = {}
        self._free_envs: dict[tuple[str, str], list[EnvHandle]] = defaultdict(list)
        self._loaded: dict[tuple, _LoadedPolicy] = {}
        self._spare_policies: dict[tuple, list[Policy]] = defaultdict(list)

    def __repr__(self) -> str:
        return f"SlotRunner(busy={len(self._slots)}/{self.capacity}, genomes={len(self._loaded)})"

    @property
    def free(self) -> int:
        return self.capacity - len(self._slots)

    @property
    def busy(self) -> bool:
        return bool(self._slots)

    def task_ids(self) -> list[str]:
        return list(self._slots)

    def start(self, task_id: str, task: Any, spec: EvaluationSpec) -> None:
        """Takes a task into a free slot; EnvBuildError if its env cannot be built here."""
        if not self.free:
            raise RuntimeError(f"no free slot for {task_id}: {self!r}")
        handle = self._env(spec)
        genome_key = (spec.architecture, spec.hidden_sizes, spec.env_id, spec.atari_dynamics,
                      spec.noise_table, spec.mutation_power, spec.seeds, spec.perturbation,
                      spec.parameters_file)  # fmt: skip
        try:
            self._acquire_policy(genome_key, spec, handle)
        except BaseException:
            self._free_envs[(spec.env_id, spec.atari_dynamics)].append(handle)
            raise
        slot = _Slot(task, spec, handle, genome_key)
        slot.observation, _ = handle.env.reset(seed=spec.env_seed)
        self._slots[task_id] = slot

    def step(self) -> list[tuple[str, Any, Evaluation]]:
        """One agent step in every slot; returns the tasks that finished (id, task, returns)."""
        by_genome: dict[tuple, list[_Slot]] = defaultdict(list)
        for slot in self._slots.values():
            by_genome[slot.genome_key].append(slot)
        actions: dict[int, Any] = {}
        started = time.perf_counter()
        for key, slots in by_genome.items():
            batch = np.stack([s.observation for s in slots])
            for slot, action in zip(slots, self._loaded[key].policy.act_batch(batch), strict=True):
                actions[id(slot)] = action
            self.timers.forward_calls += 1
        stepped = time.perf_counter()
        self.timers.forward_s += stepped - started
        finished = []
        for task_id, slot in list(self._slots.items()):
            action = actions[id(slot)]
            if slot.handle.env.action_space.shape == ():
                action = int(action)
            observation, reward, terminated, truncated, _ = slot.handle.env.step(action)
            slot.observation = observation
            slot.total += float(reward)
            slot.steps += 1
            cap = slot.spec.max_episode_steps
            episode_over = terminated or truncated or slot.steps == cap
            if episode_over and self._end_episode(slot):
                finished.append((task_id, slot.task, Evaluation(slot.returns, slot.frames)))
                self._release(task_id)
        self.timers.env_s += time.perf_counter() - stepped
        self.timers.steps += len(actions)
        return finished

    def drop(self, task_id: str) -> Any | None:
        """Abandons a task mid-episode; returns it (None if it is not here)."""
        slot = self._slots.get(task_id)
        if slot is None:
            return None
        self._release(task_id)
        return slot.task

    def _end_episode(self, slot: _Slot) -> bool:
        """Records the episode; starts the task's next one. True when the task is done."""
        slot.returns.append(slot.total)
        slot.frames.append(slot.handle.frames_used(slot.steps))
        self.timers.episodes += 1
        slot.total, slot.steps = 0.0, 0
        if len(slot.returns) == slot.spec.episodes:
            return True
        # Later episodes continue the env's RNG from the task's one seeded reset.
        slot.observation, _ = slot.handle.env.reset()
        return False

    def _env(self, spec: EvaluationSpec) -> EnvHandle:
        pool = self._free_envs[(spec.env_id, spec.atari_dynamics)]
        if pool:
            return pool.pop()
        try:
            return make_env(spec.env_id, spec.atari_dynamics)
        except Exception as error:  # any failure to build is reported, never fatal
            raise EnvBuildError(f"cannot build env {spec.env_id!r}: {error}") from error

    def _acquire_policy(self, key: tuple, spec: EvaluationSpec, handle: EnvHandle) -> None:
        loaded = self._loaded.get(key)
        if loaded is not None:
            loaded.users += 1
            return
        shape_key = key[:4]
        spares = self._spare_policies[shape_key]
        env = handle.env
        policy = (
            spares.pop()
            if spares
            else build_policy(
                spec.architecture, env.observation_space, env.action_space, spec.hidden_sizes
            )
        )
        started = time.perf_counter()
        policy.load_parameters(self.evaluator.parameters(spec, policy))
        self.timers.decode_s += time.perf_counter() - started
        self._loaded[key] = _LoadedPolicy(policy, 1)

    def _release(self, task_id: str) -> None:
        slot = self._slots.pop(task_id)
        self._free_envs[(slot.spec.env_id, slot.spec.atari_dynamics)].append(slot.handle)
        loaded = self._loaded[slot.genome_key]
        loaded.users -= 1
        if loaded.users == 0:
            del self._loaded[slot.genome_key]
            self._spare_policies[slot.genome_key[:4]].append(loaded.policy)
