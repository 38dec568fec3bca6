"""The shared Gaussian noise table: one memory-mapped, read-only copy per host."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

# Values per randn call: keeps the float64 scratch at 32 MB instead of 2 GB for the full table.
CHUNK = 2**22
DEFAULT_SEED = 123
PAPER_NOISE_TABLE_SIZE = 250_000_000
"""The paper's table: 1 GB of float32, shared per host."""
SMALL_NOISE_TABLE_SIZE = 2**24
"""Enough for small networks (64 MB), built in a second."""
_DTYPE = np.dtype("<f4")

_memo: dict[Path, np.ndarray] = {}
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class NoiseTableSpec:
    """Identifies a noise table: RandomState(seed).randn(size) as float32."""

    seed: int = DEFAULT_SEED
    size: int = PAPER_NOISE_TABLE_SIZE

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"noise table seed must be in [0, 2**32), got {self.seed}")
        if self.size < 1:
            raise ValueError(f"noise table size must be >= 1, got {self.size}")

    @property
    def filename(self) -> str:
        """Cache file name for this spec."""
        return f"noise-rs{self.seed}-n{self.size}.f32"

    @property
    def nbytes(self) -> int:
        """Size of the table in bytes."""
        return self.size * _DTYPE.itemsize


def default_cache_dir() -> Path:
    """Return $NEURO_CACHE_DIR, else ~/.cache/neuro."""
    env = os.environ.get("NEURO_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "neuro"


def generate_into(spec: NoiseTableSpec, out: np.ndarray, chunk: int = CHUNK) -> None:
    """Fill `out` (float32, length spec.size) with the table values, chunk by chunk."""
    if out.shape != (spec.size,):
        raise ValueError(f"output shape {out.shape} does not match table size {spec.size}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    # The legacy stream continues across calls, so chunked output equals one randn(size) call.
    rs = np.random.RandomState(spec.seed)
    for start in range(0, spec.size, chunk):
        stop = min(start + chunk, spec.size)
        out[start:stop] = rs.randn(stop - start).astype(np.float32)


def _write_table(spec: NoiseTableSpec, path: Path) -> None:
    """Generate the table into a temp file beside `path` and atomically move it into place."""
    log.info("building noise table %s (one-time, %d MB)", path, round(spec.nbytes / 2**20))
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        # mkstemp makes the file private; other users' workers on the host share the table.
        os.chmod(tmp_name, 0o644)
        mm = np.memmap(tmp_name, dtype=_DTYPE, mode="w+", shape=(spec.size,))
        generate_into(spec, mm)
        mm.flush()
        del mm
        with open(tmp_name, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def _size_ok(path: Path, nbytes: int) -> bool:
    try:
        return path.stat().st_size == nbytes
    except FileNotFoundError:
        return False


def load_noise_table(
    spec: NoiseTableSpec, cache_dir: str | os.PathLike[str] | None = None
) -> np.ndarray:
    """Return the read-only float32 table, building its cache file on first use."""
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = (directory / spec.filename).resolve()
    with _memo_lock:
        table = _memo.get(path)
        if table is not None:
            return table
        if not _size_ok(path, spec.nbytes):
            # The lock makes W workers starting together generate the file once.
            with open(path.with_name(path.name + ".lock"), "a") as lock_file:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
                try:
                    if path.exists() and not _size_ok(path, spec.nbytes):
                        log.warning(
                            "noise table %s has %d bytes, expected %d; regenerating",
                            path,
                            path.stat().st_size,
                            spec.nbytes,
                        )
                    if not _size_ok(path, spec.nbytes):
                        _write_table(spec, path)
                finally:
                    fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
        table = np.memmap(path, dtype=_DTYPE, mode="r", shape=(spec.size,))
        _memo[path] = table
        return table


def noise_offset(seed: int, num_params: int, table_size: int) -> int:
    """Map a genome seed to the start of a num_params-long slice of the table."""
    if num_params > table_size:
        raise ValueError(f"num_params {num_params} exceeds noise table size {table_size}")
    return seed % (table_size - num_params + 1)
