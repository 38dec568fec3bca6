"""Decoded parents are shared by a host's workers: decoded once, mapped by all, bit-identical."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from neuro.decode import GenomeDecoder, decode_genome
from neuro.noise import NoiseTableSpec, load_noise_table
from neuro.shared_store import SharedVectorStore
from worker.inference.policy import build_policy

SIGMA = 0.01


@pytest.fixture
def setup(tmp_path: Path):
    table = load_noise_table(NoiseTableSpec(seed=123, size=2**16), tmp_path / "noise")
    policy = build_policy("mlp", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    return table, policy.init_scale(), tmp_path / "shared"


def decoder(table, scale, store_dir, budget=2**30):
    store = SharedVectorStore(store_dir, budget)
    return GenomeDecoder(table, scale, SIGMA, shared=store, shared_namespace="mlp-cartpole")


def test_a_parent_decoded_by_one_worker_is_mapped_by_another(setup):
    table, scale, store_dir = setup
    first, second = decoder(table, scale, store_dir), decoder(table, scale, store_dir)
    parent = [3, 4, 5]
    first.decode([*parent, 6])  # decodes the parent cold and shares it
    assert first.stats.cold == 1 and len(list(store_dir.glob("*.f32"))) == 1
    child = second.decode([*parent, 7])
    assert second.stats.cold == 0 and second.stats.shared_hits == 1
    assert second.stats.parent_hits == 1
    assert child.tobytes() == decode_genome(table, scale, SIGMA, [*parent, 7]).tobytes()
    shared_parent = second._cache[tuple(parent)]
    assert isinstance(shared_parent, np.memmap) and not shared_parent.flags.writeable


def test_other_namespaces_do_not_collide(setup):
    table, scale, store_dir = setup
    decoder(table, scale, store_dir).decode([3, 4, 6])
    other = GenomeDecoder(table, scale, 0.5, shared=SharedVectorStore(store_dir),
                          shared_namespace="another-sigma")  # fmt: skip
    theta = other.decode([3, 4, 7])
    assert other.stats.shared_hits == 0
    assert theta.tobytes() == decode_genome(table, scale, 0.5, [3, 4, 7]).tobytes()


def test_the_hosts_budget_evicts_least_recently_used(setup):
    table, scale, store_dir = setup
    nbytes = scale.nbytes
    worker = decoder(table, scale, store_dir, budget=2 * nbytes)
    for parent in range(5):
        worker.decode([parent, 100, 200])  # each shares its parent [parent, 100]
    files = list(store_dir.glob("*.f32"))
    assert len(files) == 2
    assert sum(f.stat().st_size for f in files) <= 2 * nbytes


def _decode_in_process(args) -> bytes:
    noise_dir, store_dir, seeds = args
    table = load_noise_table(NoiseTableSpec(seed=123, size=2**16), noise_dir)
    policy = build_policy("mlp", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    worker = decoder(table, policy.init_scale(), store_dir)
    return worker.decode(seeds).tobytes()


@pytest.mark.slow
def test_processes_racing_on_one_parent_all_get_the_same_bits(setup, tmp_path):
    table, scale, store_dir = setup
    jobs = [(tmp_path / "noise", store_dir, [9, 8, 7, 100 + i]) for i in range(6)]
    with mp.get_context("spawn").Pool(3) as pool:
        results = pool.map(_decode_in_process, jobs)
    for (_, _, seeds), got in zip(jobs, results, strict=True):
        assert got == decode_genome(table, scale, SIGMA, seeds).tobytes()
    assert len(list(store_dir.glob("*.f32"))) == 1
    assert not list(store_dir.glob("*.tmp"))


def test_a_full_store_keeps_the_vector_private_and_the_decode_exact(setup, monkeypatch, caplog):
    import errno
    import tempfile

    table, scale, store_dir = setup
    reference = decode_genome(table, scale, SIGMA, [3, 4, 5, 6])
    full_decoder = decoder(table, scale, store_dir)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", no_space)
    decoded = full_decoder.decode([3, 4, 5, 6])
    assert np.array_equal(decoded, reference)
    assert list(store_dir.glob("*.f32")) == [] and list(store_dir.glob("*.tmp")) == []
    assert "No space left on device; keeping this vector private" in caplog.text
