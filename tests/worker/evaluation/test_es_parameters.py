"""The fetched ES versions: the latest two kept, read-only, and a missing one refused by name."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from worker.evaluation.es_parameters import EsParameterStore


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
    store = EsParameterStore()
    store.put(0, np.zeros(1000, np.float32))
    done = threading.Event()

    def fetch() -> None:
        for version in range(1, 2000):
            store.put(version, np.full(1000, version, np.float32))
        done.set()

    thread = threading.Thread(target=fetch)
    thread.start()
    while not done.is_set():
        for version in range(2000):
            if store.has(version):
                try:
                    theta = store.get(version)
                except ValueError:
                    continue  # dropped between the two calls: the caller is told by name
                assert np.all(theta == version)
                break
    thread.join()
    assert store.has(1999) and store.has(1998) and not store.has(1997)
