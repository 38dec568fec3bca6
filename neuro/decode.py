"""Genome (list of uint32 seeds) -> flat float32 parameters, with a cache of recent parents.

theta_0 = table[o_0 : o_0 + n] * init_scale
theta_k = theta_{k-1} + sigma * table[o_k : o_k + n]
with o_i = noise_offset(seeds[i], n, len(table)). Only separate IEEE float32 multiply and add
ufuncs are used, so every machine decodes a genome to bit-identical parameters.
"""

from __future__ import annotations

import math
import sys
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from neuro.genome import check_seeds as _check_seeds
from neuro.noise import noise_offset
from neuro.shared_store import SharedVectorStore

# How far back a miss looks for a cached ancestor before decoding from scratch.
MAX_ANCESTOR_DEPTH = 8
# Evicted vectors kept for reuse.
MAX_SPARES = 2


def _check_mutation_power(mutation_power: float) -> np.float32:
    if not (math.isfinite(mutation_power) and mutation_power >= 0):
        raise ValueError(f"mutation_power must be finite and >= 0, got {mutation_power}")
    return np.float32(mutation_power)


def _check_inputs(table: np.ndarray, init_scale: np.ndarray) -> None:
    if table.dtype != np.float32 or table.ndim != 1:
        raise ValueError(f"noise table must be 1-D float32, got {table.dtype} {table.shape}")
    if init_scale.dtype != np.float32 or init_scale.ndim != 1:
        raise ValueError(
            f"init_scale must be 1-D float32, got {init_scale.dtype} {init_scale.shape}"
        )
    noise_offset(0, init_scale.size, table.size)  # raises if the table is too small


def _mutate(
    theta: np.ndarray, table: np.ndarray, seed: int, sigma32: np.float32, tmp: np.ndarray
) -> None:
    """theta += sigma32 * eps(seed), in place, as a separate multiply then add."""
    n = theta.size
    offset = noise_offset(seed, n, table.size)
    np.multiply(table[offset : offset + n], sigma32, out=tmp)
    np.add(theta, tmp, out=theta)


def decode_genome(
    table: np.ndarray, init_scale: np.ndarray, mutation_power: float, seeds: Sequence[int]
) -> np.ndarray:
    """Decode a genome from scratch (no cache) into a new writable float32 vector."""
    _check_inputs(table, init_scale)
    key = _check_seeds(seeds)
    sigma32 = _check_mutation_power(mutation_power)
    n = init_scale.size
    offset = noise_offset(key[0], n, table.size)
    theta = np.multiply(table[offset : offset + n], init_scale)
    if len(key) > 1:
        tmp = np.empty_like(theta)
        for seed in key[1:]:
            _mutate(theta, table, seed, sigma32, tmp)
    return theta


@dataclass
class DecodeStats:
    """Counters of how each decode was served."""

    hits: int = 0
    parent_hits: int = 0
    ancestor_hits: int = 0
    cold: int = 0
    shared_hits: int = 0
    """Ancestors found in the host's shared store (decoded by another worker)."""


class CacheBudget:
    """One byte bound for the caches of several decoders (one per sigma, table and network).

    Room for a new vector is taken from the least recently used other decoder first (an old
    sigma or network is least likely to be asked for again), then from the asking decoder's
    own least recently used vectors.
    """

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"cache budget must be >= 0 bytes, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        # Least recently used first; weak, so a dropped decoder stops counting.
        self._users: OrderedDict[int, weakref.ref[GenomeDecoder]] = OrderedDict()

    def __repr__(self) -> str:
        return (
            f"CacheBudget(used={self.used_bytes}/{self.limit_bytes}, decoders={len(self._live())})"
        )

    @property
    def used_bytes(self) -> int:
        """Bytes cached by all live decoders sharing this budget."""
        return sum(d._cached_bytes for d in self._live())

    def _live(self) -> list[GenomeDecoder]:
        live = []
        for key, ref in list(self._users.items()):
            decoder = ref()
            if decoder is None:
                del self._users[key]
            else:
                live.append(decoder)
        return live

    def _register(self, decoder: GenomeDecoder) -> None:
        self._users[id(decoder)] = weakref.ref(decoder)

    def _make_room(self, decoder: GenomeDecoder, nbytes: int) -> None:
        """Evicts until `nbytes` more fit, or until nothing is left to evict."""
        self._users.move_to_end(id(decoder))
        while self.used_bytes + nbytes > self.limit_bytes:
            victim = next((d for d in self._live() if d is not decoder and d._cache), None)
            if victim is None:
                if not decoder._cache:
                    return  # the new entry alone may exceed the budget: it is kept anyway
                victim = decoder
            # Another decoder's spare memory would sit idle outside the budget: free it.
            victim._evict_oldest(recycle=victim is decoder)


