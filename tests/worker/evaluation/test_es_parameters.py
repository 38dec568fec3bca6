"""The fetched ES versions: the latest two kept, read-only, and a missing one refused by name."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from worker.evaluation.es_parameters import KEPT_RUNS, EsParameterStore


def test_the_latest_two_versions_are_kept_read_only_and_a_missing_one_is_named() -> None:
    store = EsParameterStore()
    for version in (3, 1, 2, 4):
        store.put(version, np.full(5, version, np.float32))
    assert [store.has(v) for v in (1, 2, 3, 4)] == [False, False, True, True]
    assert store.get(4)[0] == 4
    with pytest.raises(ValueError):
        store.get(4)[0] = 0  # read-only: a task cannot change what the next one plays
    with pytest.raises(ValueError, match="version 2 were not fetched"):
        store.get(2)


def test_a_reader_sees_whole_versions_while_the_link_thread_stores_more() -> None:
    # Enough versions for many overlapping puts and gets; the reader's scans contend for the
    # GIL with the writer, so on a loaded machine the time grows fast with this (2,000 versions
    # took 28 s on a busy 2-core CI machine).
    VERSIONS = 500
    store = EsParameterStore()
    store.put(0, np.zeros(1000, np.float32))
    done = threading.Event()

    def fetch() -> None:
        for version in range(1, VERSIONS):
            store.put(version, np.full(1000, version, np.float32))
        done.set()

    thread = threading.Thread(target=fetch)
    thread.start()
    while not done.is_set():
        for version in range(VERSIONS):
            if store.has(version):
                try:
                    theta = store.get(version)
                except ValueError:
                    continue  # dropped between the two calls: the caller is told by name
                assert np.all(theta == version)
                break
    thread.join()
    last = VERSIONS - 1
    assert store.has(last) and store.has(last - 1) and not store.has(last - 2)


def test_each_runs_versions_are_kept_apart_and_only_the_latest_runs_are_kept() -> None:
    """A master serving several ES runs numbers each one's versions from 0: version 3 of one
    run is not version 3 of another, and a worker keeps KEPT_RUNS runs' versions at most."""
    store = EsParameterStore()
    store.put(3, np.full(4, 1, np.float32), run="a")
    store.put(3, np.full(4, 2, np.float32), run="b")
    assert store.get(3, "a")[0] == 1 and store.get(3, "b")[0] == 2
    assert not store.has(3) and not store.has(3, "c")
    with pytest.raises(ValueError, match="version 3 of run c were not fetched"):
        store.get(3, "c")
    for version in (4, 5):  # each run keeps its own latest two
        store.put(version, np.full(4, version, np.float32), run="a")
    assert [store.has(v, "a") for v in (3, 4, 5)] == [False, True, True] and store.has(3, "b")
    for i in range(KEPT_RUNS):
        store.put(0, np.zeros(4, np.float32), run=f"r{i}")
    assert not store.has(4, "a") and not store.has(3, "b") and store.has(0, f"r{KEPT_RUNS - 1}")
