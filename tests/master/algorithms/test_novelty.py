"""Novelty search: the novelty measure, the bounded archive, GA-NS's parents, NS-ES's members."""

from __future__ import annotations

import json
import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from master.algorithms.base import Algorithm, EvaluationRequest, GenerationSummary
from master.algorithms.es import ESConfig, adam_step, centered_ranks, gradient_estimate
from master.algorithms.ga import GAConfig, GeneticAlgorithm
from master.algorithms.ga_ns import NoveltyGA
from master.algorithms.novelty import NoveltyArchive, NoveltyConfig, novelty
from master.algorithms.ns_es import (
    NoveltyRewardSearchES,
    NoveltySearchES,
    member_probabilities,
)
from master.config import inspect_env_id, preset
from master.run.algorithm_setup import create_algorithm, restore_algorithm
from neuro.genome import Genome
from neuro.noise import NoiseTableSpec, generate_into

TABLE_SPEC = NoiseTableSpec(seed=7, size=2**16)
PARAMS = 40


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    out = np.empty(TABLE_SPEC.size, np.float32)
    generate_into(TABLE_SPEC, out)
    return out


def brute_force(
    behaviours: np.ndarray, reference: np.ndarray, k: int, exclude: list[int] | None = None
) -> np.ndarray:
    """novelty() the slow, obvious way: every distance, in float64, one at a time."""
    result = []
    for i, b in enumerate(behaviours.astype(np.float64)):
        if not np.isfinite(b).all():
            result.append(math.nan)
            continue
        distances = sorted(
            math.sqrt(float(((b - r) ** 2).sum()))
            for j, r in enumerate(reference.astype(np.float64))
            if np.isfinite(r).all() and (exclude is None or exclude[i] != j)
        )[:k]
        result.append(float(np.mean(distances)) if distances else 0.0)
    return np.array(result)


def ram_like(rng: np.random.Generator, rows: int, size: int = 16) -> np.ndarray:
    """BCs like Atari RAM: bytes, far from the origin, with repeats."""
    return rng.integers(100, 110, size=(rows, size)).astype(np.float32)


# --- the novelty measure ---------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 40])
def test_novelty_is_the_mean_distance_to_the_k_nearest(k: int) -> None:
    rng = np.random.default_rng(k)
    archive, population = ram_like(rng, 25), ram_like(rng, 12)
    archive[[3, 7]] = np.nan  # failed evaluations are no neighbour
    population[5] = np.nan
    population[6, 2] = np.inf
    reference = np.concatenate([archive, population])
    own = [len(archive) + i for i in range(len(population))]
    found = novelty(population, reference, k, exclude=np.array(own))
    expected = brute_force(population, reference, k, own)
    assert np.isnan(found[[5, 6]]).all() and np.isfinite(np.delete(found, [5, 6])).all()
    np.testing.assert_allclose(found, expected, rtol=1e-9, atol=1e-6)
    # k beyond the usable reference: the mean over all of it (35 usable rows, one of them self).
    if k == 40:
        assert found[0] == pytest.approx(brute_force(population[:1], reference, 10**6, own)[0])


def test_a_behaviour_is_not_its_own_neighbour_but_its_twin_is() -> None:
    population = np.array([[0.0, 0.0], [0.0, 0.0], [3.0, 4.0]], np.float32)
    found = novelty(population, population, 1, exclude=np.arange(3))
    assert found.tolist() == [0.0, 0.0, 5.0]
    # Without the exclusion each is its own nearest neighbour, at distance 0.
    assert novelty(population, population, 1).tolist() == [0.0, 0.0, 0.0]
    # No neighbour at all: novelty 0; nothing usable to measure: NaN.
    assert novelty(population[2:], population[2:], 3, exclude=np.array([0])).tolist() == [0.0]
    assert np.isnan(novelty(np.full((1, 2), np.nan), population, 1)).all()


def test_tiles_of_any_size_give_the_same_novelty() -> None:
    rng = np.random.default_rng(5)
    behaviours, reference = ram_like(rng, 50), ram_like(rng, 130)
    whole = novelty(behaviours, reference, 4, block=10**6)
    for block in (1, 3, 7, 64):
        tiled = novelty(behaviours, reference, 4, block=block)
        np.testing.assert_allclose(tiled, whole, rtol=1e-12, atol=1e-9)
        assert (
            np.argsort(tiled, kind="stable").tolist() == np.argsort(whole, kind="stable").tolist()
        )


