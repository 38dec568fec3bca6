"""A run's settings, with defaults chosen by the kind of env (Atari: the paper's)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from master.algorithms.base import Parameters
from master.algorithms.ga import GAConfig  # re-exported: bench/throughput.py reads it from here
from master.algorithms.registry import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    SECTIONS,
    algorithms_using,
    get,
    run_sections,
)
from neuro.envs.ids import env_spec
from neuro.envs.make import ATARI_DYNAMICS, EnvKind, inspect_env_id
from neuro.genome import Genome
from neuro.inference import (
    ALL_ARCHITECTURES,
    ARCHITECTURES,
    BATCHED,
    FLOAT32,
    INFERENCE_DTYPES,
    MODULE_ARCHITECTURE,
    PER_GENOME,
    check_combination,
    default_dtype,
)
from neuro.layout import ATARI_SHAPE, check_parameter_count, parameter_count, parameter_layout
from neuro.noise import MAX_NOISE_TABLE_SIZE, PAPER_NOISE_TABLE_SIZE, SMALL_NOISE_TABLE_SIZE
from neuro.policy_spec import ModuleUnavailable, UserPolicy, is_factory, user_policy
from neuro.runfiles import GENOME_FORMAT
from neuro.task_limits import MAX_EPISODE_STEPS, MAX_EPISODES_PER_TASK

__all__ = [
    "ALGORITHMS",
    "ARCHITECTURES",
    "ATARI_DYNAMICS",
    "INFERENCE_DTYPES",
    "MAX_EVALUATIONS_PER_GENERATION",
    "NOT_SETTINGS",
    "SECTIONS",
    "EnvKind",
    "GAConfig",
    "RunConfig",
    "check_setting",
    "checked_settings",
    "config_from_settings",
    "env_step_limit",
    "inspect_env_id",
    "preset",
]

ATARI_TRAINING_EPISODE_STEPS = 5000
MAX_EVALUATIONS_PER_GENERATION = 250_000
"""Episodes one generation may ask for (each settings section says what it adds: ES 2 x pairs
+ eval_episodes, GA population + elite_candidates x elite_episodes). The master keeps about
1 KB of bookkeeping per evaluation of the running generation (its request, task and lease),
and all of it at once: 250,000 is about 0.25 GB, and a setting of 100,000,000 pairs would
exhaust the machine before the first task."""
_UINT32_MAX = 2**32 - 1
"""The wire's uint32 fields (the noise table's seed, a task's max_episode_steps and episodes)."""


def _network(value: Any) -> str | None:
    if isinstance(value, str) and value in ALL_ARCHITECTURES:
        return None
    if isinstance(value, str) and is_factory(value):
        try:
            user_policy(value)
        except ValueError as error:
            return f"names no factory ({error})"
        return None
    return f"must be one of {', '.join(ARCHITECTURES)} or a user's network, package.module:callable"


