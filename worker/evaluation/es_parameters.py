"""The ES parameter versions a worker has fetched: written by the link thread, read by the
thread that plays the tasks."""

from __future__ import annotations

import threading

import numpy as np

KEPT_VERSIONS = 2
"""The latest version and the one before, for tasks of the previous generation still running."""


class EsParameterStore:
    """Fetched ES parameter vectors by version, read-only once stored; thread-safe."""

    def __init__(self) -> None:
        self._versions: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def has(self, version: int) -> bool:
        """Whether this version is here."""
        with self._lock:
            return version in self._versions

    def put(self, version: int, theta: np.ndarray) -> None:
        """Keeps a fetched version (and the one before it, for stragglers)."""
        theta.flags.writeable = False
        with self._lock:
            self._versions[version] = theta
            for old in sorted(self._versions)[:-KEPT_VERSIONS]:
                del self._versions[old]

    def get(self, version: int) -> np.ndarray:
        """The vector of this version; ValueError naming it where it was not fetched."""
        with self._lock:
            theta = self._versions.get(version)
        if theta is None:
            raise ValueError(f"ES parameters of version {version} were not fetched")
        return theta
