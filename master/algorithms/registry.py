"""Every algorithm the master can run, by the name configs and checkpoints use.

An entry names the settings sections its hyperparameters live in (master.algorithms.settings:
each section brings its dataclass, bounds, presets and command-line group) and makes a fresh
instance, or one restored from a checkpoint, for a run. Registering an entry here is all the
rest of the master needs: master.config and master.cli read the sections from SECTIONS, and
tests/master/algorithms/test_algorithm_contract.py holds every entry to the interface of
master.algorithms.base and round-trips its settings.

Like the algorithms, the entries do no I/O: what a run's algorithm is made from beyond its
settings (the noise table, the env's spaces) is read by master.run.algorithm_setup and handed in
as plain values, as each entry's needs_* flags ask.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from master.algorithms.base import Algorithm, Parameters
from master.algorithms.es import ES_SETTINGS, EvolutionStrategy
from master.algorithms.ga import GA_SETTINGS, GeneticAlgorithm
from master.algorithms.ga_ns import NoveltyGA
from master.algorithms.novelty import NOVELTY_SETTINGS
from master.algorithms.ns_es import NoveltyRewardSearchES, NoveltySearchES
from master.algorithms.settings import RunFacts, SettingsSection
from neuro.decode import decode_genome
from neuro.genome import Genome
from neuro.layout import Layout, parameter_layout
from neuro.policy_spec import init_scale_of


class RunSettings(RunFacts, Protocol):
    """What an entry reads of a run's settings; master.config.RunConfig is one. Its sections
    are read through their records: ES_SETTINGS.of(settings).

    Declared here rather than imported: master.config takes ALGORITHMS from this module, so
    this room names nothing above it, not even for annotations.
    """

    @property
    def architecture(self) -> str: ...
    @property
    def hidden_sizes(self) -> tuple[int, ...]: ...
    def genome_document(self, genome: Genome) -> dict[str, Any]: ...
    def parameters_document(self, parameters: Parameters) -> dict[str, Any]: ...


@dataclass(frozen=True)
class EnvSpaces:
    """The env's spaces, as far as a parameter vector's layout needs them."""

    observation_shape: tuple[int, ...]
    outputs: int
    """Discrete actions: their number; a vector action: its size."""
    layout: Layout | None = None
    """A user's network: its parameters' names and shapes, read from the module its factory
    built (master.run.algorithm_setup); None for a built-in network, whose layout
    neuro.layout computes."""

    @property
    def observation_size(self) -> int:
        """The flattened size of one observation."""
        return int(np.prod(self.observation_shape))


@dataclass(frozen=True)
class Entry:
    """How the master makes one algorithm for a run."""

    name: str
    summary: str
    """What it is, in a few words, for --algo's help."""
    sections: tuple[SettingsSection[Any], ...]
    """The settings sections holding its hyperparameters; a run of it records these, and
    those every run records (the GA's), and no others."""
    create: Callable[[RunSettings, np.ndarray | None, EnvSpaces | None], Algorithm]
    """A new instance at generation 0, from (settings, noise table, env spaces)."""
    restore: Callable[[RunSettings, np.ndarray | None, Mapping[str, Any], np.ndarray | None],
                      Algorithm]  # fmt: skip
    """The instance a checkpoint's state document (and its sidecar arrays, if any) describe,
    from (settings, noise table, document, arrays)."""
    elite_document: Callable[[RunSettings, Any], dict[str, Any]]
    """The replayable document of a summary's elite: what elite_genome.json holds."""
    mutation_power: Callable[[RunSettings], float]
    """The scale workers apply to each seed's noise."""
    needs_noise_table: bool = False
    """create and restore take the run's noise table (else None): the ES family's."""
    needs_env_spaces: bool = False
    """create takes the env's spaces (else None): the ES family starts from parameter vectors."""


def _initial_thetas(
    settings: RunSettings, table: np.ndarray, spaces: EnvSpaces, count: int
) -> list[np.ndarray]:
    """`count` thetas, each one seed's noise times the init scale; seeds drawn from the run's."""
    es = ES_SETTINGS.of(settings)
    layout = spaces.layout or parameter_layout(
        settings.architecture, spaces.observation_shape, spaces.outputs, settings.hidden_sizes
    )
    rng = np.random.default_rng(es.seed)
    # One draw per vector, in turn: the first is the seed a plain ES run starts from.
    seeds = [int(rng.integers(2**32)) for _ in range(count)]
    scale = init_scale_of(settings.architecture, layout)
    return [decode_genome(table, scale, es.sigma, [seed]) for seed in seeds]


def _create_es(
    settings: RunSettings, table: np.ndarray | None, spaces: EnvSpaces | None
) -> EvolutionStrategy:
    """theta initialised like a GA genome's first seed: one seed's noise times the init scale."""
    es = ES_SETTINGS.of(settings)
    assert table is not None and spaces is not None, "the ES entry needs the table and spaces"
    (theta,) = _initial_thetas(settings, table, spaces, 1)
    observation_size = 0
    if es.observation_norm:
        if settings.atari:
            raise ValueError("observation_norm is for vector observations, not Atari frames")
        observation_size = spaces.observation_size
    return EvolutionStrategy(es, table, theta, observation_size=observation_size)


