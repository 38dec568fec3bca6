"""ES tell() checks the phase's observation sums before it changes anything.

The sums were once added after the Adam step: sums that overflowed the run's raised there, and
the checkpoint written on the way out held a stepped theta under the old generation number.
A state whose sums no normaliser could use is refused when restored, too.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from master.algorithms.es import ESConfig, ESState, EvolutionStrategy
from neuro.noise import NoiseTableSpec, generate_into
from neuro.observation_stats import ObservationStats

TABLE_SPEC = NoiseTableSpec(seed=7, size=2**16)
SIZE = 3


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    out = np.empty(TABLE_SPEC.size, np.float32)
    generate_into(TABLE_SPEC, out)
    return out


def normalised_es(table: np.ndarray) -> EvolutionStrategy:
    theta = np.random.default_rng(0).normal(0, 0.1, 40).astype(np.float32)
    config = ESConfig(pairs=3, eval_episodes=1, seed=3, observation_norm=True)
    return EvolutionStrategy(config, table, theta, observation_size=SIZE)


def answers(es: EvolutionStrategy) -> dict[str, list[float]]:
    return {r.key: [float(i)] * r.episodes for i, r in enumerate(es.ask())}


def snapshot(es: EvolutionStrategy) -> tuple[str, bytes, tuple]:
    norm = es.observation_norm()
    return json.dumps(es.state_dict()), es.arrays().tobytes(), tuple(v.tobytes() for v in norm)


def test_sums_that_overflow_the_runs_change_nothing(table: np.ndarray) -> None:
    es = normalised_es(table)
    # Each count is a finite float; the two together are not.
    huge = ObservationStats(1e308, np.zeros(SIZE), np.zeros(SIZE))
    es.tell(answers(es), observation_stats=huge)
    before, parameters = snapshot(es), es.parameters()
    with pytest.raises(ValueError, match="observation count must be a finite number"):
        es.tell(answers(es), observation_stats=huge)
    # No Adam step, no new generation, no new noise: the same state, the same version.
    assert snapshot(es) == before
    assert es.generation == 1 and es.state.adam_steps == 1
    assert np.array_equal(es.parameters().theta, parameters.theta)


def test_sums_of_another_size_change_nothing_either(table: np.ndarray) -> None:
    es = normalised_es(table)
    before = snapshot(es)
    with pytest.raises(ValueError, match="observation sums of size 5"):
        es.tell(answers(es), observation_stats=ObservationStats.zeros(5))
    assert snapshot(es) == before


def test_the_next_versions_normaliser_is_made_from_the_sums_told(table: np.ndarray) -> None:
    es = normalised_es(table)
    seen = ObservationStats.of(np.random.default_rng(1).normal(2.0, 3.0, (30, SIZE)))
    es.tell(answers(es), observation_stats=seen)
    expected = (ObservationStats.prior(SIZE) + seen).normaliser()
    assert all(np.array_equal(a, b) for a, b in zip(es.observation_norm(), expected, strict=True))


@pytest.mark.parametrize(
    "sums",
    [
        {"count": 1.0, "sum": [1e45] * SIZE, "sum_of_squares": [1e90] * SIZE},
        {"count": 1.0, "sum": [0.0] * SIZE, "sum_of_squares": [1.7e308] * SIZE},
    ],
)
def test_a_state_holding_sums_no_normaliser_can_use_is_refused(table, sums) -> None:
    es = normalised_es(table)
    document = {**es.state_dict(), "observations": sums}
    with pytest.raises(ValueError, match="beyond"):
        ESState.from_dict(document, es.arrays())
