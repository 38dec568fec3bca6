"""What a worker accepts from a master: every size a task names, checked before allocating.

The master may be buggy, or a different version. A task that cannot fit here fails cleanly:
the worker reports it with an error naming the value and takes the next one.
"""

from __future__ import annotations

import math

from neuro.envs.behaviour import MAX_BEHAVIOUR_SIZE
from neuro.envs.ids import import_env_module
from neuro.inference import (
    ARCHITECTURES,
    INFERENCE_DTYPES,
    MODULE_ARCHITECTURE,
    check_combination,
)
from neuro.layout import (
    ATARI_SHAPE,
    MAX_PARAMS,
    check_parameter_count,
    parameter_count,
    parameter_layout,
)
from neuro.observation_stats import MAX_OBSERVATION_SIZE
from neuro.policy_spec import ModuleUnavailable, load_factory
from neuro.task_limits import MAX_EPISODE_STEPS, MAX_EPISODES_PER_TASK
from worker.evaluation.spec import EvaluationSpec

__all__ = [
    "MAX_ENV_ID_LENGTH",
    "MAX_EPISODES",
    "MAX_EPISODE_STEPS",
    "MAX_HIDDEN_LAYERS",
    "MAX_HIDDEN_WIDTH",
    "MAX_PARAMS",
    "MAX_SEEDS",
    "PERTURBATION_SIGNS",
    "check_spec",
    "minimum_parameter_count",
    "unavailable_module",
]

MAX_SEEDS = 100_000
"""Seeds per genome. A genome grows one seed per generation; the paper's runs take a few
thousand generations at most."""
MAX_EPISODES = MAX_EPISODES_PER_TASK
"""Episodes per task: the master's own bound on --episodes-per-task (neuro.task_limits)."""
MAX_ENV_ID_LENGTH = 256
"""As long as the master's own id limit."""
MAX_HIDDEN_LAYERS = 64
MAX_HIDDEN_WIDTH = 2**16
PERTURBATION_SIGNS = (-1, 0, 1)
"""What an ES task's sign may be: the master asks for theta + sigma * eps, theta - sigma * eps
and theta itself (master/fleet/tasks.py); any other sign is a step no ES update takes."""


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def _check_perturbation(version: int, noise_index: int, sign: int, sigma: float) -> None:
    """An ES step the master can have asked for: a sign of -1, 0 or 1 and a finite sigma > 0
    (the master's ES refuses any other sigma); anything else would score parameters no update
    uses, or NaN ones."""
    if sign not in PERTURBATION_SIGNS:
        raise ValueError(f"ES perturbation sign must be -1, 0 or 1, got {sign}")
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"ES perturbation sigma must be finite and > 0, got {sigma:g}")


def minimum_parameter_count(architecture: str, hidden_sizes: tuple[int, ...]) -> int:
    """The fewest parameters the network can have, whatever the env (one input, one output)."""
    shape = ATARI_SHAPE if architecture != "mlp" else (1,)
    return parameter_count(parameter_layout(architecture, shape, 1, hidden_sizes))


def check_spec(spec: EvaluationSpec) -> EvaluationSpec:
    """`spec` itself if it fits this worker's limits; ValueError naming the value otherwise.

    The network's exact size depends on the env's spaces, so build_policy checks it again
    once the env is built; this catches what no env can make small.
    """
    _check_range("env id length", len(spec.env_id), 1, MAX_ENV_ID_LENGTH)
    _check_range("episodes", spec.episodes, 1, MAX_EPISODES)
    _check_range("max_episode_steps", spec.max_episode_steps, 0, MAX_EPISODE_STEPS)
    _check_range("seeds per genome", len(spec.seeds), 0, MAX_SEEDS)
    _check_range("number of hidden layers", len(spec.hidden_sizes), 0, MAX_HIDDEN_LAYERS)
    for width in spec.hidden_sizes:
        _check_range("hidden layer width", width, 1, MAX_HIDDEN_WIDTH)
    _check_range("behaviour size", spec.behaviour_size, 0, MAX_BEHAVIOUR_SIZE)
    _check_range("observation size", spec.observation_size, 0, MAX_OBSERVATION_SIZE)
    if spec.perturbation is not None:
        _check_perturbation(*spec.perturbation)
    if spec.inference_dtype not in INFERENCE_DTYPES:
        raise ValueError(
            f"inference dtype {spec.inference_dtype!r} is not one of {', '.join(INFERENCE_DTYPES)}"
        )
    if (spec.architecture == MODULE_ARCHITECTURE) != (spec.policy is not None):
        raise ValueError(
            f"architecture {spec.architecture!r} with factory "
            f"{spec.policy.factory if spec.policy else None!r}: a user's network is the "
            f"{MODULE_ARCHITECTURE!r} architecture, and only it has a factory"
        )
    if spec.policy is not None:
        if spec.hidden_sizes:
            raise ValueError(f"policy {spec.policy.factory} takes options, not hidden sizes")
        # Its size is known once built (build_policy checks it against MAX_PARAMS and the
        # decoder against the noise table).
        check_combination(spec.inference_dtype, spec.architecture)
    if spec.architecture in ARCHITECTURES:  # an unknown one is named by build_policy
        # The shared table: a dtype that no engine runs on this network is refused by name.
        check_combination(spec.inference_dtype, spec.architecture)
        floor = minimum_parameter_count(spec.architecture, spec.hidden_sizes)
        check_parameter_count(floor, spec.noise_table.size)
    return spec


def unavailable_module(spec: EvaluationSpec) -> ModuleUnavailable | None:
    """Why no task like `spec` can run here, if a module it needs (its env's, `module:Env-id`,
    or its network's factory) cannot be imported here; None if both can. Imports them: the
    user's code runs here as it will when the task plays."""
    try:
        import_env_module(spec.env_id)
        if spec.policy is not None:
            load_factory(spec.policy)
    except ModuleUnavailable as error:
        return error
    except ValueError:
        return None  # not a module problem: the task fails with it when it starts
    return None
