"""Novelty search's shared parts: its settings, the bounded archive, and the novelty measure.

A behaviour characterisation (BC) is a float vector per evaluation (Atari: the final RAM;
vector envs: the env's info["bc"] or the final observation). A BC's novelty is its mean
Euclidean distance to its k nearest neighbours among the behaviours seen so far (Lehman and
Stanley 2011; Conti et al. 2018). Pure numpy, no I/O, deterministic given the archive's seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from master.algorithms.settings import (
    SettingsSection,
    bounded,
    check_bounds,
    integer,
    number,
    plain_preset,
)

ARCHIVE_FORMAT = "neuro.novelty-archive/1"
ARCHIVE_STREAM = 0x6E6F76
"""Spawn key of the archive's random stream, so it never repeats the algorithm's own draws."""
BLOCK = 1024
"""novelty() computes distances in tiles of at most BLOCK x BLOCK (8 MiB of float64)."""
CANCELLED = 1e-6
"""A squared distance from |a|^2 + |b|^2 - 2ab under this fraction of |a|^2 + |b|^2 has lost
most of its digits to cancellation (rows far from the centre, close to each other): it is taken
again from the direct difference of the two rows."""
EXACT_VALUES = 2**18
"""Values (pairs x BC length) of direct differences taken at once: 2 MiB of float64."""


MAX_ARCHIVE_CAPACITY = 1_000_000
"""Each generation's novelty measures every behaviour against the whole archive, and every
checkpoint holds it: a million behaviours of Atari's 128 RAM bytes are 0.5 GB as float32."""
MAX_META_POPULATION = 100
"""Each member holds a parameter vector and its two Adam moments (48 MB each for the paper's
Atari network)."""


@dataclass(frozen=True)
class NoveltyConfig:
    """Hyperparameters of novelty search (GA-NS, NS-ES, NSR-ES)."""

    k: int = bounded(10, integer(1, MAX_ARCHIVE_CAPACITY))
    """Nearest neighbours whose mean distance is a behaviour's novelty (Conti et al.: 10)."""
    archive_probability: float = bounded(0.01, number(0, 1))
    """GA-NS: chance that each individual's behaviour enters the archive, about 10 a
    generation at a population of 1000 (NS-ES archives its evaluated theta's every generation)."""
    archive_capacity: int = bounded(10_000, integer(1, MAX_ARCHIVE_CAPACITY))
    """Most behaviours the archive keeps; once full, reservoir sampling keeps a uniform sample
    of every behaviour ever offered to it."""
    meta_population: int = bounded(5, integer(1, MAX_META_POPULATION))
    """NS-ES and NSR-ES: parameter vectors searched in turn, each with its own Adam state
    (Conti et al.: 5)."""

    def __post_init__(self) -> None:
        check_bounds(self)


NOVELTY_SETTINGS = SettingsSection(
    name="novelty",
    settings=NoveltyConfig,
    noun="novelty search",
    title="novelty search (--algo {algorithms})",
    preset=plain_preset(NoveltyConfig),
    # A bare --k would not say what it counts.
    flag_names={"k": "--novelty-k"},
)
"""Novelty search's settings: --algo ga-ns, ns-es and nsr-es run on them."""


def finite_rows(behaviours: np.ndarray) -> np.ndarray:
    """Which rows are a usable BC: NaN (a failed evaluation) or inf anywhere makes one unusable."""
    return np.isfinite(behaviours).all(axis=1)