def _json_object(value: Any) -> str | None:
    try:
        UserPolicy("a:b", value or "{}")
    except (TypeError, ValueError) as error:
        return f"must be a JSON object of keyword arguments ({error})"
    return None


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
    "architecture": _network,
    "policy_options": _json_object,
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
    architecture: str
    """Policy network: deepga (paper, 4M params), nature (1.7M), mlp (vector observations), or
    a user's torch network, package.module:callable: called with the env's observation and
    action spaces and --policy-options, it returns an nn.Module (docs/your-own-problem.md)."""
    hidden_sizes: tuple[int, ...] = ()
    """mlp hidden layer sizes, e.g. 64,64."""
    policy_options: str = ""
    """A user's network: the keyword arguments its factory is called with, a JSON object such
    as '{"hidden": 32}' (config.json records it as an object)."""
    policy_factory: str = ""
    """A user's network (architecture "module"): package.module:callable, as --policy gave
    it; empty for the built-in networks."""
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
    algorithm: str = ""
    """The registry name of the algorithm that runs; empty (a config.json written before it
    was recorded): es when an "es" section is given, else ga."""
    sections: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """The algorithm's settings, by section name (master.algorithms.settings): those of the
    registry's run_sections(algorithm), no others. Read-only; config.ga and the like read one."""
    episode_step_limit: int = field(init=False, repr=False, compare=False)
    """Most agent steps an episode of the run lasts: max_episode_steps or the env's registered
    time limit, the smaller where both are set; 0 where neither is. Derived when the config is
    made, never recorded."""

    def __getattr__(self, name: str) -> Any:
        """A section's settings by its name (config.ga, config.es): None where the run has none."""
        # Only called for names that are no attribute; __dict__, as unpickling may ask first.
        sections = self.__dict__.get("sections")
        if sections is not None and any(section.name == name for section in SECTIONS):
            return sections.get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def seed(self) -> int:
        """The run seed (env seeds of tasks derive from it): that of the algorithm's first
        section with one (the ES's for the ES family, whose --seed is the GA's too), else that
        of the sections every run records."""
        every_run = [section for section in SECTIONS if section.every_run]
        for section in (*get(self.algorithm).sections, *every_run):
            if "seed" in section.field_names:
                return self.sections[section.name].seed
        raise AssertionError(f"no settings section of {self.algorithm} has a seed")

    def __post_init__(self) -> None:
        if not self.algorithm:
            object.__setattr__(self, "algorithm", "es" if "es" in self.sections else "ga")
        self._check_sections()
        self._check_user_network()
        if self.architecture not in ALL_ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r} is not one of {ARCHITECTURES}")
        if self.atari_dynamics not in ATARI_DYNAMICS:
            raise ValueError(
                f"atari_dynamics {self.atari_dynamics!r} is not one of {ATARI_DYNAMICS}"
            )
        user_network = self.architecture == MODULE_ARCHITECTURE
        if not user_network and self.atari != (self.architecture != "mlp"):
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
        if not user_network:  # a user's network is measured when the master builds it
            self._check_network_fits_table()
        self._check_generation_size()
        limit = episode_step_limit(self.env_id, self.max_episode_steps)
        object.__setattr__(self, "episode_step_limit", limit)

    @property
    def policy(self) -> UserPolicy | None:
        """The user's network (its factory and options); None for the built-in networks."""
        if self.architecture != MODULE_ARCHITECTURE:
            return None
        return UserPolicy(self.policy_factory, self.policy_options or "{}")

    def _check_user_network(self) -> None:
        """--policy package.module:callable is the "module" architecture with that factory;
        the options, canonical JSON. ValueError naming what does not fit."""
        if is_factory(self.architecture):
            if self.policy_factory not in ("", self.architecture):
                raise ValueError(
                    f"architecture {self.architecture!r} and policy_factory "
                    f"{self.policy_factory!r} name two networks"
                )
            object.__setattr__(self, "policy_factory", self.architecture)
            object.__setattr__(self, "architecture", MODULE_ARCHITECTURE)
        if self.architecture != MODULE_ARCHITECTURE:
            if self.policy_factory or self.policy_options:
                raise ValueError(
                    f"--policy-options are a user's network's (--policy package.module:callable),"
                    f" not {self.architecture}'s"
                )
            return
        if not self.policy_factory:
            raise ValueError(
                f"architecture {MODULE_ARCHITECTURE!r} is a user's network: give --policy "
                "package.module:callable"
            )
        if self.hidden_sizes:
            raise ValueError(
                f"--hidden is the mlp's; a user's network takes --policy-options, got "
                f"{list(self.hidden_sizes)}"
            )
        policy = UserPolicy(self.policy_factory, self.policy_options or "{}")
        canonical = "" if policy.options_json == "{}" else policy.options_json
        object.__setattr__(self, "policy_options", canonical)

    def _check_sections(self) -> None:
        """Exactly the algorithm's sections, each of its dataclass and fitting the run."""
        recorded = run_sections(self.algorithm)
        names = {section.name for section in recorded}
        for section in SECTIONS:
            if (section.name in self.sections) != (section.name in names):
                state = "needs" if section.name in names else "takes no"
                raise ValueError(f"algorithm {self.algorithm!r} {state} {section.name} settings")
        unknown = sorted(set(self.sections) - {section.name for section in SECTIONS})
        if unknown:
            raise ValueError(f"no algorithm has settings sections {unknown}")
        # In SECTIONS order, whatever the caller's, so equal configs are equal mappings.
        ordered = {section.name: self.sections[section.name] for section in recorded}
        object.__setattr__(self, "sections", ordered)
        for section in recorded:
            settings = section.of(self)
            if section.fits_run is not None:
                # Checked here, not when the algorithm is built: the command line then says so.
                section.fits_run(settings, self)

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

    @property
    def evaluations_per_generation(self) -> int:
        """Episodes one generation asks for, each settings section's share added."""
        return sum(size for size, _ in self._generation_sizes())

    def _generation_sizes(self) -> list[tuple[int, str]]:
        return [
            section.generation_size(self.sections[section.name])
            for section in get(self.algorithm).sections
            if section.generation_size is not None
        ]

    def _check_generation_size(self) -> None:
        """Refused before the master allocates a generation's bookkeeping it cannot hold."""
        sizes = self._generation_sizes()
        total = sum(size for size, _ in sizes)
        formula = " + ".join(formula for _, formula in sizes)
        if total > MAX_EVALUATIONS_PER_GENERATION:
            raise ValueError(
                f"a generation of {formula} = {total} evaluations is more than the master "
                f"holds at once ({MAX_EVALUATIONS_PER_GENERATION}, about 1 KB each)"
            )

    def to_dict(self) -> dict[str, Any]:
        """config.json's document: every key and value, in the order masters have written them
        (the sections every run records after env_id and atari, the others before algorithm)."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.init and f.name not in ("sections", "algorithm")}  # fmt: skip
        own["hidden_sizes"] = list(self.hidden_sizes)
        # A built-in network's config.json is as it always was; a user's records its factory
        # and its options as an object.
        if own.pop("policy_factory"):
            own["policy_factory"] = self.policy_factory
        if own.pop("policy_options"):
            own["policy_options"] = self.policy.options if self.policy else {}
        head = {name: own.pop(name) for name in ("env_id", "atari")}
        recorded = {s.name: self._section_dict(s.name) for s in SECTIONS if s.every_run}
        others = {s.name: self._section_dict(s.name) for s in SECTIONS if not s.every_run}
        return {**head, **recorded, **own, **others, "algorithm": self.algorithm}

    def _section_dict(self, name: str) -> dict[str, Any] | None:
        settings = self.sections.get(name)
        return None if settings is None else dataclasses.asdict(settings)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Inverse of to_dict (a checkpoint's copy of the settings)."""
        fields = dict(data)
        given = {s: fields.pop(s.name, None) for s in SECTIONS}
        sections = {s.name: s.settings(**value) for s, value in given.items() if value is not None}
        fields["hidden_sizes"] = tuple(fields["hidden_sizes"])
        options = fields.get("policy_options")
        if isinstance(options, Mapping):
            fields["policy_options"] = UserPolicy("a:b", json.dumps(options)).options_json
        return cls(**fields, sections=sections)

    def genome_document(self, genome: Genome) -> dict[str, Any]:
        """A genome with everything needed to rebuild and replay it, as saved in JSON."""
        return {
            "format": GENOME_FORMAT,
            "env_id": self.env_id,
            "atari_dynamics": self.atari_dynamics if self.atari else None,
            "architecture": self.architecture,
            "hidden_sizes": list(self.hidden_sizes),
            "noise_table": {"seed": self.noise_table_seed, "size": self.noise_table_size},
            "mutation_power": get(self.algorithm).mutation_power(self),
            "max_episode_steps": self.max_episode_steps,
            "inference_dtype": self.inference_dtype,
            **self._policy_document(),
            "seeds": list(genome.seeds),
        }

    def _policy_document(self) -> dict[str, Any]:
        """A user's network as a genome file records it, for replay to rebuild it."""
        policy = self.policy
        if policy is None:
            return {}
        return {"policy": {"factory": policy.factory, "options": policy.options}}

    def parameters_document(self, parameters: Parameters) -> dict[str, Any]:
        """ES-family parameters for replay: the run dir writes "parameters" as an .npy beside it."""
        document = self.genome_document(Genome((0,)))
        vector = parameters.theta
        if parameters.observation_norm is not None:
            # Replay normalises observations as training did: the .npy ends with mean and std.
            mean, std = parameters.observation_norm
            vector = np.concatenate([vector, mean, std]).astype(np.float32)
            document["observation_size"] = int(mean.size)
        document.update(seeds=[], version=parameters.version, parameters=vector)
        return document


