"""Every algorithm the master can run, by the name configs and checkpoints use.

An entry knows which config sections hold its settings and makes a fresh instance, or one
restored from a checkpoint, for a run. Registering an entry here is all the rest of the master
needs, and tests/test_algorithm_contract.py then holds it to the interface of
master.algorithms.base.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from master.algorithms.base import Algorithm
from master.algorithms.es import EvolutionStrategy
from master.algorithms.ga import GeneticAlgorithm
from master.algorithms.ga_ns import NoveltyGA
from master.algorithms.ns_es import NoveltyRewardSearchES, NoveltySearchES

# Only for annotations: this module is handed a RunConfig and reads its fields, so it never
# imports master.config at run time, and master.config can take ALGORITHMS from here without
# an import cycle (the names live once, with the entries that define them).
if TYPE_CHECKING:
    from master.config import RunConfig


@dataclass(frozen=True)
class Entry:
    """How the master makes one algorithm for a run."""

    name: str
    sections: tuple[str, ...]
    """The RunConfig fields holding its hyperparameters ("ga", "es", "novelty"); a run of it
    sets those of "es" and "novelty" it names and leaves the others None."""
    create: Callable[[RunConfig], Algorithm]
    """A new instance at generation 0."""
    restore: Callable[[RunConfig, Mapping[str, Any], np.ndarray | None], Algorithm]
    """The instance a checkpoint's state document (and its sidecar arrays, if any) describe."""
    elite_document: Callable[[RunConfig, Any], dict[str, Any]]
    """The replayable document of a summary's elite: what elite_genome.json holds."""
    mutation_power: Callable[[RunConfig], float]
    """The scale workers apply to each seed's noise."""


def _noise_table(config: RunConfig) -> np.ndarray:
    from neuro.noise import NoiseTableSpec, load_noise_table

    return load_noise_table(NoiseTableSpec(config.noise_table_seed, config.noise_table_size))


def _initial_thetas(config: RunConfig, table: np.ndarray, count: int) -> list[np.ndarray]:
    """`count` thetas, each one seed's noise times the init scale; seeds drawn from the run's."""
    from neuro.decode import decode_genome
    from neuro.envs.make import make_env
    from neuro.layout import init_scale, parameter_layout

    assert config.es is not None, "only ES-family entries start from parameter vectors"
    # The master builds the env once, only to learn its spaces (no torch here).
    env = make_env(config.env_id, config.atari_dynamics).env
    try:
        space = env.action_space
        outputs = int(space.n) if hasattr(space, "n") else int(np.prod(space.shape))
        layout = parameter_layout(
            config.architecture, env.observation_space.shape, outputs, config.hidden_sizes
        )
    finally:
        env.close()
    rng = np.random.default_rng(config.es.seed)
    # One draw per vector, in turn: the first is the seed a plain ES run starts from.
    seeds = [int(rng.integers(2**32)) for _ in range(count)]
    scale = init_scale(layout)
    return [decode_genome(table, scale, config.es.sigma, [seed]) for seed in seeds]


def _create_es(config: RunConfig) -> EvolutionStrategy:
    """theta initialised like a GA genome's first seed: one seed's noise times the init scale."""
    assert config.es is not None, "the ES entry is only used for ES runs"
    table = _noise_table(config)
    (theta,) = _initial_thetas(config, table, 1)
    observation_size = 0
    if config.es.observation_norm:
        if config.atari:
            raise ValueError("observation_norm is for vector observations, not Atari frames")
        observation_size = _observation_size(config)
    return EvolutionStrategy(config.es, table, theta, observation_size=observation_size)


def _observation_size(config: RunConfig) -> int:
    """The flattened size of the env's observations."""
    from neuro.envs.make import make_env

    env = make_env(config.env_id, config.atari_dynamics).env
    try:
        return int(np.prod(env.observation_space.shape))
    finally:
        env.close()


def _restore_es(
    config: RunConfig, document: Mapping[str, Any], arrays: np.ndarray | None
) -> EvolutionStrategy:
    assert config.es is not None, "the ES entry is only used for ES runs"
    if arrays is None:
        raise ValueError("an ES checkpoint needs its arrays (theta, m, v); this one names none")
    return EvolutionStrategy.from_state_dict(config.es, _noise_table(config), document, arrays)


def _create_ga_ns(config: RunConfig) -> NoveltyGA:
    assert config.novelty is not None, "the GA-NS entry is only used for GA-NS runs"
    return NoveltyGA(config.ga, config.novelty)


def _restore_ga_ns(
    config: RunConfig, document: Mapping[str, Any], arrays: np.ndarray | None
) -> NoveltyGA:
    assert config.novelty is not None, "the GA-NS entry is only used for GA-NS runs"
    if arrays is None:
        raise ValueError("a GA-NS checkpoint needs its arrays (the archive); this one names none")
    return NoveltyGA.from_state_dict(config.ga, config.novelty, document, arrays)


def _ns_es_entry(cls: type[NoveltySearchES]) -> Entry:
    """The entry of NS-ES or NSR-ES: a meta-population of ES members, each started like ES."""

    def create(config: RunConfig) -> NoveltySearchES:
        assert config.es is not None and config.novelty is not None, f"not a {cls.name} run"
        table = _noise_table(config)
        thetas = _initial_thetas(config, table, config.novelty.meta_population)
        return cls(config.es, config.novelty, table, thetas)

    def restore(
        config: RunConfig, document: Mapping[str, Any], arrays: np.ndarray | None
    ) -> NoveltySearchES:
        assert config.es is not None and config.novelty is not None, f"not a {cls.name} run"
        if arrays is None:
            raise ValueError(f"a {cls.name} checkpoint needs its arrays; this one names none")
        table = _noise_table(config)
        return cls.from_state_dict(config.es, config.novelty, table, document, arrays)

    return Entry(
        name=cls.name,
        sections=("es", "novelty"),
        create=create,
        restore=restore,
        elite_document=lambda config, parameters: config.parameters_document(parameters),
        mutation_power=lambda config: config.es.sigma,
    )


GA = Entry(
    name="ga",
    sections=("ga",),
    create=lambda config: GeneticAlgorithm(config.ga),
    restore=lambda config, document, _: GeneticAlgorithm.from_state_dict(config.ga, document),
    elite_document=lambda config, genome: config.genome_document(genome),
    mutation_power=lambda config: config.ga.mutation_power,
)
ES = Entry(
    name="es",
    sections=("es",),
    create=_create_es,
    restore=_restore_es,
    elite_document=lambda config, parameters: config.parameters_document(parameters),
    mutation_power=lambda config: config.es.sigma,
)

GA_NS = Entry(
    name="ga-ns",
    sections=("ga", "novelty"),
    create=_create_ga_ns,
    restore=_restore_ga_ns,
    elite_document=lambda config, genome: config.genome_document(genome),
    mutation_power=lambda config: config.ga.mutation_power,
)
NS_ES = _ns_es_entry(NoveltySearchES)
NSR_ES = _ns_es_entry(NoveltyRewardSearchES)

REGISTRY: dict[str, Entry] = {entry.name: entry for entry in (GA, ES, GA_NS, NS_ES, NSR_ES)}
ALGORITHMS: tuple[str, ...] = tuple(REGISTRY)


def get(name: str) -> Entry:
    """The entry of `name`; ValueError naming it and the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"algorithm {name!r} is not one of {ALGORITHMS}") from None
