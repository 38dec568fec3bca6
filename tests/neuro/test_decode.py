"""Tests for genome decoding and the parent cache."""

from __future__ import annotations

import hashlib

import gymnasium as gym
import numpy as np
import pytest

from neuro.decode import DecodeStats, GenomeDecoder, decode_genome
from neuro.noise import NoiseTableSpec, load_noise_table, noise_offset
from tests.support.goldens import GOLDEN_MLP_CARTPOLE, GOLDEN_NATURE_18, SEEDS, SIGMA
from worker.inference.policy import build_policy


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> np.ndarray:
    return load_noise_table(NoiseTableSpec(seed=123, size=2**22), tmp_path_factory.mktemp("noise"))


@pytest.fixture(scope="module")
def mlp_scale() -> np.ndarray:
    obs = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    return build_policy("mlp", obs, gym.spaces.Discrete(2)).init_scale()


def _sha(theta: np.ndarray) -> str:
    return hashlib.sha256(theta.tobytes()).hexdigest()


def test_golden_mlp_cartpole(table, mlp_scale):
    theta = GenomeDecoder(table, mlp_scale, SIGMA).decode(SEEDS)
    assert theta.dtype == np.float32 and theta.shape == (4610,)
    assert _sha(theta) == GOLDEN_MLP_CARTPOLE


def test_golden_nature(table):
    obs = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    scale = build_policy("nature", obs, gym.spaces.Discrete(18)).init_scale()
    assert _sha(decode_genome(table, scale, SIGMA, SEEDS)) == GOLDEN_NATURE_18


def test_decode_matches_definition(table, mlp_scale):
    n = mlp_scale.size
    offsets = [noise_offset(s, n, table.size) for s in SEEDS]
    expected = table[offsets[0] : offsets[0] + n] * mlp_scale
    for o in offsets[1:]:
        expected = expected + np.float32(SIGMA) * table[o : o + n]
    assert expected.dtype == np.float32
    assert decode_genome(table, mlp_scale, SIGMA, SEEDS).tobytes() == expected.tobytes()


def test_parent_path_is_bit_identical_to_cold(table, mlp_scale):
    decoder = GenomeDecoder(table, mlp_scale, SIGMA)
    rng = np.random.default_rng(0)
    genome = [int(rng.integers(2**32))]
    decoder.decode(genome)
    for _ in range(20):
        genome.append(int(rng.integers(2**32)))
        warm = decoder.decode(genome)
        cold = decode_genome(table, mlp_scale, SIGMA, genome)
        assert warm.tobytes() == cold.tobytes()
    assert decoder.stats.parent_hits == 20
    assert decoder.stats.cold == 1
    assert decoder.decode(genome) is warm
    assert decoder.stats.hits == 1


def test_decoded_vectors_are_read_only(table, mlp_scale):
    decoder = GenomeDecoder(table, mlp_scale, SIGMA)
    parent = decoder.decode(SEEDS[:1])
    child = decoder.decode(SEEDS[:2])
    assert not parent.flags.writeable and not child.flags.writeable
    assert not np.shares_memory(parent, child)


def test_eviction_respects_cache_bytes_least_recently_used_first(table, mlp_scale):
    entry = mlp_scale.nbytes
    decoder = GenomeDecoder(table, mlp_scale, SIGMA, cache_bytes=3 * entry)
    for seed in range(3):
        decoder.decode([seed])
    decoder.decode([1])  # a hit moves [1] to the recently-used end
    decoder.decode([2])
    decoder.decode([3])  # room is made at the cold end: [0] goes
    assert len(decoder) == 3 and [0] not in decoder
    assert [1] in decoder and [2] in decoder and [3] in decoder
    assert decoder.stats.cold == 4 and decoder.stats.hits == 2


