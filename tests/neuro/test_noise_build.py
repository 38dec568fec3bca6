"""Building the noise table cache: a full disk is an error, not a SIGBUS; the cache is bounded."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from neuro import noise
from neuro.noise import NoiseTableSpec, load_noise_table
from tests.support.processes import REPO as ROOT

BIG = NoiseTableSpec(seed=11, size=2**20)  # 4 MiB: more than the 1 MiB the tests leave room for


@pytest.fixture(autouse=True)
def _fresh_memo() -> Iterator[None]:
    noise._memo.clear()
    yield
    noise._memo.clear()


def _build_in_child(cache_dir: Path, spec: NoiseTableSpec, file_size_limit: int | None = None):
    """Builds `spec` in a fresh interpreter; RLIMIT_FSIZE makes writes past it fail (EFBIG)."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from neuro.noise import NoiseTableSpec, load_noise_table
        limit = {file_size_limit!r}
        if limit is not None:
            # Ignored, SIGXFSZ turns a write past the limit into an EFBIG OSError.
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        load_noise_table(NoiseTableSpec({spec.seed}, {spec.size}), sys.argv[1])
    """)
    return subprocess.run(
        [sys.executable, "-c", script, str(cache_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _assert_clean_failure(result: subprocess.CompletedProcess, cache_dir: Path) -> None:
    # A negative return code is a signal (SIGBUS is -7): the worker would die without a word.
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    path = cache_dir.resolve() / BIG.filename
    assert str(path) in result.stderr and str(BIG.nbytes) in result.stderr, result.stderr[-2000:]
    assert not list(cache_dir.glob("*.tmp"))
    assert not (cache_dir / BIG.filename).exists()


@contextlib.contextmanager
def _small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_file_size_limit_makes_the_build_fail_cleanly_and_leave_no_temporary(tmp_path):
    result = _build_in_child(tmp_path, BIG, file_size_limit=2**20)
    _assert_clean_failure(result, tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_full_disk_fails_with_an_error_naming_path_and_bytes_not_sigbus(tmp_path):
    with _small_tmpfs(tmp_path / "disk", "1m") as disk:
        result = _build_in_child(disk, BIG)
        assert result.returncode != -signal.SIGBUS, "the build was killed by SIGBUS"
        _assert_clean_failure(result, disk)


def test_table_size_is_capped_before_anything_is_built(tmp_path):
    too_big = noise.MAX_NOISE_TABLE_SIZE + 1
    with pytest.raises(ValueError, match=str(too_big)):
        NoiseTableSpec(seed=1, size=too_big)
    # The paper's table stays allowed.
    assert noise.PAPER_NOISE_TABLE_SIZE <= noise.MAX_NOISE_TABLE_SIZE
    assert noise.MAX_NOISE_TABLE_SIZE * 4 <= 2**30


def _lock_in_child(lock_path: Path) -> subprocess.Popen:
    """A live builder: a process that holds a table's lock until killed."""
    script = textwrap.dedent("""
        import fcntl, sys, time
        f = open(sys.argv[1], "a")
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep(120)
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(lock_path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "locked"
    return child


def test_temporaries_of_dead_builders_are_removed_but_not_those_of_live_ones(tmp_path):
    spec = NoiseTableSpec(seed=1, size=1000)
    other, busy = NoiseTableSpec(seed=2, size=1000), NoiseTableSpec(seed=3, size=1000)
    own_stale = tmp_path / f"{spec.filename}.abc123.tmp"
    other_stale = tmp_path / f"{other.filename}.def456.tmp"
    in_progress = tmp_path / f"{busy.filename}.ghi789.tmp"
    for stale in (own_stale, other_stale, in_progress):
        stale.write_bytes(b"\0" * 64)
    builder = _lock_in_child(tmp_path / f"{busy.filename}.lock")
    try:
        load_noise_table(spec, tmp_path)
    finally:
        builder.kill()
        builder.wait()
    assert not own_stale.exists() and not other_stale.exists()
    assert in_progress.exists()


def _set_last_use(path: Path, seconds_ago: float) -> None:
    stat = path.stat()
    os.utime(path, ns=(time.time_ns() - int(seconds_ago * 1e9), stat.st_mtime_ns))


def test_cache_keeps_at_most_max_tables_deleting_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setattr(noise, "MAX_CACHED_TABLES", 2, raising=False)
    specs = [NoiseTableSpec(seed=s, size=1000) for s in (1, 2, 3)]
    load_noise_table(specs[0], tmp_path)
    load_noise_table(specs[1], tmp_path)
    # Tables mapped by this process are never deleted; forget them as if other processes had.
    noise._memo.clear()
    _set_last_use(tmp_path / specs[0].filename, 60)  # used recently
    _set_last_use(tmp_path / specs[1].filename, 3600)  # least recently used
    load_noise_table(specs[2], tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.f32")) == sorted(
        [specs[0].filename, specs[2].filename]
    )


def test_cache_byte_budget_counts_the_new_table(tmp_path, monkeypatch):
    monkeypatch.setattr(noise, "MAX_CACHE_BYTES", 2 * 4000, raising=False)
    load_noise_table(NoiseTableSpec(seed=1, size=1000), tmp_path)
    load_noise_table(NoiseTableSpec(seed=2, size=1000), tmp_path)
    noise._memo.clear()
    load_noise_table(NoiseTableSpec(seed=3, size=1000), tmp_path)
    assert sum(p.stat().st_size for p in tmp_path.glob("*.f32")) <= 2 * 4000


def test_tables_mapped_by_this_process_are_never_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(noise, "MAX_CACHED_TABLES", 1, raising=False)
    first = load_noise_table(NoiseTableSpec(seed=1, size=1000), tmp_path)
    load_noise_table(NoiseTableSpec(seed=2, size=1000), tmp_path)
    assert (tmp_path / NoiseTableSpec(seed=1, size=1000).filename).exists()
    np.testing.assert_array_equal(first, np.random.RandomState(1).randn(1000).astype(np.float32))


def test_a_deleted_table_stays_readable_through_an_existing_map(tmp_path, monkeypatch):
    # Linux keeps an unlinked file's inode while it is mapped: other workers' maps keep working.
    monkeypatch.setattr(noise, "MAX_CACHED_TABLES", 1, raising=False)
    spec = NoiseTableSpec(seed=1, size=1000)
    old = load_noise_table(spec, tmp_path)
    noise._memo.clear()  # as if mapped by another process
    load_noise_table(NoiseTableSpec(seed=2, size=1000), tmp_path)
    assert not (tmp_path / spec.filename).exists()
    np.testing.assert_array_equal(old, np.random.RandomState(1).randn(1000).astype(np.float32))


def test_a_busy_table_is_not_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(noise, "MAX_CACHED_TABLES", 1, raising=False)
    spec = NoiseTableSpec(seed=1, size=1000)
    load_noise_table(spec, tmp_path)
    noise._memo.clear()
    holder = _lock_in_child(tmp_path / f"{spec.filename}.lock")
    try:
        load_noise_table(NoiseTableSpec(seed=2, size=1000), tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / spec.filename).exists()


def test_loading_a_table_marks_it_recently_used_without_changing_its_mtime(tmp_path):
    spec = NoiseTableSpec(seed=1, size=1000)
    load_noise_table(spec, tmp_path)
    path = tmp_path / spec.filename
    _set_last_use(path, 3600)
    before = path.stat()
    noise._memo.clear()
    load_noise_table(spec, tmp_path)
    after = path.stat()
    assert after.st_mtime_ns == before.st_mtime_ns
    assert after.st_atime_ns > before.st_atime_ns + 1800 * 10**9


def test_lock_file_is_not_held_after_loading(tmp_path):
    spec = NoiseTableSpec(seed=1, size=1000)
    load_noise_table(spec, tmp_path)
    with open(tmp_path / f"{spec.filename}.lock", "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
