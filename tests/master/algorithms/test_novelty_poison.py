"""One extreme behaviour cannot erase the others' novelty (a lease holder may send any finite BC).

Novelty distances were taken as |a|^2 + |b|^2 - 2ab about the population's mean: one BC of 1e12
dragged the mean away and every other distance cancelled to 0, so the parents became the
poisoner plus index order. Whatever finite BCs come, each row's novelty is its true mean
distance to its k nearest (checked against the obvious float64 computation, and by hypothesis
over populations with extreme rows).
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from master.algorithms.es import ESConfig
from master.algorithms.ga import GAConfig
from master.algorithms.ga_ns import NoveltyGA
from master.algorithms.novelty import NoveltyConfig, novelty
from master.algorithms.ns_es import NoveltySearchES
from neuro.noise import NoiseTableSpec, generate_into

POISON = 1e12
FLOAT32_MAX = float(np.finfo(np.float32).max)


def brute_force(behaviours: np.ndarray, reference: np.ndarray, k: int, exclude=None) -> np.ndarray:
    """Each row's mean distance to its k nearest, from direct float64 differences."""
    rows, ref = behaviours.astype(np.float64), reference.astype(np.float64)
    result = []
    for i, row in enumerate(rows):
        if not np.isfinite(row).all():
            result.append(math.nan)
            continue
        distances = sorted(
            math.sqrt(float(np.square(row - other).sum()))
            for j, other in enumerate(ref)
            if np.isfinite(other).all() and (exclude is None or exclude[i] != j)
        )[:k]
        result.append(float(np.mean(distances)) if distances else 0.0)
    return np.array(result)


def test_one_extreme_behaviour_leaves_the_others_novelty_as_it_was() -> None:
    rng = np.random.default_rng(3)
    honest = rng.integers(0, 10, size=(20, 4)).astype(np.float32)
    poisoned = np.concatenate([honest, np.full((1, 4), POISON, np.float32)])
    own = np.arange(len(poisoned))
    found = novelty(poisoned, poisoned, 3, exclude=own)
    np.testing.assert_allclose(found, brute_force(poisoned, poisoned, 3, own), rtol=1e-9)
    # The honest rows measure each other as if the poisoner were one more distant stranger.
    alone = novelty(honest, honest, 3, exclude=np.arange(len(honest)))
    np.testing.assert_allclose(found[:-1], alone, rtol=1e-9)
    assert found[:-1].min() > 0


@pytest.mark.parametrize("block", [1, 4, 1024])
def test_an_extreme_behaviour_in_the_archive_masks_nothing_either(block: int) -> None:
    rng = np.random.default_rng(4)
    archive = rng.normal(100, 3, size=(30, 8)).astype(np.float32)
    archive[7] = -POISON
    queries = rng.normal(100, 3, size=(9, 8)).astype(np.float32)
    found = novelty(queries, archive, 4, block=block)
    np.testing.assert_allclose(found, brute_force(queries, archive, 4), rtol=1e-9)


def test_ga_ns_parents_are_the_most_novel_whatever_one_poisoner_sends() -> None:
    config = GAConfig(population_size=8, truncation=3, elite_candidates=2, elite_episodes=1,
                      seed=4)  # fmt: skip
    algorithm = NoveltyGA(config, NoveltyConfig(k=2, archive_probability=0.0))
    population = list(algorithm.state.population)
    # Six alike near the origin, one honest outlier at (50, 0), one poisoner far away.
    bcs = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [2, 0], [0, 2], [50, 0], [POISON, POISON]],
                   np.float32)  # fmt: skip
    requests = algorithm.ask()
    returns = {r.key: [1.0] for r in requests}
    behaviours = {r.key: bcs[i : i + 1] for i, r in enumerate(requests)}
    assert algorithm.tell(returns, behaviours) is None
    values = brute_force(bcs, bcs, 2, np.arange(8))
    order = sorted(range(8), key=lambda i: -values[i])
    assert order[:2] == [7, 6]  # the poisoner is the most novel: it is far away, truly
    assert algorithm.state.parents == [population[i] for i in order[:3]]
    # Not the poisoner plus index order: the third parent is the most novel of the six alike.
    assert algorithm.state.parents[2] != population[0]


def test_ns_es_novelty_of_honest_perturbations_survives_a_poisoned_one() -> None:
    spec = NoiseTableSpec(seed=7, size=2**16)
    table = np.empty(spec.size, np.float32)
    generate_into(spec, table)
    thetas = list(np.random.default_rng(1).normal(size=(2, 40)).astype(np.float32))
    algorithm = NoveltySearchES(ESConfig(pairs=3, eval_episodes=1, seed=2),
                                NoveltyConfig(k=1, meta_population=2), table, thetas)  # fmt: skip
    requests = algorithm.ask()
    bcs = np.array([[1, 0], [2, 0], [3, 0], [4, 0], [5, 0], [POISON, 0]], np.float32)
    returns = {r.key: [1.0] * r.episodes for r in requests}
    behaviours = {r.key: bcs[i : i + 1] for i, r in enumerate(requests[:-1])}
    behaviours[requests[-1].key] = np.zeros((1, 2), np.float32)
    summary = algorithm.tell(returns, behaviours)
    # Against the archive (theta's BC at the origin, k=1): each perturbation's own distance,
    # the honest ones' 1 to 5 included (they add up to 15 beside the poisoner's).
    poison = float(np.float32(POISON))
    assert summary.novelty_max == poison
    assert summary.novelty_mean * 6 - poison == pytest.approx(15, abs=0.01)
    assert summary.grad_norm > 0


# -- property: no finite behaviours make novelty non-finite or degenerate ------------------------

MODERATE = st.floats(-300, 300, width=32)
EXTREME = st.sampled_from([POISON, -POISON, 1e30, -1e30, FLOAT32_MAX, -FLOAT32_MAX, 3e38])
VALUES = st.one_of(
    MODERATE,
    MODERATE,
    MODERATE,
    EXTREME,
    st.floats(width=32, allow_nan=False, allow_infinity=False),
)


@st.composite
def populations(draw) -> np.ndarray:
    rows, size = draw(st.integers(2, 24)), draw(st.integers(1, 6))
    values = draw(st.lists(VALUES, min_size=rows * size, max_size=rows * size))
    return np.array(values, np.float32).reshape(rows, size)


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(populations(), st.integers(1, 5), st.integers(1, 8))
def test_no_finite_behaviours_make_novelty_non_finite_or_cancel(bcs, k, block) -> None:
    own = np.arange(len(bcs))
    found = novelty(bcs, bcs, k, exclude=own, block=block)
    expected = brute_force(bcs, bcs, k, own)
    assert np.isfinite(found).all()
    # Every row's novelty is its true one: none cancels to 0 while its neighbours are elsewhere.
    np.testing.assert_allclose(found, expected, rtol=1e-6, atol=0)
