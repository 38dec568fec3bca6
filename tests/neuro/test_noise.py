"""Tests for the shared noise table."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os

import numpy as np
import pytest

from neuro import noise
from neuro.noise import NoiseTableSpec, generate_into, load_noise_table, noise_offset

SMALL = NoiseTableSpec(seed=123, size=2**22)

# Pins the frozen table algorithm: a different digest means every saved genome decodes
# to different parameters.
GOLDEN_2_20_SHA256 = "48dab7a61f2898574dcb46395bf5719d2f5e0a694ea9111bcfb11382fd60eba3"


@pytest.fixture(autouse=True)
def _fresh_memo():
    noise._memo.clear()
    yield
    noise._memo.clear()


def _table_path(spec: NoiseTableSpec, cache_dir) -> str:
    return os.path.join(cache_dir, spec.filename)


def test_spec_defaults_and_validation():
    assert NoiseTableSpec() == NoiseTableSpec(seed=123, size=250_000_000)
    with pytest.raises(ValueError, match="-1"):
        NoiseTableSpec(seed=-1)
    with pytest.raises(ValueError, match=str(2**32)):
        NoiseTableSpec(seed=2**32)
    with pytest.raises(ValueError, match="0"):
        NoiseTableSpec(size=0)


def test_table_matches_legacy_randomstate(tmp_path):
    table = load_noise_table(SMALL, tmp_path)
    assert table.dtype == np.float32 and table.shape == (SMALL.size,)
    k = 100_000
    expected = np.random.RandomState(123).randn(k).astype(np.float32)
    np.testing.assert_array_equal(table[:k], expected)


def test_golden_digest(tmp_path):
    table = load_noise_table(NoiseTableSpec(seed=123, size=2**20), tmp_path)
    assert hashlib.sha256(table.tobytes()).hexdigest() == GOLDEN_2_20_SHA256


def test_chunked_generation_equals_one_shot():
    spec = NoiseTableSpec(seed=7, size=10_007)
    out = np.empty(spec.size, dtype=np.float32)
    generate_into(spec, out, chunk=1000)
    one_shot = np.random.RandomState(7).randn(spec.size).astype(np.float32)
    np.testing.assert_array_equal(out, one_shot)


def test_file_layout_is_raw_little_endian(tmp_path):
    spec = NoiseTableSpec(seed=5, size=1000)
    table = load_noise_table(spec, tmp_path)
    raw = np.fromfile(_table_path(spec, tmp_path), dtype="<f4")
    assert os.path.getsize(_table_path(spec, tmp_path)) == 4 * spec.size
    np.testing.assert_array_equal(raw, table)


def test_table_is_read_only(tmp_path):
    table = load_noise_table(NoiseTableSpec(seed=1, size=1000), tmp_path)
    assert not table.flags.writeable
    with pytest.raises(ValueError):
        table[0] = 1.0


def test_second_load_reuses_file_and_memo(tmp_path, caplog):
    spec = NoiseTableSpec(seed=3, size=50_000)
    first = load_noise_table(spec, tmp_path)
    assert load_noise_table(spec, tmp_path) is first
    mtime = os.stat(_table_path(spec, tmp_path)).st_mtime_ns
    noise._memo.clear()
    with caplog.at_level(logging.INFO, logger=noise.__name__):
        again = load_noise_table(spec, tmp_path)
    assert again is not first
    np.testing.assert_array_equal(again, first)
    assert os.stat(_table_path(spec, tmp_path)).st_mtime_ns == mtime
    assert not any("building" in r.message for r in caplog.records)


def test_env_var_sets_default_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURO_CACHE_DIR", str(tmp_path / "env"))
    spec = NoiseTableSpec(seed=2, size=100)
    load_noise_table(spec)
    assert os.path.exists(_table_path(spec, tmp_path / "env"))


def test_wrong_size_file_is_regenerated(tmp_path, caplog):
    spec = NoiseTableSpec(seed=4, size=10_000)
    with open(_table_path(spec, tmp_path), "wb") as f:
        f.write(b"\0" * 123)
    with caplog.at_level(logging.INFO, logger=noise.__name__):
        table = load_noise_table(spec, tmp_path)
    assert os.path.getsize(_table_path(spec, tmp_path)) == 4 * spec.size
    np.testing.assert_array_equal(table, np.random.RandomState(4).randn(10_000).astype(np.float32))
    assert any(r.levelno == logging.WARNING for r in caplog.records)
    assert any("building noise table" in r.message for r in caplog.records)


def test_concurrent_processes_build_one_valid_file(tmp_path):
    spec = SMALL
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=load_noise_table, args=(spec, str(tmp_path))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    files = sorted(os.listdir(tmp_path))
    assert files == [spec.filename, spec.filename + ".lock"]
    table = load_noise_table(spec, tmp_path)
    expected = np.random.RandomState(123).randn(spec.size).astype(np.float32)
    np.testing.assert_array_equal(table, expected)


def test_noise_offset_bounds():
    assert noise_offset(0, 10, 100) == 0
    assert noise_offset(90, 10, 100) == 90
    assert noise_offset(91, 10, 100) == 0
    assert noise_offset(2**32 - 1, 10, 100) == (2**32 - 1) % 91
    assert noise_offset(12345, 100, 100) == 0
    for seed in range(0, 2**32, 2**28 + 11):
        off = noise_offset(seed, 1000, 5000)
        assert off >= 0 and off + 1000 <= 5000


def test_noise_offset_error_names_both_numbers():
    with pytest.raises(ValueError, match=r"101.*100"):
        noise_offset(0, 101, 100)
