"""Observation sums: every valid one, and every sum of valid ones, gives a usable normaliser.

The normaliser is a float32 mean and std made from float64 sums. Sums that are each finite can
still overflow together, or give a mean or std past float32 (a std of inf makes every worker
refuse every task); MAX_MAGNITUDE bounds what any sums may show so that neither can happen.
"""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from neuro.observation_stats import (
    INITIAL_COUNT,
    MAX_MAGNITUDE,
    STD_FLOOR,
    ObservationStats,
)

SIZE = 3


def sums(count: float, total: float, squares: float) -> ObservationStats:
    return ObservationStats(count, np.full(SIZE, total), np.full(SIZE, squares))


@pytest.mark.parametrize(
    ("count", "total", "squares", "detail"),
    [
        (1.0, 0.0, 1.7e308, "mean square 1.7e+308"),  # two of them overflowed the phase's sum
        (1.0, 1e45, 1e90, "mean 1e+45"),  # the next version's mean and std were inf
        (2.0, -4e30, 8e60, "mean 2e+30"),
        (0.0, 1.0, 1.0, "mean 100"),  # no observations, yet a sum
    ],
)
def test_sums_no_normaliser_could_use_are_refused_naming_the_value(
    count: float, total: float, squares: float, detail: str
) -> None:
    with pytest.raises(ValueError, match="beyond") as error:
        sums(count, total, squares)
    assert detail in str(error.value)


def test_sums_at_the_bound_pass_and_their_normaliser_is_finite() -> None:
    edge = sums(2.0, 2 * MAX_MAGNITUDE, 2 * MAX_MAGNITUDE**2)
    mean, std = edge.normaliser()
    assert mean.dtype == std.dtype == np.float32
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std >= STD_FLOOR)
    prior = ObservationStats.prior(SIZE)
    assert prior.normaliser()[1].tolist() == [np.float32(STD_FLOOR)] * SIZE


def test_honest_sums_are_what_they_were() -> None:
    rng = np.random.default_rng(0)
    observations = rng.normal(3.0, 2.0, (50, SIZE))
    stats = ObservationStats.of(observations)
    mean, std = (ObservationStats.prior(SIZE) + stats).normaliser()
    count = INITIAL_COUNT + 50
    expected_mean = observations.sum(axis=0) / count
    variance = np.square(observations).sum(axis=0) / count - np.square(expected_mean)
    assert np.array_equal(mean, expected_mean.astype(np.float32))
    assert np.array_equal(std, np.sqrt(np.maximum(variance, STD_FLOOR**2)).astype(np.float32))


# -- property: no valid sums, alone or added up, give an unusable normaliser -------------------

# Counts as the gRPC edge lets them through: at most a task's episodes x the step limit.
COUNTS = st.one_of(st.floats(0, 1e6), st.sampled_from([0.0, INITIAL_COUNT, 1.0, 4e9, 1e12]))
VALUES = st.one_of(
    st.floats(-1e6, 1e6),
    st.sampled_from([0.0, 1e30, -1e30, 1e45, 1.7e308, -1.7e308, 5e-324, 1e-300]),
    st.floats(allow_nan=False, allow_infinity=False),
)


@st.composite
def any_sums(draw) -> tuple[float, np.ndarray, np.ndarray]:
    count = draw(COUNTS)
    if draw(st.booleans()):
        # Plausible sums: count observations of some mean and spread.
        mean = np.array([draw(VALUES) for _ in range(SIZE)])
        spread = np.abs(np.array([draw(VALUES) for _ in range(SIZE)]))
        with np.errstate(over="ignore", invalid="ignore"):
            return count, count * mean, count * (np.square(mean) + np.square(spread))
    total = np.array([draw(VALUES) for _ in range(SIZE)])
    return count, total, np.abs(np.array([draw(VALUES) for _ in range(SIZE)]))


def usable(stats: ObservationStats) -> None:
    mean, std = stats.normaliser()
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(std)), (mean, std)
    assert np.all(std >= np.float32(STD_FLOOR)), std
    assert np.all(np.abs(mean) <= np.float32(MAX_MAGNITUDE * 1.001)), mean


@settings(max_examples=500, deadline=None, database=None)
@given(st.lists(any_sums(), min_size=1, max_size=20))
def test_no_sequence_of_valid_sums_gives_an_unusable_normaliser(reported) -> None:
    run = ObservationStats.prior(SIZE)
    for count, total, squares in reported:
        try:
            stats = ObservationStats(count, total, squares)
        except ValueError:
            continue  # refused: it never reaches a run
        usable(stats)
        run = run + stats  # never raises: bounded counts and magnitudes add up to bounded ones
        usable(run)
