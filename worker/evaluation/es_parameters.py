"""The ES parameter versions a worker has fetched: written by the link thread, read by the
thread that plays the tasks.

Versions are kept per run: a master serving several ES runs at once (a study) numbers each
run's versions from 0, so version 3 of one run is not version 3 of another.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

KEPT_VERSIONS = 2
"""Per run, the latest version and the one before, for tasks of the previous generation still
running."""
KEPT_RUNS = 16
"""Runs whose versions are kept, those stored to most recently: far more ES runs than a study
serves at once at this worker's pace, and a bound on its memory (each version can be tens of
MB) whatever the master sends."""


class EsParameterStore:
    """Fetched ES parameter vectors by run and version, read-only once stored; thread-safe."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, dict[int, np.ndarray]] = OrderedDict()
        """run id -> version -> vector; the run stored to least recently first."""
        self._lock = threading.Lock()

    def has(self, version: int, run: str = "") -> bool:
        """Whether this version of this run is here."""
        with self._lock:
            return version in self._runs.get(run, ())

    def put(self, version: int, theta: np.ndarray, run: str = "") -> None:
        """Keeps a fetched version of a run (and the one before it, for stragglers)."""
        theta.flags.writeable = False
        with self._lock:
            versions = self._runs.setdefault(run, {})
            self._runs.move_to_end(run)
            versions[version] = theta
            for old in sorted(versions)[:-KEPT_VERSIONS]:
                del versions[old]
            while len(self._runs) > KEPT_RUNS:
                self._runs.popitem(last=False)

    def get(self, version: int, run: str = "") -> np.ndarray:
        """The vector of this version of this run; ValueError naming it where it was not
        fetched."""
        with self._lock:
            theta = self._runs.get(run, {}).get(version)
        if theta is None:
            of_run = f" of run {run}" if run else ""
            raise ValueError(f"ES parameters of version {version}{of_run} were not fetched")
        return theta
