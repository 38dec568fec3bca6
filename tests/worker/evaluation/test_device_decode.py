"""TorchDecoder: genomes decoded on a torch device, bit for bit what the CPU decoder gives."""

from __future__ import annotations

import hashlib

import gymnasium as gym
import numpy as np
import pytest
import torch

from neuro.decode import DecodeStats, decode_genome
from neuro.genome import Genome
from neuro.noise import NoiseTableSpec, load_noise_table
from tests.support.goldens import GOLDEN_MLP_CARTPOLE, GOLDEN_NATURE_18, SEEDS, SIGMA
from worker.evaluation.device_decode import TorchDecoder, decode_genome_torch, device_table
from worker.inference.policy import build_policy

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
LENGTHS = (1, 2, 5, 40)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    # As tests/neuro/test_decode.py: 2**22 values, enough for the deepga network's 4,052,658.
    return load_noise_table(NoiseTableSpec(seed=123, size=2**22), tmp_path_factory.mktemp("noise"))


@pytest.fixture(scope="module")
def scales() -> dict[str, np.ndarray]:
    return {
        "mlp": build_policy("mlp", CARTPOLE_OBS, gym.spaces.Discrete(2)).init_scale(),
        "nature": build_policy("nature", ATARI_OBS, gym.spaces.Discrete(18)).init_scale(),
        "deepga": build_policy("deepga", ATARI_OBS, gym.spaces.Discrete(18)).init_scale(),
    }


def sha(theta: np.ndarray | torch.Tensor) -> str:
    if isinstance(theta, torch.Tensor):
        assert theta.dtype == torch.float32 and theta.dim() == 1
        theta = theta.cpu().numpy()
    assert theta.dtype == np.float32
    return hashlib.sha256(theta.tobytes()).hexdigest()


def genome(length: int, seed: int) -> list[int]:
    return [int(s) for s in np.random.default_rng(seed).integers(0, 2**32, length)]


def test_golden_digests_of_the_cpu_decoder(table: np.ndarray, scales: dict) -> None:
    assert sha(TorchDecoder(table, scales["mlp"], SIGMA).decode(SEEDS)) == GOLDEN_MLP_CARTPOLE
    nature = decode_genome_torch(table, scales["nature"], SIGMA, SEEDS)
    assert sha(nature) == GOLDEN_NATURE_18


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("arch", ["mlp", "nature", "deepga"])
def test_bit_identical_to_the_cpu_decoder(
    table: np.ndarray, scales: dict, arch: str, length: int
) -> None:
    seeds = genome(length, seed=length)
    expected = sha(decode_genome(table, scales[arch], SIGMA, seeds))
    cached = TorchDecoder(table, scales[arch], SIGMA)
    assert sha(cached.decode(seeds)) == expected
    assert sha(cached.decode(seeds)) == expected  # the cached vector itself
    assert sha(decode_genome_torch(table, scales[arch], SIGMA, seeds)) == expected


@pytest.mark.parametrize("sigma", [0.0, 0.005, 1 / 3, 2.5])
def test_any_mutation_power_rounds_as_on_the_cpu(
    table: np.ndarray, scales: dict, sigma: float
) -> None:
    # 1/3 and 0.005 are not float32 values: both sides must round them to float32 alike.
    seeds = genome(6, seed=99)
    expected = sha(decode_genome(table, scales["mlp"], sigma, seeds))
    assert sha(TorchDecoder(table, scales["mlp"], sigma).decode(seeds)) == expected


def test_long_genome(table: np.ndarray, scales: dict) -> None:
    seeds = genome(1000, seed=5)
    expected = sha(decode_genome(table, scales["mlp"], SIGMA, seeds))
    assert sha(decode_genome_torch(table, scales["mlp"], SIGMA, seeds)) == expected


@pytest.mark.parametrize("arch", ["mlp", "nature"])
def test_the_parent_path_is_bit_identical_to_cold(
    table: np.ndarray, scales: dict, arch: str
) -> None:
    steps = 20 if arch == "mlp" else 6
    decoder = TorchDecoder(table, scales[arch], SIGMA)
    uncached = TorchDecoder(table, scales[arch], SIGMA, cache_bytes=0)
    rng = np.random.default_rng(0)
    seeds = [int(rng.integers(2**32))]
    decoder.decode(seeds)
    for _ in range(steps):
        seeds.append(int(rng.integers(2**32)))
        warm = decoder.decode(seeds)
        assert sha(warm) == sha(uncached.decode(seeds))
        assert sha(warm) == sha(decode_genome(table, scales[arch], SIGMA, seeds))
    assert decoder.stats == DecodeStats(parent_hits=steps, cold=1)
    assert decoder.decode(seeds) is warm
    assert uncached.stats == DecodeStats(cold=steps) and len(uncached) == 0
    assert uncached.cached_bytes == 0


def test_a_miss_resumes_from_the_nearest_cached_ancestor(table: np.ndarray, scales: dict) -> None:
    scale = scales["mlp"]
    decoder = TorchDecoder(table, scale, SIGMA)
    decoder.decode([11, 12])
    seeds = [11, 12, 13, 14, 15]
    assert sha(decoder.decode(seeds)) == sha(decode_genome(table, scale, SIGMA, seeds))
    assert decoder.stats == DecodeStats(ancestor_hits=1, cold=1)
    assert seeds[:-1] in decoder  # kept on the way: its other children cost one mutation
    sibling = [*seeds[:-1], 99]
    assert sha(decoder.decode(sibling)) == sha(decode_genome(table, scale, SIGMA, sibling))
    assert decoder.stats.parent_hits == 1


