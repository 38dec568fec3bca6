"""The Task messages a run hands out: what every task shares, and the ES parameters' bytes.

Part of the gRPC edge with master.fleet.service: the two are where the master builds protobuf
messages; the fleet behind them and the loop above speak plain values.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from master.algorithms import registry
from master.algorithms.base import Parameters, Perturbation
from master.config import RunConfig
from master.fleet.leases import PhaseTask
from neuro.envs.behaviour import behaviour_range
from neuro.v1 import evolution_pb2 as pb
from neuro.wire import ATARI_DYNAMICS_TO_WIRE

FIXED_VERSION = 2**62
"""The version a fixed vector is served under (ParameterStore.fix): no update reaches it."""


class ParameterStore:
    """The ES's current parameters as wire bytes and sha256, computed once per version.

    With observation normalisation the bytes are theta, then the observation mean and std.
    A fixed vector (the best elite's, for the final test) is served beside them.
    """

    def __init__(self, current: Callable[[], Parameters]) -> None:
        self._current = current
        self._cached: tuple[int, bytes, str] | None = None
        self._fixed: tuple[int, bytes, str] | None = None

    def fix(self, vector: Any) -> int:
        """Serves `vector` (float32: theta, then any observation mean and std) as a version of
        its own, FIXED_VERSION, from now on; returns that version."""
        data = vector.astype("<f4").tobytes()
        self._fixed = (FIXED_VERSION, data, hashlib.sha256(data).hexdigest())
        return FIXED_VERSION

    def observation_norm(self) -> tuple[Any, Any] | None:
        """The current version's observation (mean, std), if the run normalises observations."""
        return self._current().observation_norm

    def get(self, version: int | None = None) -> tuple[int, bytes, str] | None:
        """(version, float32 little-endian bytes, sha256); None if `version` is neither current
        nor the fixed one."""
        if self._fixed is not None and version == self._fixed[0]:
            return self._fixed
        parameters = self._current()
        if version is not None and version != parameters.version:
            return None
        if self._cached is None or self._cached[0] != parameters.version:
            vectors = [parameters.theta, *(parameters.observation_norm or ())]
            data = b"".join(v.astype("<f4").tobytes() for v in vectors)
            self._cached = (parameters.version, data, hashlib.sha256(data).hexdigest())
        return self._cached


@dataclass(frozen=True)
class TaskTemplate:
    """The parts of every task that are fixed for the whole run."""

    run_id: str
    env: pb.EnvSpec
    policy: pb.PolicySpec
    noise_table: pb.NoiseTableSpec
    mutation_power: float
    max_episode_steps: int
    lease_seconds: float
    parameters: ParameterStore | None = None
    """ES runs: where perturbation tasks' parameters come from."""
    behaviour_size: int = 0
    """Novelty search: the behaviour characterisation's size each episode reports."""
    observation_size: int = 0
    """ES with observation normalisation: the size of the observation sums each task reports
    (and of the mean and std that follow theta in a version's bytes)."""
    observation_count_limit: int = 0
    """Most observations one episode can feed the policy (its step limit, + 1 for the reset),
    by the master's own settings: what one result's sums may count per episode. 0: no limit
    is known (an env with no time limit, in a run with no --max-episode-steps)."""
    behaviour_range: tuple[float, float] | None = None
    """(low, high) every behaviour value lies in, where the env's BC rule says (Atari RAM)."""

    @functools.cached_property
    def _prototype(self) -> pb.Task:
        return pb.Task(
            run_id=self.run_id,
            genome=pb.Genome(mutation_power=self.mutation_power, noise_table=self.noise_table),
            env=self.env,
            policy=self.policy,
            max_episode_steps=self.max_episode_steps,
            lease_seconds=self.lease_seconds,
            behaviour_size=self.behaviour_size,
        )

    def add_tasks(self, response: pb.LeaseResponse, granted: Sequence[PhaseTask]) -> None:
        """Appends one Task per granted task to the response."""
        # Copying a prebuilt message and setting four fields costs less than half of building
        # every submessage from keyword arguments, and a lease hands out up to 256 tasks.
        prototype, add = self._prototype, response.tasks.add
        for phase_task in granted:
            task = add()
            task.CopyFrom(prototype)
            task.task_id = phase_task.task_id
            genome = phase_task.genome
            if isinstance(genome, Perturbation):
                self._add_perturbation(task, genome)
            else:
                task.genome.seeds.extend(genome.seeds)
            task.episodes = phase_task.episodes
            task.env_seed = phase_task.env_seed

    def _add_perturbation(self, task: pb.Task, perturbation: Perturbation) -> None:
        assert self.parameters is not None, "an ES task needs the template's parameters"
        current = self.parameters.get(perturbation.version)
        assert current is not None, "tasks of a finished update are never leased"
        version, data, sha256 = current
        es = task.perturbation
        es.version, es.noise_index, es.sign = version, perturbation.noise_index, perturbation.sign
        es.sigma, es.parameters_sha256 = self.mutation_power, sha256
        es.num_params = len(data) // 4 - 2 * self.observation_size
        es.observation_size = self.observation_size


def task_template(
    config: RunConfig, parameters: ParameterStore | None = None, behaviour_size: int = 0
) -> TaskTemplate:
    """What every task of the run shares; `behaviour_size` > 0 asks for behaviours."""
    norm = parameters.observation_norm() if parameters is not None else None
    dynamics = ATARI_DYNAMICS_TO_WIRE[config.atari_dynamics]
    return TaskTemplate(
        run_id=config.run_id,
        env=pb.EnvSpec(env_id=config.env_id, atari_dynamics=dynamics if config.atari else 0),
        policy=pb.PolicySpec(
            architecture=config.architecture,
            hidden_sizes=config.hidden_sizes,
            inference_dtype=config.inference_dtype,
            # A user's network: its factory and options (empty for the built-in networks).
            factory=config.policy_factory,
            options=config.policy_options,
        ),
        noise_table=pb.NoiseTableSpec(seed=config.noise_table_seed, size=config.noise_table_size),
        mutation_power=registry.get(config.algorithm).mutation_power(config),
        max_episode_steps=config.max_episode_steps,
        lease_seconds=config.lease_seconds,
        parameters=parameters,
        behaviour_size=behaviour_size,
        observation_size=0 if norm is None else int(norm[0].size),
        observation_count_limit=0 if norm is None else _observations_per_episode(config),
        behaviour_range=behaviour_range(config.atari) if behaviour_size else None,
    )


def _observations_per_episode(config: RunConfig) -> int:
    # At most one observation per step and one for the reset, as the frames + episodes bound
    # at the edge counts them.
    steps = config.episode_step_limit
    return steps + 1 if steps else 0
