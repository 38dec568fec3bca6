"""The worker's side of the wire: a leased pb.Task becomes plain values once, when it arrives,
and a finished task becomes a pb.TaskResult; also how often and how long the calls may take.

Nothing past this module holds a task as protobuf: the scheduling (held.py), the main loop
(worker_client.py) and the runners read a LeasedTask. Only the link and presence threads
(link.py, presence.py) build requests.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from neuro.inference import MODULE_ARCHITECTURE
from neuro.noise import NoiseTableSpec
from neuro.policy_spec import UserPolicy
from neuro.v1 import evolution_pb2 as pb
from neuro.wire import ATARI_DYNAMICS_FROM_WIRE, MAX_ERROR_CHARS
from worker.evaluation.evaluator import Evaluation
from worker.evaluation.spec import EvaluationSpec
from worker.limits import check_spec

CALL_TIMEOUT_S = 10.0
"""The deadline of every unary call to the master."""
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
"""A lost master is retried after FIRST_BACKOFF_S, doubling up to this."""


def back_off(stop: threading.Event, delay: float) -> float:
    """Waits about `delay` seconds, or until `stop`; returns the next, doubled delay. Jittered,
    so a fleet of workers that lost its master does not come back in step."""
    stop.wait(delay * random.uniform(0.5, 1.0))
    return min(delay * 2, MAX_BACKOFF_S)


@dataclass(frozen=True)
class ParameterVersion:
    """The ES parameter version a task plays, fetched once per version before it is held."""

    version: int
    sha256: str
    values: int | None
    """Parameters plus any observation statistics; None: a master that does not say."""
    run_id: str = ""
    """The run the version is of: a master serving several runs numbers each one's from 0."""


@dataclass(frozen=True)
class LeasedTask:
    """A leased task as plain values, converted once when its lease arrives."""

    task_id: str
    run_id: str
    lease_seconds: float
    """As the master sent it: heartbeat_interval ignores absurd values."""
    env_id: str
    genome_key: Hashable
    """Which individual it evaluates (the spec's genome_key, the key runners load policies by);
    a refused task is an individual of its own."""
    spec: EvaluationSpec | None
    """None: beyond this worker's limits; it fails, naming `refusal`, when it starts."""
    refusal: str = ""
    parameters: ParameterVersion | None = None
    """ES: the parameter version its perturbation applies to."""


def leased_task(task: pb.Task) -> LeasedTask:
    """A wire task as plain values; one this worker refuses keeps its reason (spec None)."""
    try:
        spec, refusal = spec_from_task(task), ""
    except ValueError as error:
        spec, refusal = None, str(error) or type(error).__name__
    parameters = None
    if task.HasField("perturbation"):
        es = task.perturbation
        values = es.num_params + 2 * es.observation_size if es.num_params else None
        parameters = ParameterVersion(es.version, es.parameters_sha256, values, task.run_id)
    return LeasedTask(
        task_id=task.task_id,
        run_id=task.run_id,
        lease_seconds=task.lease_seconds,
        env_id=task.env.env_id,
        genome_key=spec.genome_key if spec is not None else (task.run_id, task.task_id),
        spec=spec,
        refusal=refusal,
        parameters=parameters,
    )


def atari_dynamics(value: int) -> str:
    """The task's Atari dynamics; ValueError naming a value this worker does not know (a newer
    master's protocol: playing another one would score the genome under other rules)."""
    dynamics = ATARI_DYNAMICS_FROM_WIRE.get(value)
    if dynamics is None:
        raise ValueError(f"atari dynamics {value} is not one this worker plays "
                         f"({', '.join(map(str, sorted(ATARI_DYNAMICS_FROM_WIRE)))})")  # fmt: skip
    return dynamics


def spec_from_task(task: pb.Task) -> EvaluationSpec:
    """Wire task -> plain evaluation spec; ValueError naming a value beyond this worker's limits."""
    genome = task.genome
    spec = EvaluationSpec(
        env_id=task.env.env_id,
        seeds=tuple(genome.seeds),
        mutation_power=genome.mutation_power,
        noise_table=NoiseTableSpec(genome.noise_table.seed, genome.noise_table.size),
        architecture=task.policy.architecture,
        hidden_sizes=tuple(task.policy.hidden_sizes),
        # Empty: a master from before the field, whose workers all ran float32.
        inference_dtype=task.policy.inference_dtype or "float32",
        atari_dynamics=atari_dynamics(task.env.atari_dynamics),
        episodes=task.episodes,
        max_episode_steps=task.max_episode_steps,
        env_seed=task.env_seed,
        perturbation=(
            (es.version, es.noise_index, es.sign, es.sigma)
            if task.HasField("perturbation") and (es := task.perturbation)
            else None
        ),
        behaviour_size=task.behaviour_size,
        observation_size=task.perturbation.observation_size,
        policy=user_policy_of(task.policy),
        perturbation_run=task.run_id if task.HasField("perturbation") else "",
    )
    return check_spec(spec)


def user_policy_of(policy: pb.PolicySpec) -> UserPolicy | None:
    """A task's user network (architecture "module"): its factory and options, checked;
    ValueError naming what is wrong. None for the built-in networks."""
    if policy.architecture != MODULE_ARCHITECTURE:
        if policy.factory or policy.options:
            raise ValueError(f"a {policy.architecture!r} policy takes no factory or options")
        return None
    return UserPolicy(policy.factory, policy.options or "{}")


def task_result(task: LeasedTask, evaluation: Evaluation) -> pb.TaskResult:
    """A finished task as the master reads it: its returns and frames (and behaviours,
    observation sums), or the error it failed with."""
    result = pb.TaskResult(task_id=task.task_id, run_id=task.run_id,
                           busy_seconds=evaluation.busy_s)  # fmt: skip
    if evaluation.error:
        result.error = _bounded(evaluation.error)
        return result
    result.episode_returns.extend(evaluation.returns)
    result.episode_frames.extend(evaluation.frames)
    result.frames = sum(evaluation.frames)
    if evaluation.behaviours is not None:
        result.behaviours.extend(np.concatenate(evaluation.behaviours).tolist())
    if evaluation.observations is not None:
        sums = result.observation_sums
        sums.count = evaluation.observations.count
        sums.sum.extend(evaluation.observations.total.tolist())
        sums.sum_of_squares.extend(evaluation.observations.squares.tolist())
    return result


def failed_result(task: LeasedTask, error: str) -> pb.TaskResult:
    """A task that could not start, reported as failed with `error`."""
    return pb.TaskResult(task_id=task.task_id, run_id=task.run_id, error=_bounded(error))


def _bounded(error: str) -> str:
    # An outsized error would make the report bigger than the master accepts, and the same
    # batch would be resent forever.
    return error[:MAX_ERROR_CHARS]