def _restore_es(
    settings: RunSettings,
    table: np.ndarray | None,
    document: Mapping[str, Any],
    arrays: np.ndarray | None,
) -> EvolutionStrategy:
    assert table is not None, "the ES entry needs the noise table"
    if arrays is None:
        raise ValueError("an ES checkpoint needs its arrays (theta, m, v); this one names none")
    return EvolutionStrategy.from_state_dict(ES_SETTINGS.of(settings), table, document, arrays)


def _create_ga_ns(settings: RunSettings, *_: object) -> NoveltyGA:
    return NoveltyGA(GA_SETTINGS.of(settings), NOVELTY_SETTINGS.of(settings))


def _restore_ga_ns(
    settings: RunSettings,
    _table: np.ndarray | None,
    document: Mapping[str, Any],
    arrays: np.ndarray | None,
) -> NoveltyGA:
    if arrays is None:
        raise ValueError("a GA-NS checkpoint needs its arrays (the archive); this one names none")
    ga, novelty = GA_SETTINGS.of(settings), NOVELTY_SETTINGS.of(settings)
    return NoveltyGA.from_state_dict(ga, novelty, document, arrays)


def _ns_es_entry(cls: type[NoveltySearchES]) -> Entry:
    """The entry of NS-ES or NSR-ES: a meta-population of ES members, each started like ES."""

    def create(
        settings: RunSettings, table: np.ndarray | None, spaces: EnvSpaces | None
    ) -> NoveltySearchES:
        assert table is not None and spaces is not None, f"{cls.name} needs the table and spaces"
        novelty = NOVELTY_SETTINGS.of(settings)
        thetas = _initial_thetas(settings, table, spaces, novelty.meta_population)
        return cls(ES_SETTINGS.of(settings), novelty, table, thetas)

    def restore(
        settings: RunSettings,
        table: np.ndarray | None,
        document: Mapping[str, Any],
        arrays: np.ndarray | None,
    ) -> NoveltySearchES:
        assert table is not None, f"{cls.name} needs the noise table"
        if arrays is None:
            raise ValueError(f"a {cls.name} checkpoint needs its arrays; this one names none")
        es, novelty = ES_SETTINGS.of(settings), NOVELTY_SETTINGS.of(settings)
        return cls.from_state_dict(es, novelty, table, document, arrays)

    return Entry(
        name=cls.name,
        summary="ES over a meta-population seeking novelty (and reward)",
        sections=(ES_SETTINGS, NOVELTY_SETTINGS),
        create=create,
        restore=restore,
        elite_document=lambda settings, parameters: settings.parameters_document(parameters),
        mutation_power=_sigma,
        needs_noise_table=True,
        needs_env_spaces=True,
    )


def _sigma(settings: RunSettings) -> float:
    return ES_SETTINGS.of(settings).sigma


def _ga_mutation_power(settings: RunSettings) -> float:
    return GA_SETTINGS.of(settings).mutation_power


GA = Entry(
    name="ga",
    summary="the Deep GA",
    sections=(GA_SETTINGS,),
    create=lambda settings, *_: GeneticAlgorithm(GA_SETTINGS.of(settings)),
    restore=lambda settings, _table, document, _arrays: GeneticAlgorithm.from_state_dict(
        GA_SETTINGS.of(settings), document
    ),
    elite_document=lambda settings, genome: settings.genome_document(genome),
    mutation_power=_ga_mutation_power,
)
ES = Entry(
    name="es",
    summary="Evolution Strategies on the same fleet",
    sections=(ES_SETTINGS,),
    create=_create_es,
    restore=_restore_es,
    elite_document=lambda settings, parameters: settings.parameters_document(parameters),
    mutation_power=_sigma,
    needs_noise_table=True,
    needs_env_spaces=True,
)

GA_NS = Entry(
    name="ga-ns",
    summary="the GA with parents chosen by novelty",
    sections=(GA_SETTINGS, NOVELTY_SETTINGS),
    create=_create_ga_ns,
    restore=_restore_ga_ns,
    elite_document=lambda settings, genome: settings.genome_document(genome),
    mutation_power=_ga_mutation_power,
)
NS_ES = _ns_es_entry(NoveltySearchES)
NSR_ES = _ns_es_entry(NoveltyRewardSearchES)

REGISTRY: dict[str, Entry] = {entry.name: entry for entry in (GA, ES, GA_NS, NS_ES, NSR_ES)}
ALGORITHMS: tuple[str, ...] = tuple(REGISTRY)
DEFAULT_ALGORITHM = GA.name
"""What a run without --algo runs."""
SECTIONS: tuple[SettingsSection[Any], ...] = tuple(
    {section.name: section for entry in REGISTRY.values() for section in entry.sections}.values()
)
"""Every settings section, in the order the entries first name them (the command line's)."""


def get(name: str) -> Entry:
    """The entry of `name`; ValueError naming it and the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"algorithm {name!r} is not one of {ALGORITHMS}") from None


def run_sections(name: str) -> tuple[SettingsSection[Any], ...]:
    """The sections a run of algorithm `name` records: its own and every run's, in SECTIONS
    order."""
    own = {section.name for section in get(name).sections}
    return tuple(s for s in SECTIONS if s.every_run or s.name in own)


def algorithms_using(section: SettingsSection[Any]) -> tuple[str, ...]:
    """The algorithms whose entries name `section`, as --algo values."""
    return tuple(name for name, entry in REGISTRY.items() if section in entry.sections)