def novelty(
    behaviours: np.ndarray,
    reference: np.ndarray,
    k: int,
    *,
    exclude: np.ndarray | None = None,
    block: int = BLOCK,
) -> np.ndarray:
    """Mean Euclidean distance of each row of `behaviours` to its k nearest rows of `reference`.

    `exclude[i]` is the index of a reference row that is behaviour i itself (-1: none): that
    row is left out by position, so a behaviour is not its own neighbour while a different
    individual with an identical BC still counts, at distance 0. Fewer than k usable
    neighbours: the mean over those there are; none at all: 0. Rows that are not finite are
    no neighbour, and their own novelty is NaN. Distances are computed in tiles of at most
    `block` x `block`, so memory stays bounded whatever the sizes (float64 (n,) result).
    """
    queries = np.asarray(behaviours)
    reference = np.asarray(reference)
    if queries.ndim != 2 or reference.ndim != 2:
        raise ValueError(f"novelty needs 2-d arrays, got {queries.shape} and {reference.shape}")
    if len(reference) and reference.shape[1] != queries.shape[1]:
        raise ValueError(f"behaviours of size {queries.shape[1]} vs reference {reference.shape[1]}")
    if k < 1 or block < 1:
        raise ValueError(f"k and block must be >= 1, got {k} and {block}")
    n = len(queries)
    if exclude is None:
        exclude = np.full(n, -1, dtype=np.int64)
    exclude = np.asarray(exclude, dtype=np.int64)
    if exclude.shape != (n,):
        raise ValueError(f"exclude needs one index per behaviour, got shape {exclude.shape}")
    usable = finite_rows(queries)
    result = np.full(n, np.nan)
    if not usable.any():
        return result
    # Distances are taken about a common centre: |a|^2 + |b|^2 - 2ab cancels less when the
    # BCs sit far from the origin (RAM bytes do). One extreme row drags the mean far from the
    # others, and their distances would cancel to 0: those are taken again directly.
    centre = queries[usable].astype(np.float64).mean(axis=0)
    for start in range(0, n, block):
        rows = slice(start, min(start + block, n))
        result[rows] = _block_novelty(queries[rows], reference, k, exclude[rows], centre, block)
    result[~usable] = np.nan
    return result


def _block_novelty(
    queries: np.ndarray,
    reference: np.ndarray,
    k: int,
    exclude: np.ndarray,
    centre: np.ndarray,
    block: int,
) -> np.ndarray:
    """novelty() of at most `block` queries: the k smallest distances kept tile by tile."""
    rows = queries.astype(np.float64)
    finite = finite_rows(rows)
    q = np.where(finite[:, None], rows - centre, 0.0)
    q_norms = np.einsum("ij,ij->i", q, q)
    nearest = np.empty((len(q), 0))
    for start in range(0, len(reference), block):
        tile_rows = reference[start : start + block].astype(np.float64)
        tile = tile_rows - centre
        usable = finite_rows(tile)
        tile = np.where(usable[:, None], tile, 0.0)
        t_norms = np.einsum("ij,ij->i", tile, tile)
        # In place, one (block, block) array: |q|^2 + |t|^2 - 2 q.t, clipped at 0, square-rooted.
        distances = q @ tile.T
        distances *= -2.0
        distances += q_norms[:, None]
        distances += t_norms[None, :]
        # |q|^2 + |t|^2 <= 2 max(|q|^2, |t|^2): two bool tiles, no third float one.
        cancelled = distances < (2 * CANCELLED) * q_norms[:, None]
        cancelled |= distances < (2 * CANCELLED) * t_norms[None, :]
        cancelled &= finite[:, None] & usable[None, :]
        np.maximum(distances, 0.0, out=distances)
        np.sqrt(distances, out=distances)
        at = np.nonzero(cancelled)
        if at[0].size:
            distances[at] = _direct_distances(rows, tile_rows, *at)
        distances[:, ~usable] = np.inf
        own = np.flatnonzero((exclude >= start) & (exclude < start + len(tile)))
        distances[own, exclude[own] - start] = np.inf
        nearest = np.concatenate([nearest, distances], axis=1)
        if nearest.shape[1] > k:
            nearest = np.partition(nearest, k - 1, axis=1)[:, :k]
    nearest = np.sort(nearest, axis=1)  # one summation order, however the tiles fell
    counted = np.isfinite(nearest)
    counts = counted.sum(axis=1)
    sums = np.where(counted, nearest, 0.0).sum(axis=1)
    return np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)