def preset(kind: EnvKind, batched: bool = False, **overrides: Any) -> RunConfig:
    """Defaults for this kind of env, with the user's explicit settings on top.

    Atari gets the paper's network, noise table and episode cap, and each settings section its
    Atari preset (the paper's GA); a GA run gets int8-static unless `batched` (the run's workers
    are the batched/GPU runner, which runs float32 only; neuro.inference.default_dtype).
    Vector-observation envs get an mlp and each section's small preset. `overrides` name
    RunConfig's fields and those of the algorithm's sections; "seed" seeds every section that
    has one.
    """
    algorithm = overrides.pop("algorithm", DEFAULT_ALGORITHM)
    recorded = run_sections(algorithm)
    section_fields = {name for section in SECTIONS for name in section.field_names}
    given = {k: overrides.pop(k) for k in list(overrides) if k in section_fields}
    sections: dict[str, Any] = {}
    for section in SECTIONS:
        mine = {k: v for k, v in given.items() if k in section.field_names}
        if section in recorded:
            sections[section.name] = section.preset(kind, mine)
            continue
        stray = sorted(k for k in mine if not any(k in s.field_names for s in recorded))
        if stray:
            using = ", ".join(algorithms_using(section))
            raise ValueError(f"{stray} are {section.noun} settings (--algo {using})")
    if kind.atari:
        base: dict[str, Any] = {
            "architecture": "deepga",
            "noise_table_size": PAPER_NOISE_TABLE_SIZE,
            "max_episode_steps": ATARI_TRAINING_EPISODE_STEPS,
        }
    else:
        base = {
            "architecture": "mlp",
            "hidden_sizes": (64, 64),
            "noise_table_size": SMALL_NOISE_TABLE_SIZE,
            "target_score": kind.reward_threshold,
        }
    # An explicit None is a setting too (target_score=None: no target).
    settings = {**base, **overrides}
    if is_factory(str(settings["architecture"])):
        # A user's network: no built-in net's sizes, and no dtype but float32 (the table's).
        settings["policy_factory"] = settings.pop("architecture")
        settings["architecture"] = MODULE_ARCHITECTURE
        if "hidden_sizes" not in overrides:
            settings.pop("hidden_sizes", None)
    if "inference_dtype" not in settings:
        runner = BATCHED if batched else PER_GENOME
        measured = all(section.learns_quantised for section in recorded)
        settings["inference_dtype"] = (
            default_dtype(settings["architecture"], runner) if measured else FLOAT32
        )
    return RunConfig(env_id=kind.env_id, atari=kind.atari, algorithm=algorithm,
                     sections=sections, **settings)  # fmt: skip


