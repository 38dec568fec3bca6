"""A run's settings, with defaults chosen by the kind of env (Atari: the paper's)."""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from master.algorithms.base import Parameters
from master.algorithms.es import ESConfig
from master.algorithms.ga import GAConfig
from master.algorithms.novelty import NoveltyConfig
from master.algorithms.registry import ALGORITHMS, get
from neuro.envs.make import ATARI_DYNAMICS, EnvKind, inspect_env_id
from neuro.genome import Genome
from neuro.inference import (
    ARCHITECTURES,
    BATCHED,
    FLOAT32,
    INFERENCE_DTYPES,
    PER_GENOME,
    check_combination,
    default_dtype,
)
from neuro.layout import ATARI_SHAPE, check_parameter_count, parameter_count, parameter_layout
from neuro.noise import MAX_NOISE_TABLE_SIZE, PAPER_NOISE_TABLE_SIZE, SMALL_NOISE_TABLE_SIZE
from neuro.runfiles import GENOME_FORMAT
from neuro.task_limits import MAX_EPISODE_STEPS, MAX_EPISODES_PER_TASK

__all__ = [
    "ALGORITHMS",
    "ARCHITECTURES",
    "ATARI_DYNAMICS",
    "INFERENCE_DTYPES",
    "MAX_EVALUATIONS_PER_GENERATION",
    "EnvKind",
    "RunConfig",
    "check_setting",
    "inspect_env_id",
    "preset",
]

ATARI_TRAINING_EPISODE_STEPS = 5000
MAX_EVALUATIONS_PER_GENERATION = 250_000
"""Episodes one generation may ask for (ES: 2 x pairs + eval_episodes; GA: population +
elite_candidates x elite_episodes). The master keeps about 1 KB of bookkeeping per evaluation of
the running generation (its request, task and lease), and all of it at once: 250,000 is about
0.25 GB, and a setting of 100,000,000 pairs would exhaust the machine before the first task."""
_UINT32_MAX = 2**32 - 1
"""The wire's uint32 fields (the noise table's seed, a task's max_episode_steps and episodes)."""


def _positive_finite(value: float) -> str | None:
    ok = isinstance(value, int | float) and math.isfinite(value) and value > 0
    return None if ok else "must be a positive, finite number of seconds"


def _finite_or_none(value: float | None) -> str | None:
    if value is None or (isinstance(value, int | float) and math.isfinite(value)):
        return None
    return "must be a finite number (--no-target sets no target)"


def _int_in(low: int, high: int | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, int) and value >= low and (high is None or value <= high):
            return None
        return f"must be an integer >= {low}" if high is None else f"must be in [{low}, {high}]"

    return check


_SETTING_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "lease_seconds": _positive_finite,
    "max_task_attempts": _int_in(1),
    "target_score": _finite_or_none,
    # A uint32 on the wire; the noise table's own bounds (neuro.noise.NoiseTableSpec).
    "noise_table_seed": _int_in(0, _UINT32_MAX),
    "noise_table_size": _int_in(1, MAX_NOISE_TABLE_SIZE),
    # What a worker accepts (neuro.task_limits): a run no worker would play never starts.
    "max_episode_steps": _int_in(0, MAX_EPISODE_STEPS),
    "episodes_per_task": _int_in(1, MAX_EPISODES_PER_TASK),
}
"""Bounds of RunConfig's own scalar settings: checked by RunConfig (so a checkpoint's config is
held to them too) and by the command line's flags, each alone, at parse time."""