class CachedDecoder:
    """The cache walk every genome decoder shares (GenomeDecoder here; the device decoder in
    worker/evaluation/device_decode.py): a hit, else the nearest cached ancestor, the parent
    kept hot for its siblings, the child entering at the cold end.

    Subclasses hold `_cache` (key -> vector, least recently used first), `_children` and
    `stats`, and give `_extend` (apply seeds to a vector) and `_insert` (admit a vector).
    """

    _cache: OrderedDict
    _children: OrderedDict
    stats: DecodeStats

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        """Drop every cached vector."""
        self._cache.clear()
        self._children.clear()
        self._cached_bytes = 0

    def _decode_key(self, key: tuple[int, ...]):
        """The vector of a checked seed tuple, through the cache.

        A miss resumes from the nearest cached ancestor (the parent, usually). Parents are
        kept at the recently-used end and children enter at the other end, so a stream of
        children does not evict the T parents they share; a child used again (an elite
        re-evaluated over many episodes) moves up like any hit.
        """
        theta = self._cache.get(key)
        if theta is not None:
            self._cache.move_to_end(key)
            self.stats.hits += 1
            return theta
        depth, base = self._nearest_ancestor(key)
        if base is not None and depth == 1:
            self.stats.parent_hits += 1
        elif base is not None:
            self.stats.ancestor_hits += 1
        else:
            self.stats.cold += 1
        if self._keeps_parents and len(key) > 1 and depth != 1:
            # The parent will be asked for again by this child's siblings: keep it hot.
            parent = self._build_parent(base, key[:-1], len(key) - depth)
            self._insert(key[:-1], parent, hot=True)
            base, depth = parent, 1
        theta = self._sealed(self._extend(base, key, len(key) - depth))
        self._insert(key, theta, hot=False)
        return theta

    def _nearest_ancestor(self, key: tuple[int, ...]):
        """(generations back, vector) of the closest cached ancestor within reach."""
        for depth in range(1, min(len(key), MAX_ANCESTOR_DEPTH + 1)):
            ancestor = self._cache.get(key[:-depth])
            if ancestor is not None:
                self._cache.move_to_end(key[:-depth])
                return depth, ancestor
            ancestor = self._ancestor_elsewhere(key[:-depth])
            if ancestor is not None:
                return depth, ancestor
        return 0, None

    @property
    def _keeps_parents(self) -> bool:
        return True

    def _ancestor_elsewhere(self, key: tuple[int, ...]):
        """An ancestor found outside this cache (admitted to it), or None."""
        return None

    def _build_parent(self, base, key: tuple[int, ...], start: int):
        return self._sealed(self._extend(base, key, start))

    def _sealed(self, theta):
        """A vector as callers get it (read-only where the array type allows)."""
        return theta

    def _extend(self, base, key: tuple[int, ...], start: int):
        raise NotImplementedError

    def _insert(self, key: tuple[int, ...], theta, hot: bool) -> None:
        raise NotImplementedError


