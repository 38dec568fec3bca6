"""Decoded parent vectors shared by every worker process of a host.

All W workers of a host decode children of the same T parents, so each parent is decoded
once per host and kept as a file in RAM-backed /dev/shm; workers map it read-only and share
the pages. Files are written to a temp name and renamed, so a reader sees a whole vector or
none; a file deleted while mapped stays valid for whoever maps it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def default_store_dir() -> Path:
    """$NEURO_SHARED_DIR, else /dev/shm/neuro-UID (RAM), else the temp dir."""
    configured = os.environ.get("NEURO_SHARED_DIR")
    if configured:
        return Path(configured)
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"neuro-{os.getuid()}"


class SharedVectorStore:
    """Float32 vectors keyed by strings, as files one host's processes map and share."""

    def __init__(self, directory: str | os.PathLike | None = None, budget_bytes: int = 2**30):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.directory = Path(directory) if directory is not None else default_store_dir()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.budget_bytes = budget_bytes

    def _path(self, key: str) -> Path:
        return self.directory / (hashlib.sha256(key.encode()).hexdigest()[:40] + ".f32")

    @contextlib.contextmanager
    def building(self, key: str) -> Iterator[None]:
        """Held while one worker decodes a vector, so the others wait and map it instead."""
        with open(self._path(key).with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def get(self, key: str, size: int) -> np.ndarray | None:
        """The stored vector (read-only, shared pages), or None."""
        path = self._path(key)
        try:
            if path.stat().st_size != 4 * size:
                return None
            vector = np.memmap(path, dtype="<f4", mode="r", shape=(size,))
            os.utime(path)  # recently used: evicted last
        except (FileNotFoundError, ValueError, OSError):
            return None  # evicted by another worker just now: a miss
        return vector

    def put(self, key: str, vector: np.ndarray) -> np.ndarray:
        """Stores a vector; returns the shared, read-only mapping that replaces it."""
        path = self._path(key)
        if not path.exists():
            tmp = None
            try:
                fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    f.write(np.ascontiguousarray(vector, dtype="<f4").tobytes())
                os.replace(tmp, path)
            except OSError as error:
                # A full store (a container's 64 MiB /dev/shm) costs memory, never the task.
                if tmp is not None:
                    Path(tmp).unlink(missing_ok=True)
                log.warning("shared store %s: %s; keeping this vector private", self.directory,
                            error.strerror or error)  # fmt: skip
                return vector
            except BaseException:
                if tmp is not None:
                    Path(tmp).unlink(missing_ok=True)
                raise
            self._evict()
        shared = self.get(key, vector.size)
        return shared if shared is not None else vector

    def _evict(self) -> None:
        """Deletes least recently used vectors beyond the host's budget."""
        entries = []
        for path in self.directory.glob("*.f32"):
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                entries.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.budget_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            with contextlib.suppress(FileNotFoundError):
                path.with_suffix(".lock").unlink()
            total -= size