def test_a_stream_of_children_does_not_evict_their_parents(table, mlp_scale):
    parents = [[p, 1000 + p] for p in range(5)]
    decoder = GenomeDecoder(table, mlp_scale, SIGMA, cache_bytes=8 * mlp_scale.nbytes)
    for parent in parents:  # warm-up: each parent enters as the ancestor of a child
        decoder.decode([*parent, 1])
    decoder.stats = DecodeStats()
    rng = np.random.default_rng(0)
    for child_seed in range(200):
        parent = parents[int(rng.integers(len(parents)))]
        child = decoder.decode([*parent, 5000 + child_seed])
        assert (
            child.tobytes()
            == decode_genome(table, mlp_scale, SIGMA, [*parent, 5000 + child_seed]).tobytes()
        )
    assert all(p in decoder for p in parents)
    assert decoder.stats == DecodeStats(parent_hits=200)


def test_a_miss_resumes_from_the_nearest_cached_ancestor(table, mlp_scale):
    decoder = GenomeDecoder(table, mlp_scale, SIGMA)
    decoder.decode([11, 12])
    genome = [11, 12, 13, 14, 15]
    theta = decoder.decode(genome)
    assert theta.tobytes() == decode_genome(table, mlp_scale, SIGMA, genome).tobytes()
    assert decoder.stats.ancestor_hits == 1 and decoder.stats.cold == 1
    # The parent was kept on the way, so its other children cost one mutation.
    assert genome[:-1] in decoder
    decoder.decode([*genome[:-1], 99])
    assert decoder.stats.parent_hits == 1


def test_cache_keeps_at_least_one_entry(table, mlp_scale):
    decoder = GenomeDecoder(table, mlp_scale, SIGMA, cache_bytes=0)
    decoder.decode([7])
    decoder.decode([7, 8])
    assert len(decoder) == 1 and [7, 8] in decoder
    assert decoder.stats.parent_hits == 1


def test_validation_errors(table, mlp_scale):
    decoder = GenomeDecoder(table, mlp_scale, SIGMA)
    with pytest.raises(ValueError, match=r"\[\]"):
        decoder.decode([])
    with pytest.raises(ValueError, match=str(2**32)):
        decoder.decode([1, 2**32])
    with pytest.raises(ValueError, match="-3"):
        decoder.decode([-3])
    for bad in (float("nan"), float("inf"), -0.1):
        with pytest.raises(ValueError, match=str(bad)):
            GenomeDecoder(table, mlp_scale, bad)
        with pytest.raises(ValueError, match=str(bad)):
            decode_genome(table, mlp_scale, bad, [1])
    with pytest.raises(ValueError, match="float64"):
        decode_genome(table, mlp_scale.astype(np.float64), SIGMA, [1])
    with pytest.raises(ValueError, match=str(table.size + 1)):
        decode_genome(table, np.ones(table.size + 1, np.float32), SIGMA, [1])


def test_zero_mutation_power_keeps_init(table, mlp_scale):
    base = decode_genome(table, mlp_scale, 0.0, [5])
    # Compared by value: adding +0.0 turns the -0.0 biases into +0.0.
    np.testing.assert_array_equal(decode_genome(table, mlp_scale, 0.0, [5, 6, 7]), base)


def test_evicted_memory_is_reused_only_when_no_caller_holds_it(table, mlp_scale):
    decoder = GenomeDecoder(table, mlp_scale, SIGMA, cache_bytes=2 * mlp_scale.nbytes)
    held = decoder.decode([1])  # a caller keeps this one
    kept = held.copy()
    for seed in range(2, 12):
        child = decoder.decode([1, seed])
        assert child.tobytes() == decode_genome(table, mlp_scale, SIGMA, [1, seed]).tobytes()
    assert held.tobytes() == kept.tobytes()  # never recycled under the caller's feet
    assert not held.flags.writeable


def test_only_the_last_few_children_are_kept(table, mlp_scale):
    decoder = GenomeDecoder(table, mlp_scale, SIGMA, max_children=3)
    decoder.decode([1])
    for seed in range(2, 22):
        child = decoder.decode([1, seed])
        assert child.tobytes() == decode_genome(table, mlp_scale, SIGMA, [1, seed]).tobytes()
    assert len(decoder) == 1 + 3 and [1] in decoder and [1, 21] in decoder and [1, 2] not in decoder