def episode_step_limit(env_id: str, max_episode_steps: int) -> int:
    """Most agent steps an episode lasts: `max_episode_steps` or the env's time limit, the
    smaller where both are set; 0 where neither is."""
    limits = [max_episode_steps] if max_episode_steps > 0 else []
    registered = env_step_limit(env_id)
    if registered:
        limits.append(registered)
    return min(limits, default=0)


def env_step_limit(env_id: str) -> int:
    """The time limit gymnasium registers for a (non-Atari) env id, which workers' envs keep
    (neuro.envs.make builds them with gym.make); 0 if it has none or the id is not known."""
    try:
        spec = env_spec(env_id)  # neuro's toy tasks, the maze, a module:Env-id's module
    except ModuleUnavailable:
        raise  # the env's package is missing here: said as it is, not as "no limit"
    except ValueError:
        return 0
    return int(spec.max_episode_steps or 0)


NOT_SETTINGS = frozenset({"env_id", "atari", "sections", "algorithm", "run_id", "policy_factory"})
"""RunConfig fields no flag and no study sets: --env, --algo, --policy (a user's factory) and
the run itself set them."""
FLAG_NAMES = {"architecture": "--policy", "hidden_sizes": "--hidden"}
"""RunConfig's settings whose flag is not named after the field (kept from before the flags
were generated, so scripts and templates keep working); a section names its own."""
_SWITCHES = {"algorithm": str, "no_target": bool}
"""What neuro-master's flags set besides the settings: --algo, and --no-target (no target)."""


