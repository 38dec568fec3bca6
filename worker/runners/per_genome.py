"""The CPU worker's runner: one genome at a time, its episodes batched, one core.

Episodes of the same genome (an elite re-evaluated over many episodes) share one loaded
policy, so the rollout gives them a single batched forward pass, which costs about half as
much per sample as batch-1 passes; episodes of different genomes each get their own policy,
loaded once per task.

play_spec plays one spec on a runner of its own (TaskRunner.play): replay, bench and tests play
a genome the way a worker plays its tasks, through this one path.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from neuro.envs.make import EnvHandle
from worker.evaluation.evaluator import Evaluation, Evaluator
from worker.evaluation.spec import EvaluationSpec, GenomeKey, NetworkKey
from worker.inference.policy import Policy
from worker.play.envs import EnvCache
from worker.play.rollout import StepTimers
from worker.runners.base import RunningTask, TaskRunner

__all__ = ["PerGenomeRunner", "play_spec"]


@dataclass
class _LoadedPolicy:
    policy: Policy
    users: int


class PerGenomeRunner(TaskRunner):
    """Runs up to `capacity` tasks' episodes in lockstep; the caller feeds and drains it."""

    def __init__(
        self,
        evaluator: Evaluator,
        capacity: int,
        timers: StepTimers | None = None,
        *,
        contain_failures: bool = True,
    ) -> None:
        # One single-env C++ group per busy slot, not one group of `capacity` sub-envs: a
        # vector env steps all of its sub-envs on every call, and in the offspring phase a
        # worker holds one or two tasks, so idle sub-envs would multiply the emulator's work.
        envs = EnvCache(evaluator.atari_backend, 1)
        super().__init__(evaluator, capacity, timers, envs, contain_failures)
        self._loaded: dict[GenomeKey, _LoadedPolicy] = {}
        self._spare_policies: dict[NetworkKey, list[Policy]] = defaultdict(list)

    def __repr__(self) -> str:
        busy = f"{len(self._tasks)}/{self.capacity}"
        return f"PerGenomeRunner(busy={busy}, genomes={len(self._loaded)})"

    def start(self, task_id: str, spec: EvaluationSpec) -> None:
        """Takes a task into a free slot; EnvBuildError if its env cannot be built here."""
        handle = self._take_env(task_id, spec)
        try:
            policy = self._acquire_policy(spec, handle)
        except BaseException:
            self._give_env(spec, handle)
            raise
        self._begin(task_id, RunningTask(spec, handle, policy), policy)

    def _acquire_policy(self, spec: EvaluationSpec, handle: EnvHandle) -> Policy:
        loaded = self._loaded.get(spec.genome_key)
        if loaded is not None:
            loaded.users += 1
            return loaded.policy
        # A spare of the same network, else a new one.
        spares = self._spare_policies[spec.network_key]
        policy = spares.pop() if spares else self.evaluator.build_policy(spec, handle)
        started = time.perf_counter()
        try:
            self.evaluator.load(spec, policy)
        except BaseException:
            spares.append(policy)  # a refused task leaves the policy for the next one
            raise
        self.timers.decode_s += time.perf_counter() - started
        self._loaded[spec.genome_key] = _LoadedPolicy(policy, 1)
        return policy

    def _unload(self, task: RunningTask) -> None:
        """Its policy goes to the spares once no running task uses it."""
        key = task.spec.genome_key
        loaded = self._loaded[key]
        loaded.users -= 1
        if loaded.users == 0:
            del self._loaded[key]
            self._spare_policies[key.network].append(loaded.policy)


def play_spec(evaluator: Evaluator, spec: EvaluationSpec) -> Evaluation:
    """Plays spec.episodes episodes, the first reset seeded with spec.env_seed, as a worker plays
    a task: on a PerGenomeRunner of one slot, with `evaluator`'s decoders and engine. An env or
    policy that raises raises here (EnvBuildError where the env cannot be built)."""
    return PerGenomeRunner(evaluator, 1, contain_failures=False).play(spec)
