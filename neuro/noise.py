"""The shared Gaussian noise table: one memory-mapped, read-only copy per host.

The cache directory keeps at most MAX_CACHED_TABLES table files and MAX_CACHE_BYTES bytes;
building another table deletes the least recently used others first (never one this process
maps, nor one whose lock another process holds). A worker that still maps a deleted table keeps
reading it: on Linux an unlinked file lives on until its last map goes; the next process that
asks for it builds it again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
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
MAX_NOISE_TABLE_SIZE = 2**28
"""Largest table a spec may name (1 GiB of float32, above the paper's): a size sent by a buggy
master fails at once instead of filling the disk."""
MAX_CACHED_TABLES = 4
"""Table files kept in a cache directory, the one being built included."""
MAX_CACHE_BYTES = 4 * 2**30
"""Bytes of table files kept in a cache directory, the one being built included."""
MAX_MAPPED_TABLES = 4
"""Tables one process keeps mapped (memoised); older ones are dropped and may be deleted."""
_DTYPE = np.dtype("<f4")
_TABLE_NAME = re.compile(r"noise-rs\d+-n\d+\.f32")
_TMP_NAME = re.compile(r"(?P<table>noise-rs\d+-n\d+\.f32)\..+\.tmp")

_memo: OrderedDict[Path, np.ndarray] = OrderedDict()
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class NoiseTableSpec:
    """Identifies a noise table: RandomState(seed).randn(size) as float32."""

    seed: int = DEFAULT_SEED
    size: int = PAPER_NOISE_TABLE_SIZE

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"noise table seed must be in [0, 2**32), got {self.seed}")
        if not 1 <= self.size <= MAX_NOISE_TABLE_SIZE:
            raise ValueError(
                f"noise table size must be in [1, {MAX_NOISE_TABLE_SIZE}], got {self.size}"
            )

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


def _chunks(spec: NoiseTableSpec, chunk: int = CHUNK) -> Iterator[tuple[int, np.ndarray]]:
    """(start, float32 values) of the table, chunk by chunk."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    # The legacy stream continues across calls, so chunked output equals one randn(size) call.
    rs = np.random.RandomState(spec.seed)
    for start in range(0, spec.size, chunk):
        stop = min(start + chunk, spec.size)
        yield start, rs.randn(stop - start).astype(_DTYPE)


def generate_into(spec: NoiseTableSpec, out: np.ndarray, chunk: int = CHUNK) -> None:
    """Fill `out` (float32, length spec.size) with the table values, chunk by chunk."""
    if out.shape != (spec.size,):
        raise ValueError(f"output shape {out.shape} does not match table size {spec.size}")
    for start, values in _chunks(spec, chunk):
        out[start : start + values.size] = values


def _reserve(fd: int, nbytes: int, path: Path) -> None:
    """Allocates the file's blocks up front, so a full disk fails before any work is done."""
    if not hasattr(os, "posix_fallocate"):
        return  # the ordinary writes below still report a full disk as an OSError
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as error:
        if error.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return  # a filesystem that cannot reserve; the writes still report ENOSPC
        raise OSError(
            error.errno,
            f"cannot reserve {nbytes} bytes for noise table {path}: {error.strerror} "
            "(free disk space or point NEURO_CACHE_DIR elsewhere)",
        ) from None


def _write_all(fd: int, values: np.ndarray) -> None:
    view = memoryview(values).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def _write_table(spec: NoiseTableSpec, path: Path) -> None:
    """Generate the table into a temp file beside `path` and atomically move it into place.

    Ordinary writes, not a writable memory map: a full disk under a map is a SIGBUS that kills
    the worker, under write() it is an OSError the worker reports.
    """
    log.info("building noise table %s (one-time, %d MB)", path, round(spec.nbytes / 2**20))
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        try:
            # mkstemp makes the file private; other users' workers on the host share the table.
            os.fchmod(fd, 0o644)
            _reserve(fd, spec.nbytes, path)
            try:
                for _, values in _chunks(spec):
                    _write_all(fd, values)
                os.fsync(fd)
            except OSError as error:
                raise OSError(
                    error.errno,
                    f"cannot write noise table {path} ({spec.nbytes} bytes): {error.strerror}",
                ) from None
        finally:
            os.close(fd)
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


def _lock_path(table: Path) -> Path:
    return table.with_name(table.name + ".lock")


@contextlib.contextmanager
def _try_lock(table: Path) -> Iterator[bool]:
    """Holds the table's build lock if nobody else does; yields whether it got it."""
    try:
        lock_file = open(_lock_path(table), "a")  # noqa: SIM115 - held across the yield
    except OSError:
        yield False
        return
    with lock_file:
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def _remove_dead_temporaries(directory: Path, building: Path) -> None:
    """Deletes temp files of builders that died: a temp file outlives its build only then.

    Builders hold the table's lock for the whole build, so the caller (holding `building`'s)
    owns every temp file of it, and another table's are dead if its lock is free.
    """
    by_table: dict[str, list[Path]] = {}
    for entry in directory.iterdir():
        match = _TMP_NAME.fullmatch(entry.name)
        if match is not None:
            by_table.setdefault(match["table"], []).append(entry)
    for table, temporaries in by_table.items():
        lock = (
            contextlib.nullcontext(True) if table == building.name else _try_lock(directory / table)
        )
        with lock as free:
            if not free:
                continue  # a live builder's
            for tmp in temporaries:
                log.info("removing %s, left by a noise table build that died", tmp)
                with contextlib.suppress(OSError):
                    tmp.unlink()


def _make_room(directory: Path, building: Path, nbytes: int) -> None:
    """Deletes least recently used tables until the new one fits MAX_CACHED_TABLES/_BYTES."""
    others = []
    for entry in directory.iterdir():
        if not _TABLE_NAME.fullmatch(entry.name) or entry.name == building.name:
            continue
        with contextlib.suppress(OSError):
            others.append((entry, entry.stat()))
    count = len(others) + 1
    total = sum(stat.st_size for _, stat in others) + nbytes
    for entry, stat in sorted(others, key=lambda item: item[1].st_atime_ns):
        if count <= MAX_CACHED_TABLES and total <= MAX_CACHE_BYTES:
            return
        if entry.resolve() in _memo:
            continue  # mapped here: still in use
        with _try_lock(entry) as free:
            # A held lock is a build or a load in progress: that table is in use.
            if not free:
                continue
            try:
                entry.unlink()
            except OSError as error:
                log.warning("cannot delete noise table %s to make room: %s", entry, error)
                continue
        log.info("deleted noise table %s (least recently used) to make room", entry)
        count -= 1
        total -= stat.st_size


def _map(path: Path, spec: NoiseTableSpec) -> np.ndarray | None:
    """The complete table file mapped read-only and marked as just used, else None."""
    if not _size_ok(path, spec.nbytes):
        return None
    try:
        table = np.memmap(path, dtype=_DTYPE, mode="r", shape=(spec.size,))
    except FileNotFoundError:
        return None  # deleted since the stat: build it again
    # The access time is the cache's recency (set explicitly: noatime mounts never update it).
    with contextlib.suppress(OSError):
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
    return table


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
            _memo.move_to_end(path)
            return table
        table = _map(path, spec)
        if table is None:
            # The lock makes W workers starting together generate the file once.
            with open(_lock_path(path), "a") as lock_file:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
                try:
                    table = _map(path, spec)
                    if table is None:
                        if path.exists():
                            log.warning(
                                "noise table %s has %d bytes, expected %d; regenerating",
                                path,
                                path.stat().st_size,
                                spec.nbytes,
                            )
                        _remove_dead_temporaries(path.parent, path)
                        _make_room(path.parent, path, spec.nbytes)
                        _write_table(spec, path)
                        # Mapped under the lock, so nobody deletes it between write and map.
                        table = _map(path, spec)
                        if table is None:
                            raise RuntimeError(f"noise table {path} vanished after its build")
                finally:
                    fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
        _memo[path] = table
        while len(_memo) > MAX_MAPPED_TABLES:
            _memo.popitem(last=False)
        return table


def noise_offset(seed: int, num_params: int, table_size: int) -> int:
    """Map a genome seed to the start of a num_params-long slice of the table."""
    if num_params > table_size:
        raise ValueError(f"num_params {num_params} exceeds noise table size {table_size}")
    return seed % (table_size - num_params + 1)