@functools.cache
def setting_aliases() -> dict[str, str]:
    """A setting's flag name where it is not the field's (population: population_size), as a
    study file may write it, to the field's name."""
    flags = dict(FLAG_NAMES)
    for section in SECTIONS:
        flags.update(section.flag_names)
    aliases = {flag.removeprefix("--").replace("-", "_"): name for name, flag in flags.items()}
    return {alias: name for alias, name in aliases.items() if alias != name}


@functools.cache
def setting_types() -> dict[str, Any]:
    """Every setting a new run may be given by name (neuro-master's flags, a study file), with
    its type: RunConfig's own fields, then each settings section's (but its fixed ones; a name
    two sections share, as seed, once)."""
    hints = typing.get_type_hints(RunConfig)
    types = {f.name: hints[f.name] for f in dataclasses.fields(RunConfig)
             if f.init and f.name not in NOT_SETTINGS}  # fmt: skip
    for section in SECTIONS:
        section_hints = typing.get_type_hints(section.settings)
        for name in section.field_names:
            if name not in section.fixed:
                types.setdefault(name, section_hints[name])
    return types


def config_from_settings(
    env_id: str, settings: Mapping[str, Any], batched: bool = False
) -> RunConfig:
    """A new run's config from settings named as neuro-master's flags name them, through the
    flags' checks (checked_settings) and the same preset; ValueError naming the setting and
    its value, or the env id."""
    kind = inspect_env_id(env_id)
    overrides = checked_settings(settings)
    if overrides.pop("no_target", False):
        overrides["target_score"] = None
    algorithm = overrides.pop("algorithm", DEFAULT_ALGORITHM)
    return preset(kind, batched, algorithm=algorithm, **overrides)


def checked_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Settings by their fields' names, each held alone to its flag's type and bounds (as
    neuro-master's flags are at parse time); ValueError naming the setting and its value.

    Names are RunConfig's and the sections' fields, or the flags' own where they differ
    (population, policy, hidden), and "algorithm" and "no_target" as --algo and --no-target.
    Values arrive typed (a study file's TOML): an integer setting takes an integer, a number
    one an integer or a float, hidden_sizes a list of positive integers (or "64,64").
    """
    types, aliases = setting_types(), setting_aliases()
    checked: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for given, value in settings.items():
        name = aliases.get(given, given)
        hint = _SWITCHES.get(name) or types.get(name)
        if hint is None:
            known = [*types, *aliases, *_SWITCHES]
            close = difflib.get_close_matches(given, known, n=1)
            hint_text = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"unknown setting {given!r}{hint_text}")
        if name in spelled:
            raise ValueError(f"{name} is given twice (as {spelled[name]} and as {given})")
        spelled[name] = given
        checked[name] = _typed(name, hint, value)
    return checked


def _typed(name: str, hint: Any, value: Any) -> Any:
    """`value` as the setting's flag would have made it, or ValueError naming both."""
    if name == "hidden_sizes":
        if isinstance(value, str):  # as the flag writes it
            parts = [part.strip() for part in value.split(",")]
            value = [int(part) if part.isdigit() else part for part in parts]
        ok = isinstance(value, list | tuple) and bool(value)
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
        if not ok:
            raise ValueError(f"hidden_sizes must be a list of positive integers, got {value!r}")
        return tuple(value)
    types = [t for t in typing.get_args(hint) or (hint,) if t is not type(None)]
    kind = types[0] if len(types) == 1 else None
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"no setting type for {name}: {hint!r}")
    if not ok:
        noun = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
        raise ValueError(f"{name} must be {noun[kind]}, got {value!r}")
    check_setting(name, value)
    return value