def test_novelty_of_an_atari_sized_population_stays_within_tens_of_megabytes() -> None:
    rng = np.random.default_rng(6)
    population = rng.integers(0, 256, size=(1000, 128)).astype(np.float32)
    reference = np.concatenate([rng.integers(0, 256, size=(10_000, 128)).astype(np.float32),
                                population])  # fmt: skip
    tracemalloc.start()
    try:
        found = novelty(population, reference, 10, exclude=10_000 + np.arange(1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # One 1000 x 11000 float64 distance matrix alone would be 88 MB.
    assert peak < 48 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    expected = brute_force(population[:3], reference, 10, [10_000, 10_001, 10_002])
    np.testing.assert_allclose(found[:3], expected, rtol=1e-9)


# --- the archive -----------------------------------------------------------------------------


def offer(archive: NoveltyArchive, values: range, batch: int = 7) -> None:
    """Offers one-value BCs `values`, a few at a time, as generations would."""
    rows = np.array(values, np.float32)[:, None]
    for start in range(0, len(rows), batch):
        archive.add(rows[start : start + batch])


def test_the_archive_keeps_at_most_its_capacity_and_counts_every_offer() -> None:
    archive = NoveltyArchive(capacity=20, seed=0)
    offer(archive, range(15))
    assert len(archive) == 15 and archive.behaviours[:, 0].tolist() == list(range(15))
    offer(archive, range(15, 500))
    assert len(archive) == 20 and archive.offered == 500
    assert len(set(archive.behaviours[:, 0].tolist())) == 20
    # NaN rows never enter, nor count as offered.
    archive.add(np.array([[np.nan], [np.inf]], np.float32))
    assert archive.offered == 500 and np.isfinite(archive.behaviours).all()
    with pytest.raises(ValueError, match="behaviours have 2 values, the archive's have 1"):
        archive.add(np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="capacity"):
        NoveltyArchive(capacity=0, seed=0)


def test_reservoir_sampling_keeps_a_uniform_sample_of_everything_offered() -> None:
    trials, offered, capacity = 300, 200, 20
    counts = np.zeros(offered)
    for seed in range(trials):
        archive = NoveltyArchive(capacity, seed)
        offer(archive, range(offered), batch=seed % 13 + 1)
        counts[archive.behaviours[:, 0].astype(int)] += 1
    frequency = counts / trials  # capacity / offered = 0.1 for every behaviour, old or new
    assert frequency.min() > 0.03 and frequency.max() < 0.2, (frequency.min(), frequency.max())
    for decile in frequency.reshape(10, -1):
        assert decile.mean() == pytest.approx(0.1, abs=0.02)


def test_the_archive_is_deterministic_given_its_seed() -> None:
    def filled(seed: int) -> np.ndarray:
        archive = NoveltyArchive(capacity=10, seed=seed)
        offer(archive, range(100))
        chosen = archive.choose(50, 0.3)
        return np.concatenate([archive.behaviours[:, 0], chosen])

    assert np.array_equal(filled(1), filled(1))
    assert not np.array_equal(filled(1), filled(2))


def test_the_archive_round_trips_and_goes_on_identically() -> None:
    archive = NoveltyArchive(capacity=10, seed=3)
    empty = NoveltyArchive.from_state_dict(
        10, 3, json.loads(json.dumps(archive.state_dict())), archive.array()
    )
    assert empty.behaviour_size is None and len(empty) == 0
    offer(archive, range(40))
    again = NoveltyArchive.from_state_dict(
        10, 3, json.loads(json.dumps(archive.state_dict())), archive.array()
    )
    for a in (archive, again):
        offer(a, range(40, 90))
        a.choose(5, 0.5)
    assert np.array_equal(again.array(), archive.array())
    assert again.state_dict() == archive.state_dict()
    with pytest.raises(ValueError, match="capacity 10, not 11"):
        NoveltyArchive.from_state_dict(11, 3, archive.state_dict(), archive.array())
    with pytest.raises(ValueError, match="archive array"):
        NoveltyArchive.from_state_dict(10, 3, archive.state_dict(), archive.array()[:-1])


# --- GA-NS -----------------------------------------------------------------------------------

GA = GAConfig(population_size=8, truncation=2, elite_candidates=2, elite_episodes=1, seed=4)
# The four best scorers behave identically; the four worst each go somewhere of their own.
SCORES = [10.0, 11.0, 12.0, 13.0, 1.0, 2.0, 3.0, 4.0]
BCS = np.array([[0, 0], [0, 0], [0, 0], [0, 0], [10, 0], [0, 20], [-30, 0], [0, -40]], np.float32)


def tell_offspring(algorithm: Algorithm, scores: list[float], bcs: np.ndarray) -> None:
    requests = algorithm.ask()
    returns = {r.key: [s] for r, s in zip(requests, scores, strict=True)}
    behaviours = {r.key: bcs[i : i + 1] for i, r in enumerate(requests)}
    assert algorithm.tell(returns, behaviours) is None


def tell_elite(algorithm: Algorithm, score: Callable[[EvaluationRequest], float]) -> Any:
    requests = algorithm.ask()
    returns = {r.key: [score(r)] * r.episodes for r in requests}
    behaviours = {r.key: np.zeros((r.episodes, 2), np.float32) for r in requests}
    return algorithm.tell(returns, behaviours)


def test_ga_ns_chooses_parents_by_novelty_and_the_elite_by_score() -> None:
    algorithm = NoveltyGA(GA, NoveltyConfig(k=3, archive_probability=1.0))
    population = list(algorithm.state.population)
    tell_offspring(algorithm, SCORES, BCS)
    # Parents: the two most novel, (0, -40) then (-30, 0), though they scored worst but one.
    assert algorithm.state.parents == [population[7], population[6]]
    # The GA on the same scores takes the best scorers; GA-NS's elite candidates are those too.
    ga = GeneticAlgorithm(GA)
    ga.tell({r.key: [s] for r, s in zip(ga.ask(), SCORES, strict=True)})
    assert ga.state.parents == [population[3], population[2]]
    assert [r.genome for r in algorithm.ask()] == [population[3], population[2]]
    summary = tell_elite(algorithm, lambda r: 50.0 if r.genome == population[2] else 40.0)
    assert summary.elite == population[2] and summary.elite_score == 50.0
    children = [g for g in algorithm.state.population if g != summary.elite]
    assert {Genome(g.seeds[:-1]) for g in children} <= {population[7], population[6]}
    metrics = summary.metrics()
    assert metrics["archive_size"] == metrics["archive_added"] == 8
    # Novelty with k=3: 0 for each of the four alike, then 10, 20, 30 and 40.
    assert (metrics["novelty_mean"], metrics["novelty_max"]) == (12.5, 40.0)


def test_ga_ns_never_makes_a_failed_evaluation_a_parent_however_novel() -> None:
    algorithm = NoveltyGA(GA, NoveltyConfig(k=3))
    population = list(algorithm.state.population)
    scores = list(SCORES)
    scores[7] = math.nan  # its BC, the most novel, came back anyway
    bcs = BCS.copy()
    bcs[6] = np.nan  # its score came back, its BC did not
    tell_offspring(algorithm, scores, bcs)
    assert algorithm.state.parents == [population[5], population[4]]


@pytest.mark.parametrize(("probability", "archived"), [(0.0, 0), (1.0, 8)])
def test_ga_ns_archives_each_behaviour_with_the_stated_probability(probability, archived) -> None:
    algorithm = NoveltyGA(GA, NoveltyConfig(k=3, archive_probability=probability))
    tell_offspring(algorithm, SCORES, BCS)
    assert len(algorithm.archive) == 0  # the archive changes when the generation ends
    tell_elite(algorithm, lambda r: 1.0)
    assert len(algorithm.archive) == archived
    halfway = NoveltyGA(GA, NoveltyConfig(k=3, archive_probability=0.5))
    for _ in range(20):
        tell_offspring(halfway, SCORES, BCS)
        tell_elite(halfway, lambda r: 1.0)
    assert 50 < len(halfway.archive) < 110 and halfway.archive.offered == len(halfway.archive)


# --- NS-ES and NSR-ES ------------------------------------------------------------------------


def ns_es(
    table: np.ndarray,
    cls: type[NoveltySearchES] = NoveltySearchES,
    seed: int = 0,
    members: int = 3,
    k: int = 2,
) -> NoveltySearchES:
    thetas = list(np.random.default_rng(100).normal(size=(members, PARAMS)).astype(np.float32))
    config = ESConfig(pairs=3, eval_episodes=2, seed=seed)
    return cls(config, NoveltyConfig(k=k, meta_population=members), table, thetas)


def play(
    algorithm: NoveltySearchES,
    theta_bc: np.ndarray,
    perturbation_bcs: np.ndarray | None = None,
    scores: list[float] | None = None,
) -> GenerationSummary:
    """One generation: theta plays `theta_bc`, perturbation i plays row i (default: made up)."""
    requests = algorithm.ask()
    if perturbation_bcs is None:
        perturbation_bcs = np.random.default_rng(algorithm.generation).normal(
            size=(len(requests) - 1, len(theta_bc))
        )
    scores = scores or [0.0] * (len(requests) - 1)
    returns = {r.key: [s] for r, s in zip(requests[:-1], scores, strict=True)}
    returns[requests[-1].key] = [0.0] * requests[-1].episodes
    behaviours = {r.key: perturbation_bcs[i : i + 1].astype(np.float32)
                  for i, r in enumerate(requests[:-1])}  # fmt: skip
    behaviours[requests[-1].key] = np.tile(theta_bc, (requests[-1].episodes, 1)).astype(np.float32)
    return algorithm.tell(returns, behaviours)


def test_member_probabilities_follow_novelty() -> None:
    assert member_probabilities([1, 1, 5]).tolist() == pytest.approx([1 / 7, 1 / 7, 5 / 7])
    assert member_probabilities([0, 0]).tolist() == [0.5, 0.5]
    assert member_probabilities([math.nan, 3]).tolist() == [0.0, 1.0]


def test_ns_es_visits_each_member_once_then_picks_by_novelty(table) -> None:
    line = {0: [0.0], 1: [2.0], 2: [12.0]}  # novelty with k=2: (0 + 2)/2, (0 + 2)/2, (0 + 10)/2
    picked = np.zeros(3)
    for seed in range(300):
        algorithm = ns_es(table, seed=seed)
        for member in range(3):
            assert algorithm.member == member
            theta = algorithm.parameters()
            assert theta.version == member
            assert np.array_equal(theta.theta, algorithm.state.thetas[member])
            play(algorithm, np.array(line[member]))
        picked[algorithm.member] += 1
    assert picked / 300 == pytest.approx([1 / 7, 1 / 7, 5 / 7], abs=0.1)


def test_a_member_whose_behaviour_is_unknown_is_visited_again_first(table) -> None:
    algorithm = ns_es(table)
    play(algorithm, np.array([np.nan]))  # member 0's evaluation left no usable BC
    assert algorithm.member == 0 and len(algorithm.state.archive) == 0
    play(algorithm, np.array([1.0]))
    assert algorithm.member == 1 and len(algorithm.state.archive) == 1


def test_ns_es_steps_up_the_novelty_of_its_perturbations(table) -> None:
    algorithm = ns_es(table)
    theta = algorithm.state.thetas[0].copy()
    indices = list(algorithm.state.noise_indices)
    bcs = np.array([[1.0], [-2.0], [5.0], [0.5], [-7.0], [3.0]])
    summary = play(algorithm, np.array([0.0]), bcs)
    # The archive holds theta's BC only: novelty is the distance to 0, ranked and paired.
    shaped = centered_ranks(np.abs(bcs[:, 0])).reshape(-1, 2)
    grad = gradient_estimate(table, indices, shaped[:, 0] - shaped[:, 1], PARAMS, 0.1)
    zeros = np.zeros(PARAMS, np.float32)
    expected, _, _ = adam_step(algorithm.config, theta, zeros, zeros, 1, grad)
    assert np.array_equal(algorithm.state.thetas[0], expected)
    others = zip(algorithm.state.thetas[1:], ns_es(table).state.thetas[1:], strict=True)
    assert all(np.array_equal(a, b) for a, b in others)
    assert summary.metrics()["novelty_max"] == pytest.approx(7.0)
    assert summary.metrics()["member"] == 0
    assert summary.elite is not None and np.array_equal(summary.elite.theta, theta)


def test_ns_es_ignores_the_reward_and_nsr_es_follows_it_too(table) -> None:
    bcs = np.array([[1.0], [-2.0], [5.0], [0.5], [-7.0], [3.0]])
    # Rewards ranked against the novelty: the least novel perturbations score best.
    rewards, flat = [6.0, 5.0, 2.0, 4.0, 1.0, 3.0], [1.0] * 6
    after: dict[str, list[np.ndarray]] = {}
    for cls in (NoveltySearchES, NoveltyRewardSearchES):
        for name, scores in (("rewards", rewards), ("flat", flat)):
            algorithm = ns_es(table, cls)
            play(algorithm, np.array([0.0]), bcs, scores)
            after[f"{cls.name} {name}"] = algorithm.state.thetas[0]
    assert np.array_equal(after["ns-es rewards"], after["ns-es flat"])
    assert not np.array_equal(after["nsr-es rewards"], after["nsr-es flat"])
    assert not np.array_equal(after["nsr-es rewards"], after["ns-es rewards"])


def test_ns_es_state_names_its_variant(table) -> None:
    algorithm = ns_es(table)
    settings = (algorithm.config, algorithm.novelty_config, table, algorithm.state_dict())
    with pytest.raises(ValueError, match="'ns-es'"):
        NoveltyRewardSearchES.from_state_dict(*settings, algorithm.arrays())
    with pytest.raises(ValueError, match="NS-ES arrays"):
        NoveltySearchES.from_state_dict(*settings, algorithm.arrays()[:-1])


# --- resuming --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ga-ns", "ns-es", "nsr-es"])
def test_a_run_resumed_mid_way_goes_on_exactly_as_the_uninterrupted_one(name, noise_cache) -> None:
    settings = {"ga-ns": {"population_size": 10, "truncation": 3, "elite_candidates": 2,
                          "elite_episodes": 2, "archive_probability": 0.6},
                "ns-es": {"pairs": 3, "eval_episodes": 2, "meta_population": 3},
                "nsr-es": {"pairs": 3, "eval_episodes": 2, "meta_population": 3}}  # fmt: skip
    config = preset(inspect_env_id("CartPole-v1"), algorithm=name, seed=5, hidden_sizes=(4,),
                    noise_table_size=2**16, k=3, archive_capacity=6, **settings[name])  # fmt: skip
    rng = np.random.default_rng(0)
    made_up = [(rng.normal(size=64), rng.normal(size=(64, 3))) for _ in range(200)]

    def step(algorithm: Algorithm, phase: int) -> GenerationSummary | None:
        requests = algorithm.ask()
        returns, bcs = made_up[phase]
        return algorithm.tell(
            {r.key: returns[: r.episodes].tolist() for r in requests},
            {r.key: bcs[: r.episodes].astype(np.float32) for r in requests},
        )

    def summaries(algorithm: Algorithm, phases: range) -> list[str]:
        return [repr(step(algorithm, phase)) for phase in phases]

    whole = create_algorithm(config)
    first = summaries(whole, range(15))
    document = json.loads(json.dumps(whole.state_dict(), allow_nan=False))
    resumed = restore_algorithm(config, document, whole.arrays().copy())
    assert document["archive"]["offered"] > 6  # the archive (capacity 6) has been full a while
    assert summaries(resumed, range(15, 40)) == summaries(whole, range(15, 40))
    assert json.dumps(resumed.state_dict()) == json.dumps(whole.state_dict())
    assert np.array_equal(resumed.arrays(), whole.arrays())
    assert first != summaries(create_algorithm(config), range(1, 16))  # the made-up answers matter


def test_ga_ns_keeps_the_previous_parents_when_no_behaviour_is_usable() -> None:
    algorithm = NoveltyGA(GA, NoveltyConfig(k=3))
    population = list(algorithm.state.population)
    tell_offspring(algorithm, SCORES, BCS)
    tell_elite(algorithm, lambda r: 1.0)
    assert algorithm.state.parents == [population[7], population[6]]
    # Every score came back, no BC did: the scores alone choose no parent.
    tell_offspring(algorithm, SCORES, np.full_like(BCS, np.nan))
    assert algorithm.state.parents == [population[7], population[6]]