def test_a_stream_of_children_does_not_evict_their_parents(table: np.ndarray, scales: dict) -> None:
    scale = scales["mlp"]
    parents = [[p, 1000 + p] for p in range(5)]
    decoder = TorchDecoder(table, scale, SIGMA, cache_bytes=8 * scale.nbytes, max_children=3)
    for parent in parents:
        decoder.decode([*parent, 1])
    decoder.stats = DecodeStats()
    rng = np.random.default_rng(0)
    for child_seed in range(100):
        child = [*parents[int(rng.integers(len(parents)))], 5000 + child_seed]
        assert sha(decoder.decode(child)) == sha(decode_genome(table, scale, SIGMA, child))
    assert all(p in decoder for p in parents)
    assert decoder.stats == DecodeStats(parent_hits=100)
    assert len(decoder) == 5 + 3 and decoder.cached_bytes == 8 * scale.nbytes


def test_eviction_respects_cache_bytes_least_recently_used_first(
    table: np.ndarray, scales: dict
) -> None:
    scale = scales["mlp"]
    decoder = TorchDecoder(table, scale, SIGMA, cache_bytes=3 * scale.nbytes)
    for seed in range(3):
        decoder.decode([seed])
    decoder.decode([1])  # a hit moves [1] to the recently-used end
    decoder.decode([2])
    decoder.decode([3])  # room is made at the cold end: [0] goes
    assert len(decoder) == 3 and [0] not in decoder
    assert [1] in decoder and [2] in decoder and [3] in decoder
    assert decoder.stats == DecodeStats(hits=2, cold=4)
    assert decoder.cached_bytes <= decoder.cache_bytes


def test_a_vector_over_the_budget_is_not_cached(table: np.ndarray, scales: dict) -> None:
    decoder = TorchDecoder(table, scales["mlp"], SIGMA, cache_bytes=scales["mlp"].nbytes - 1)
    assert sha(decoder.decode([7, 8])) == sha(decode_genome(table, scales["mlp"], SIGMA, [7, 8]))
    assert len(decoder) == 0 and decoder.cached_bytes == 0


def test_genome_objects_and_a_shared_table(table: np.ndarray, scales: dict) -> None:
    shared = device_table(table, "cpu")
    assert shared.data_ptr() == table.ctypes.data  # the CPU shares the host table
    first = TorchDecoder(shared, scales["mlp"], SIGMA)
    second = TorchDecoder(shared, scales["mlp"], 0.01)
    assert first.table is shared and second.table is shared
    g = Genome((1, 2, 3))
    assert sha(first.decode(g)) == sha(decode_genome(table, scales["mlp"], SIGMA, g.seeds))
    assert sha(second.decode(g)) == sha(decode_genome(table, scales["mlp"], 0.01, g.seeds))
    assert g in first and [1, 2, 3] in first


def test_validation_errors(table: np.ndarray, scales: dict) -> None:
    scale = scales["mlp"]
    decoder = TorchDecoder(table, scale, SIGMA)
    with pytest.raises(ValueError, match=r"\[\]"):
        decoder.decode([])
    with pytest.raises(ValueError, match=str(2**32)):
        decoder.decode([1, 2**32])
    with pytest.raises(ValueError, match="-3"):
        decoder.decode([-3])
    for bad in (float("nan"), float("inf"), -0.1):
        with pytest.raises(ValueError, match=str(bad)):
            TorchDecoder(table, scale, bad)
    with pytest.raises(ValueError, match="float64"):
        TorchDecoder(table, scale.astype(np.float64), SIGMA)
    with pytest.raises(ValueError, match="float64"):
        TorchDecoder(table.astype(np.float64), scale, SIGMA)
    with pytest.raises(ValueError, match=str(table.size + 1)):
        TorchDecoder(table, np.ones(table.size + 1, np.float32), SIGMA)
    with pytest.raises(ValueError, match="-1"):
        TorchDecoder(table, scale, SIGMA, cache_bytes=-1)


@pytest.mark.parametrize("arch", ["mlp", "nature", "deepga"])
def test_bit_identical_on_cuda(table: np.ndarray, scales: dict, arch: str) -> None:
    on_device = device_table(table, "cuda")
    decoder = TorchDecoder(on_device, scales[arch], SIGMA)
    uncached = TorchDecoder(on_device, scales[arch], SIGMA, cache_bytes=0)
    assert decoder.device.type == "cuda"
    seeds = genome(1, seed=1)
    for length in range(1, 9):
        seeds = [*seeds, *genome(1, seed=100 + length)] if length > 1 else seeds
        expected = sha(decode_genome(table, scales[arch], SIGMA, seeds))
        theta = decoder.decode(seeds)
        assert theta.device.type == "cuda"
        assert sha(theta) == expected
        assert sha(uncached.decode(seeds)) == expected
    long = genome(40, seed=40)
    assert sha(uncached.decode(long)) == sha(decode_genome(table, scales[arch], SIGMA, long))
