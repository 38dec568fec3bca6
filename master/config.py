"""A run's settings, with defaults chosen by the kind of env (Atari: the paper's)."""

from __future__ import annotations

import dataclasses
import uuid
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
from neuro.inference import ARCHITECTURES, INFERENCE_DTYPES, check_combination
from neuro.noise import PAPER_NOISE_TABLE_SIZE, SMALL_NOISE_TABLE_SIZE
from neuro.runfiles import GENOME_FORMAT

__all__ = [
    "ALGORITHMS",
    "ARCHITECTURES",
    "ATARI_DYNAMICS",
    "INFERENCE_DTYPES",
    "EnvKind",
    "RunConfig",
    "inspect_env_id",
    "preset",
]

ATARI_TRAINING_EPISODE_STEPS = 5000


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
    """Forward-pass precision after the exact float32 decode: float32 (default), bfloat16, or
    int8 (dense layers' weights int8, convolutions bfloat16: the cheapest per step on x86; both
    may change actions; genome files record it and replay uses it)."""
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
        if self.max_episode_steps < 0:
            raise ValueError(f"max_episode_steps must be >= 0, got {self.max_episode_steps}")
        if self.episodes_per_task < 1:
            raise ValueError(f"episodes_per_task must be >= 1, got {self.episodes_per_task}")

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


def preset(kind: EnvKind, **overrides: Any) -> RunConfig:
    """Defaults for this kind of env, with the user's explicit settings on top.

    Atari gets the paper's settings. Vector-observation envs get a small, fast GA whose elite
    is still judged over 30 episodes, so "solved" means what the env's threshold means (one
    episode for neuro's toy tasks, whose return does not vary).
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
