"""A settings section: one frozen dataclass of an algorithm's hyperparameters, and all the run
needs to know of it.

A section carries its name (the key of config.json and of RunConfig.sections), the bounds of
each field (declared beside the field with `bounded`, checked by the dataclass itself), its
presets per kind of env, its group on the command line and what it adds to a generation's size.
A registry entry names the sections its settings live in; master.config and master.cli read
everything else from the records here, so a new algorithm's settings are its module's business.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

S = TypeVar("S")

BOUND = "bound"
"""The metadata key of a field's Bound."""


class EnvTraits(Protocol):
    """What a preset reads of the kind of env; neuro.envs.make.EnvKind is one."""

    @property
    def atari(self) -> bool: ...
    @property
    def deterministic(self) -> bool:
        """The return depends on the policy alone: one evaluation episode is enough."""
        ...


class RunFacts(Protocol):
    """What a section reads of the run it belongs to; master.config.RunConfig is one."""

    @property
    def env_id(self) -> str: ...
    @property
    def atari(self) -> bool: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def sections(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Bound:
    """The values a number setting may take; `high` may name another field of its dataclass."""

    low: float
    high: float | str | None = None
    integer: bool = True
    low_open: bool = False
    high_open: bool = False

    def problem(self, value: Any, owner: Any) -> str | None:
        """Why `value` is out of bounds ("must be ..."); None if it is within."""
        kind = numbers.Integral if self.integer else numbers.Real
        high = getattr(owner, self.high) if isinstance(self.high, str) else self.high
        ok = (
            isinstance(value, kind)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (value > self.low if self.low_open else value >= self.low)
            and (high is None or (value < high if self.high_open else value <= high))
        )
        return None if ok else self.describe(high)

    def describe(self, high: float | None = None) -> str:
        """The bound in words, as errors say it; `high` is the named field's value."""
        if self.high is None:
            if self.low_open:
                return "must be a positive number" if self.low == 0 else f"must be > {self.low}"
            return f"must be >= {self.low}"
        shown = f"{self.high}={high}" if isinstance(self.high, str) else _number(self.high)
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"must be in {left}{_number(self.low)}, {shown}{right}"


def _number(value: float) -> str:
    """A bound as a reader writes it: 2**63, not 9223372036854775808."""
    if isinstance(value, int) and value >= 2**32 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    return str(value)


def integer(low: int, high: int | str | None = None, *, high_open: bool = False) -> Bound:
    """An integer setting in [low, high] (or [low, high) with high_open); high: a field's name."""
    return Bound(low, high, integer=True, high_open=high_open)


def number(low: float, high: float | None = None, *, low_open: bool = False) -> Bound:
    """A finite real setting in [low, high] (or (low, high] with low_open)."""
    return Bound(low, high, integer=False, low_open=low_open)


POSITIVE = number(0, low_open=True)
"""A finite number > 0 (a step size, a noise scale)."""
SEED = integer(0, 2**63, high_open=True)
"""A seed of numpy's generators."""


def bounded(default: Any, bound: Bound) -> Any:
    """A dataclass field with its default and the bound check_bounds holds its value to."""
    return field(default=default, metadata={BOUND: bound})


def check_bounds(settings: Any) -> None:
    """ValueError("NAME must ..., got VALUE") for the first field out of its bound."""
    for f in dataclasses.fields(settings):
        bound = f.metadata.get(BOUND)
        value = getattr(settings, f.name)
        problem = bound.problem(value, settings) if bound is not None else None
        if problem is not None:
            raise ValueError(f"{f.name} {problem}, got {value}")


def bounds(settings: type) -> dict[str, Bound]:
    """The bound of each field of a settings dataclass that declares one."""
    fields = dataclasses.fields(settings)
    return {f.name: f.metadata[BOUND] for f in fields if BOUND in f.metadata}


def plain_preset(settings: type[S]) -> Callable[[EnvTraits, Mapping[str, Any]], S]:
    """The preset of a section whose defaults do not depend on the env: the dataclass's own."""

    def preset(_kind: EnvTraits, overrides: Mapping[str, Any]) -> S:
        return settings(**overrides)

    return preset


@dataclass(frozen=True, eq=False)
class SettingsSection(Generic[S]):
    """One section of a run's settings, as config, checkpoints and the command line see it.

    Each is one object, shared by the entries naming it: compared and hashed by identity.
    """

    name: str
    """Its key in config.json and in RunConfig.sections ("ga", "es", "novelty")."""
    settings: type[S]
    """The frozen dataclass of its fields; their bounds are declared with `bounded`."""
    noun: str
    """What its settings are called in errors: "['pairs'] are ES settings (--algo es, ...)"."""
    title: str
    """Its group on the command line; "{algorithms}" becomes the --algo values that use it."""
    preset: Callable[[EnvTraits, Mapping[str, Any]], S]
    """Its settings for a kind of env (Atari: the paper's), with the user's overrides on top."""
    generation_size: Callable[[S], tuple[int, str]] | None = None
    """Evaluations one generation asks for under these settings, and the formula in words
    (checked against master.config.MAX_EVALUATIONS_PER_GENERATION); None: it adds none."""
    fits_run: Callable[[S, RunFacts], None] | None = None
    """ValueError, naming the value, where its settings do not fit the rest of the run."""
    flag_names: Mapping[str, str] = field(default_factory=dict)
    """Flags not named after their field ("population_size": "--population")."""
    fixed: frozenset[str] = frozenset()
    """Fields that are no flag: config.json and checkpoints still carry them."""
    every_run: bool = False
    """Recorded whichever algorithm runs, not only by those naming it (the GA's: config.json
    has always held it, and an ES run's reads it back)."""
    learns_quantised: bool = True
    """A new run of it may default to a quantised inference dtype (neuro.inference.
    default_dtype, measured by training the GA); False keeps its runs on float32."""

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.settings))

    def of(self, run: RunFacts) -> S:
        """This section's settings in `run`; ValueError if the run has none."""
        settings = run.sections.get(self.name)
        if not isinstance(settings, self.settings):
            raise ValueError(f"a {run.algorithm} run has no {self.name} settings")
        return settings