def check_setting(name: str, value: Any) -> None:
    """ValueError("NAME must ..., got VALUE") if `value` is out of the setting's bounds."""
    check = _SETTING_CHECKS.get(name)
    problem = check(value) if check is not None else None
    if problem is not None:
        raise ValueError(f"{name} {problem}, got {value!r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; recorded in the run dir's config.json."""

    env_id: str
    atari: bool
    ga: GAConfig
    architecture: str
    """Policy network: deepga (paper, 4M params), nature (1.7M), mlp (vector observations)."""
    hidden_sizes: tuple[int, ...] = ()
    """mlp hidden layer sizes, e.g. 64,64."""
    atari_dynamics: str = "paper"
    """Atari only: "paper" (default: the paper's protocol) or "registered" (the env's own)."""
    inference_dtype: str = "float32"
    """Forward-pass precision after the exact float32 decode: float32, bfloat16, int8 or
    int8-static (neuro/inference.py). preset() gives a new GA run on an Atari net int8-static
    unless its workers are the batched (GPU) runner, else float32; config.json records it, a
    resumed run keeps it, genome files record it and replay uses it. A config.json without
    it is float32's, the only dtype there was."""
    noise_table_seed: int = 123
    """Seeds the noise table every worker builds."""
    noise_table_size: int = PAPER_NOISE_TABLE_SIZE
    """Entries in the noise table every worker builds."""
    max_episode_steps: int = 0
    """Agent steps per training episode (Atari preset: 5000); 0: the env's own limit."""
    generations: int | None = None
    """Stop after this many generations."""
    frames: int | None = None
    """Stop after this many emulator frames (4 per Atari step)."""
    target_score: float | None = None
    """Stop once the elite's re-evaluated mean reaches this (preset: the env's reward threshold)."""
    lease_seconds: float = 60.0
    """A lease lapses after this many seconds (default 60)."""
    max_task_attempts: int = 5
    """Failures before an evaluation is recorded as failed (default 5)."""
    episodes_per_task: int = 1
    """Episodes one task plays, so long re-evaluations spread over workers."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    es: ESConfig | None = None
    """Set for the ES family (es, ns-es, nsr-es): its ES hyperparameters."""
    novelty: NoveltyConfig | None = None
    """Set for novelty search (ga-ns, ns-es, nsr-es): its novelty hyperparameters."""
    algorithm: str = ""
    """The registry name of the algorithm that runs; empty (a config.json written before it
    was recorded): es when `es` is set, else ga."""

    @property
    def seed(self) -> int:
        """The run seed (env seeds of tasks derive from it): the ES's for the ES family."""
        return self.es.seed if self.es is not None else self.ga.seed

    def __post_init__(self) -> None:
        if not self.algorithm:
            object.__setattr__(self, "algorithm", "es" if self.es is not None else "ga")
        sections = get(self.algorithm).sections
        for section in ("es", "novelty"):
            if (getattr(self, section) is not None) != (section in sections):
                state = "needs" if section in sections else "takes no"
                raise ValueError(f"algorithm {self.algorithm!r} {state} {section} settings")
        if self.es is not None and self.es.observation_norm and self.algorithm != "es":
            # NS-ES's members would need a normaliser each; only plain ES keeps one.
            raise ValueError(f"observation_norm is an --algo es setting, not {self.algorithm}'s")
        if self.es is not None and self.es.observation_norm and self.atari:
            # Checked here, not when the algorithm is built: the command line then says so.
            raise ValueError(
                f"observation_norm is for vector observations, not Atari frames ({self.env_id})"
            )
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r} is not one of {ARCHITECTURES}")
        if self.atari_dynamics not in ATARI_DYNAMICS:
            raise ValueError(
                f"atari_dynamics {self.atari_dynamics!r} is not one of {ATARI_DYNAMICS}"
            )
        if self.atari != (self.architecture != "mlp"):
            kind = "an Atari" if self.atari else "a vector-observation"
            raise ValueError(
                f"architecture {self.architecture!r} does not fit {kind} env ({self.env_id})"
            )
        # The one table of what runs where (neuro/inference.py), which workers serve too.
        check_combination(self.inference_dtype, self.architecture)
        for name in ("generations", "frames"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in _SETTING_CHECKS:
            check_setting(name, getattr(self, name))
        self._check_network_fits_table()
        self._check_generation_size()

    def _check_network_fits_table(self) -> None:
        """The smallest network this architecture can be (one input, one output) must fit the
        noise table and a worker's limit, which workers would refuse otherwise, task after task."""
        shape = ATARI_SHAPE if self.architecture != "mlp" else (1,)
        floor = parameter_count(parameter_layout(self.architecture, shape, 1, self.hidden_sizes))
        check_parameter_count(floor)
        if floor > self.noise_table_size:
            raise ValueError(
                f"noise_table_size {self.noise_table_size} is smaller than the network: "
                f"{self.architecture} {list(self.hidden_sizes)} has at least {floor} parameters"
            )

    def _check_generation_size(self) -> None:
        """Refused before the master allocates a generation's bookkeeping it cannot hold."""
        es, ga = self.es, self.ga
        if es is not None and "es" in get(self.algorithm).sections:
            total = es.evaluations_per_generation
            formula = f"2 x pairs ({es.pairs}) + eval_episodes ({es.eval_episodes})"
        else:
            total = ga.evaluations_per_generation
            formula = (
                f"population_size ({ga.population_size}) + elite_candidates "
                f"({ga.elite_candidates}) x elite_episodes ({ga.elite_episodes})"
            )
        if total > MAX_EVALUATIONS_PER_GENERATION:
            raise ValueError(
                f"a generation of {formula} = {total} evaluations is more than the master "
                f"holds at once ({MAX_EVALUATIONS_PER_GENERATION}, about 1 KB each)"
            )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["hidden_sizes"] = list(self.hidden_sizes)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Inverse of to_dict (a checkpoint's copy of the settings)."""
        fields = dict(data)
        fields["ga"] = GAConfig(**fields["ga"])
        if fields.get("es") is not None:
            fields["es"] = ESConfig(**fields["es"])
        if fields.get("novelty") is not None:
            fields["novelty"] = NoveltyConfig(**fields["novelty"])
        fields["hidden_sizes"] = tuple(fields["hidden_sizes"])
        return cls(**fields)

    def genome_document(self, genome: Genome) -> dict[str, Any]:
        """A genome with everything needed to rebuild and replay it, as saved in JSON."""
        return {
            "format": GENOME_FORMAT,
            "env_id": self.env_id,
            "atari_dynamics": self.atari_dynamics if self.atari else None,
            "architecture": self.architecture,
            "hidden_sizes": list(self.hidden_sizes),
            "noise_table": {"seed": self.noise_table_seed, "size": self.noise_table_size},
            "mutation_power": self.ga.mutation_power,
            "max_episode_steps": self.max_episode_steps,
            "inference_dtype": self.inference_dtype,
            "seeds": list(genome.seeds),
        }

    def parameters_document(self, parameters: Parameters) -> dict[str, Any]:
        """ES-family parameters for replay: the run dir writes "parameters" as an .npy beside it."""
        assert self.es is not None
        document = self.genome_document(Genome((0,)))
        vector = parameters.theta
        if parameters.observation_norm is not None:
            # Replay normalises observations as training did: the .npy ends with mean and std.
            mean, std = parameters.observation_norm
            vector = np.concatenate([vector, mean, std]).astype(np.float32)
            document["observation_size"] = int(mean.size)
        document.update(seeds=[], mutation_power=self.es.sigma, version=parameters.version,
                        parameters=vector)  # fmt: skip
        return document


def preset(kind: EnvKind, batched: bool = False, **overrides: Any) -> RunConfig:
    """Defaults for this kind of env, with the user's explicit settings on top.

    Atari gets the paper's settings, and the GA int8-static unless `batched` (the run's
    workers are the batched/GPU runner, which runs float32 only; neuro.inference.
    default_dtype). Vector-observation envs get a small, fast GA whose elite is still judged
    over 30 episodes, so "solved" means what the env's threshold means (one episode for
    neuro's toy tasks, whose return does not vary).
    """
    algorithm = overrides.pop("algorithm", "ga")
    sections = get(algorithm).sections
    novelty_fields = {f.name for f in dataclasses.fields(NoveltyConfig)}
    novelty_overrides = {k: overrides.pop(k) for k in list(overrides) if k in novelty_fields}
    es_fields = {f.name for f in dataclasses.fields(ESConfig)}
    es_overrides = {k: overrides.pop(k) for k in list(overrides) if k in es_fields - {"seed"}}
    if "seed" in overrides:
        es_overrides["seed"] = overrides["seed"]
    ga_fields = {f.name for f in dataclasses.fields(GAConfig)}
    ga_overrides = {k: overrides.pop(k) for k in list(overrides) if k in ga_fields}
    if kind.atari:
        ga = _ga_config({}, ga_overrides)
        base: dict[str, Any] = {
            "architecture": "deepga",
            "noise_table_size": PAPER_NOISE_TABLE_SIZE,
            "max_episode_steps": ATARI_TRAINING_EPISODE_STEPS,
        }
    else:
        ga_defaults = {
            "population_size": 100,
            "truncation": 10,
            "mutation_power": 0.05,
            "elite_candidates": 3,
            "elite_episodes": 1 if kind.deterministic else 30,
        }
        ga = _ga_config(ga_defaults, ga_overrides)
        base = {
            "architecture": "mlp",
            "hidden_sizes": (64, 64),
            "noise_table_size": SMALL_NOISE_TABLE_SIZE,
            "target_score": kind.reward_threshold,
        }
    if "es" in sections:
        es_defaults: dict[str, Any] = (
            {"pairs": 500, "sigma": 0.02, "learning_rate": 0.01, "eval_episodes": 1}
            if kind.atari
            else {"eval_episodes": 1 if kind.deterministic else 30}
        )
        base["es"] = ESConfig(**{**es_defaults, **es_overrides})
    elif es_overrides.keys() - {"seed"}:
        raise ValueError(f"{sorted(es_overrides.keys() - {'seed'})} are ES settings "
                         f"(--algo {_using('es')})")  # fmt: skip
    if "novelty" in sections:
        base["novelty"] = NoveltyConfig(**novelty_overrides)
    elif novelty_overrides:
        raise ValueError(f"{sorted(novelty_overrides)} are novelty search settings "
                         f"(--algo {_using('novelty')})")  # fmt: skip
    # An explicit None is a setting too (target_score=None: no target).
    settings = {**base, **overrides}
    if "inference_dtype" not in settings:
        # The study behind the default trained the GA; an ES's gradient estimate from
        # quantised policies was never measured, so the ES family stays on float32.
        runner = BATCHED if batched else PER_GENOME
        settings["inference_dtype"] = (
            FLOAT32 if "es" in sections else default_dtype(settings["architecture"], runner)
        )
    return RunConfig(env_id=kind.env_id, atari=kind.atari, ga=ga, algorithm=algorithm, **settings)


def _using(section: str) -> str:
    """The algorithms whose settings include `section`, as the --algo values to name."""
    return ", ".join(name for name in ALGORITHMS if section in get(name).sections)


def _ga_config(defaults: dict[str, Any], overrides: dict[str, Any]) -> GAConfig:
    """Defaults the user did not override shrink to fit a small population."""
    settings = {**defaults, **overrides}
    population = settings.get("population_size", GAConfig.population_size)
    for name in ("truncation", "elite_candidates"):
        if name not in overrides:
            settings[name] = min(settings.get(name, getattr(GAConfig, name)), population)
    return GAConfig(**settings)
