"""Every algorithm the master can run, by the name configs and checkpoints use.

An entry knows its hyperparameter dataclass and makes a fresh instance, or one restored from a
checkpoint, for a run. Registering an entry here is all the rest of the master needs, and
tests/test_algorithm_contract.py then holds it to the interface of master.algorithms.base.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from master.algorithms.base import Algorithm
from master.algorithms.es import ESConfig, EvolutionStrategy
from master.algorithms.ga import GAConfig, GeneticAlgorithm

# Only for annotations: this module is handed a RunConfig and reads its fields, so it never
# imports master.config at run time, and master.config can take ALGORITHMS from here without
# an import cycle (the names live once, with the entries that define them).
if TYPE_CHECKING:
    from master.config import RunConfig


@dataclass(frozen=True)
class Entry:
    """How the master makes one algorithm for a run."""

    name: str
    config_type: type
    """Its hyperparameter dataclass; the RunConfig field named like the entry holds one."""
    create: Callable[[RunConfig], Algorithm]
    """A new instance at generation 0."""
    restore: Callable[[RunConfig, Mapping[str, Any], np.ndarray | None], Algorithm]
    """The instance a checkpoint's state document (and its sidecar arrays, if any) describe."""
    elite_document: Callable[[RunConfig, Any], dict[str, Any]]
    """The replayable document of a summary's elite: what elite_genome.json holds."""
    mutation_power: Callable[[RunConfig], float]
    """The scale workers apply to each seed's noise."""

    def settings(self, config: RunConfig) -> Any:
        """This algorithm's hyperparameters in a run's config."""
        return getattr(config, self.name)


def _noise_table(config: RunConfig) -> np.ndarray:
    from neuro.noise import NoiseTableSpec, load_noise_table

    return load_noise_table(NoiseTableSpec(config.noise_table_seed, config.noise_table_size))


def _create_es(config: RunConfig) -> EvolutionStrategy:
    """theta initialised like a GA genome's first seed: one seed's noise times the init scale."""
    from neuro.decode import decode_genome
    from neuro.envs.make import make_env
    from neuro.layout import init_scale, parameter_layout

    assert config.es is not None, "the ES entry is only used for ES runs"
    table = _noise_table(config)
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
    seed = int(np.random.default_rng(config.es.seed).integers(2**32))
    theta = decode_genome(table, init_scale(layout), config.es.sigma, [seed])
    return EvolutionStrategy(config.es, table, theta)


def _restore_es(
    config: RunConfig, document: Mapping[str, Any], arrays: np.ndarray | None
) -> EvolutionStrategy:
    assert config.es is not None, "the ES entry is only used for ES runs"
    if arrays is None:
        raise ValueError("an ES checkpoint needs its arrays (theta, m, v); this one names none")
    return EvolutionStrategy.from_state_dict(config.es, _noise_table(config), document, arrays)


GA = Entry(
    name="ga",
    config_type=GAConfig,
    create=lambda config: GeneticAlgorithm(config.ga),
    restore=lambda config, document, _: GeneticAlgorithm.from_state_dict(config.ga, document),
    elite_document=lambda config, genome: config.genome_document(genome),
    mutation_power=lambda config: config.ga.mutation_power,
)
ES = Entry(
    name="es",
    config_type=ESConfig,
    create=_create_es,
    restore=_restore_es,
    elite_document=lambda config, parameters: config.parameters_document(parameters),
    mutation_power=lambda config: config.es.sigma,
)

REGISTRY: dict[str, Entry] = {entry.name: entry for entry in (GA, ES)}
ALGORITHMS: tuple[str, ...] = tuple(REGISTRY)


def get(name: str) -> Entry:
    """The entry of `name`; ValueError naming it and the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"algorithm {name!r} is not one of {ALGORITHMS}") from None