class GenomeDecoder(CachedDecoder):
    """Decodes genomes, reusing a byte-bounded LRU cache of recently decoded vectors."""

    def __init__(
        self,
        table: np.ndarray,
        init_scale: np.ndarray,
        mutation_power: float,
        cache_bytes: int = 512 * 2**20,
        shared: SharedVectorStore | None = None,
        shared_namespace: str = "",
        max_children: int = 8,
        budget: CacheBudget | None = None,
    ) -> None:
        """`shared` (with a namespace naming the table, sigma and network) lets the worker
        processes of a host share decoded parents instead of each keeping its own copy.
        `budget`, shared with other decoders, bounds the cache instead of `cache_bytes`."""
        _check_inputs(table, init_scale)
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
        self.table = table
        self.init_scale = init_scale
        self.mutation_power = float(mutation_power)
        self._sigma32 = _check_mutation_power(self.mutation_power)
        self._budget = budget if budget is not None else CacheBudget(cache_bytes)
        self._budget._register(self)
        self.stats = DecodeStats()
        self._cache: OrderedDict[tuple[int, ...], np.ndarray] = OrderedDict()
        self._cached_bytes = 0
        self._tmp = np.empty(init_scale.size, dtype=np.float32)
        self._spares: list[np.ndarray] = []
        self._shared = shared
        self._namespace = shared_namespace
        # Children are rarely needed again beyond their own batch of episodes: only the last
        # few are kept, so the budget holds parents, not a generation's worth of offspring.
        self.max_children = max_children
        self._children: OrderedDict[tuple[int, ...], None] = OrderedDict()

    @property
    def num_params(self) -> int:
        """Length of every decoded vector."""
        return self.init_scale.size

    @property
    def cache_bytes(self) -> int:
        """The byte bound of this decoder's cache (shared with others when given a budget)."""
        return self._budget.limit_bytes

    def __contains__(self, seeds: Sequence[int]) -> bool:
        return tuple(int(s) for s in seeds) in self._cache

    def __repr__(self) -> str:
        return (
            f"GenomeDecoder(num_params={self.num_params}, cached={len(self._cache)}, "
            f"cached_bytes={self._cached_bytes}, stats={self.stats})"
        )

    def decode(self, seeds: Sequence[int]) -> np.ndarray:
        """Return the read-only parameter vector of a genome (see CachedDecoder)."""
        return self._decode_key(_check_seeds(seeds))

    def _ancestor_elsewhere(self, key: tuple[int, ...]) -> np.ndarray | None:
        if self._shared is None:
            return None
        ancestor = self._shared.get(self._shared_key(key), self.num_params)
        if ancestor is not None:  # another worker of this host decoded it
            self.stats.shared_hits += 1
            self._insert(key, ancestor, hot=True)
        return ancestor

    def _build_parent(
        self, base: np.ndarray | None, key: tuple[int, ...], start: int
    ) -> np.ndarray:
        # Shared, when a store is given: every worker of the host asks for the same parent.
        if self._shared is None:
            return self._sealed(self._extend(base, key, start))
        return self._sealed(self._build_shared(base, key, start))

    def _sealed(self, theta: np.ndarray) -> np.ndarray:
        theta.flags.writeable = False
        return theta

    def _build_shared(
        self, base: np.ndarray | None, key: tuple[int, ...], start: int
    ) -> np.ndarray:
        """Decodes a parent once per host: the first worker builds it, the others map it."""
        shared_key = self._shared_key(key)
        with self._shared.building(shared_key):
            built = self._shared.get(shared_key, self.num_params)
            if built is not None:
                self.stats.shared_hits += 1
                return built
            return self._shared.put(shared_key, self._extend(base, key, start))

    def _shared_key(self, key: tuple[int, ...]) -> str:
        return f"{self._namespace}|{','.join(map(str, key))}"

    def _extend(self, base: np.ndarray | None, key: tuple[int, ...], start: int) -> np.ndarray:
        """The vector of `key`, applying key[start:] to `base` (None: from scratch)."""
        if base is None:
            return decode_genome(self.table, self.init_scale, self.mutation_power, key)
        theta = self._spares.pop() if self._spares else np.empty(base.size, np.float32)
        np.copyto(theta, base)
        for seed in key[start:]:
            _mutate(theta, self.table, seed, self._sigma32, self._tmp)
        return theta

    def _recycle(self, old: np.ndarray) -> None:
        """Keeps an evicted vector's memory (that no caller holds) for the next decode.

        A fresh 16 MB array page-faults on first touch, which costs several times the
        mutation itself; reusing warm memory keeps a child at one copy plus one slice-add.
        """
        if old.base is None and len(self._spares) < MAX_SPARES:
            old.flags.writeable = True
            self._spares.append(old)

    def _evict_oldest(self, recycle: bool = True) -> None:
        """Drops the least recently used vector, keeping its memory if `recycle` and unheld."""
        evicted, old = self._cache.popitem(last=False)
        self._children.pop(evicted, None)
        self._cached_bytes -= old.nbytes
        # Referenced only by `old` and getrefcount's argument: no caller can see it change.
        if recycle and sys.getrefcount(old) <= 2:
            self._recycle(old)

    def _insert(self, key: tuple[int, ...], theta: np.ndarray, hot: bool) -> None:
        if key in self._cache:
            return
        # Make room first, so the new entry is never its own victim.
        self._budget._make_room(self, theta.nbytes)
        self._cache[key] = theta
        self._cached_bytes += theta.nbytes
        if not hot:
            self._cache.move_to_end(key, last=False)
            self._children[key] = None
            while len(self._children) > self.max_children:
                oldest, _ = self._children.popitem(last=False)
                old = self._cache.pop(oldest, None)
                if old is not None:
                    self._cached_bytes -= old.nbytes
                    if sys.getrefcount(old) <= 2:
                        self._recycle(old)