def _direct_distances(
    queries: np.ndarray, reference: np.ndarray, rows: np.ndarray, columns: np.ndarray
) -> np.ndarray:
    """|queries[rows[i]] - reference[columns[i]]| for each i, from the differences themselves
    (float64 rows of float32 values: each difference is exact), EXACT_VALUES at a time."""
    out = np.empty(len(rows))
    step = max(1, EXACT_VALUES // max(queries.shape[1], 1))
    for start in range(0, len(rows), step):
        part = slice(start, start + step)
        difference = queries[rows[part]] - reference[columns[part]]
        out[part] = np.sqrt(np.einsum("ij,ij->i", difference, difference))
    return out


class NoveltyArchive:
    """The behaviours novelty is measured against: bounded, deterministic, serialisable.

    Every behaviour offered is counted; while fewer than `capacity` are held it is kept, after
    that the n-th offered replaces a uniformly drawn slot with probability capacity / n
    (reservoir sampling, Vitter's algorithm R), so the archive is always a uniform sample of
    all behaviours ever offered and old ones stay represented. The draws come from the
    archive's own generator (seeded from the run seed), whose state is part of state_dict().
    """

    def __init__(self, capacity: int, seed: int) -> None:
        if capacity < 1:
            raise ValueError(f"archive capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.offered = 0
        """Behaviours offered so far, kept or not."""
        self._rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(ARCHIVE_STREAM,)))
        )
        self._behaviours = np.empty((0, 0), dtype=np.float32)
        self._size: int | None = None

    def __len__(self) -> int:
        return len(self._behaviours)

    @property
    def behaviour_size(self) -> int | None:
        """The BC length the archive holds (None until the first behaviour)."""
        return self._size

    @property
    def behaviours(self) -> np.ndarray:
        """The archived BCs, (len, size) float32, read-only."""
        view = self._behaviours.view()
        view.flags.writeable = False
        return view

    def check_size(self, size: int) -> None:
        """ValueError unless behaviours of `size` values fit this archive."""
        if self._size is not None and size != self._size:
            raise ValueError(f"behaviours have {size} values, the archive's have {self._size}")

    def choose(self, count: int, probability: float) -> np.ndarray:
        """Which of `count` behaviours to offer, each with `probability` (bool mask)."""
        if probability >= 1:
            return np.ones(count, dtype=bool)
        return self._rng.random(count) < probability

    def add(self, behaviours: np.ndarray) -> int:
        """Offers each finite row, in order (others are skipped); how many were kept."""
        rows = np.asarray(behaviours, dtype=np.float32)
        if rows.ndim != 2:
            raise ValueError(f"archive rows must be (count, size), got shape {rows.shape}")
        self.check_size(rows.shape[1])
        rows = rows[finite_rows(rows)]
        if not len(rows):
            return 0
        self._size = rows.shape[1]
        stored = self._behaviours if len(self) else np.empty((0, self._size), np.float32)
        free = min(self.capacity - len(stored), len(rows))
        # A new array rather than writes into the old one: earlier snapshots stay valid.
        stored = np.concatenate([stored, rows[:free]])
        kept = free
        rest = rows[free:]
        if len(rest):
            offered = self.offered + free + np.arange(len(rest))
            slots = self._rng.integers(0, offered + 1)
            for row, slot in zip(rest, slots.tolist(), strict=True):
                if slot < self.capacity:
                    stored[slot] = row
                    kept += 1
        self.offered += len(rows)
        self._behaviours = stored
        return kept

    def state_dict(self) -> dict[str, Any]:
        """The JSON part of the archive; array() holds the behaviours."""
        return {
            "format": ARCHIVE_FORMAT,
            "capacity": self.capacity,
            "offered": self.offered,
            "size": len(self),
            "behaviour_size": self._size,
            "rng_state": self._rng.bit_generator.state,
        }

    def array(self) -> np.ndarray:
        """The archived BCs as a new (len, size) float32 array (size 0 while empty)."""
        return self._behaviours.copy()

    @classmethod
    def from_state_dict(
        cls, capacity: int, seed: int, document: Mapping[str, Any], array: np.ndarray
    ) -> NoveltyArchive:
        """The archive a state_dict() and array() were taken from."""
        found = document.get("format")
        if found != ARCHIVE_FORMAT:
            raise ValueError(f"archive document is {found!r}, expected {ARCHIVE_FORMAT!r}")
        if int(document["capacity"]) != capacity:
            raise ValueError(
                f"the archive was saved with capacity {document['capacity']}, not {capacity}"
            )
        archive = cls(capacity, seed)
        size, behaviour_size = int(document["size"]), document["behaviour_size"]
        shape = (size, 0 if behaviour_size is None else int(behaviour_size))
        if array.dtype != np.float32 or array.shape != shape or size > capacity:
            raise ValueError(f"archive array is {array.dtype} {array.shape}, expected f32 {shape}")
        archive.offered = int(document["offered"])
        archive._rng.bit_generator.state = dict(document["rng_state"])
        archive._behaviours = array.copy()
        archive._size = None if behaviour_size is None else int(behaviour_size)
        return archive


def best_first(values: Sequence[float]) -> list[int]:
    """Indices of the finite values, largest first; ties keep index order, NaN never appears."""
    finite = [i for i, v in enumerate(values) if math.isfinite(v)]
    return sorted(finite, key=lambda i: -values[i])


def finite_mean_max(values: np.ndarray) -> tuple[float | None, float | None]:
    """(mean, max) of the finite values as JSON numbers; None where there are none."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return None, None
    return float(finite.mean()), float(finite.max())
