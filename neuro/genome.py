"""Genomes as seed lists: the bounds every side checks before it trusts one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SEED_BOUND = 2**32
"""Seeds are uint32 on the wire and index the noise table."""


def check_seed(seed: int) -> int:
    """`seed` as an int if it is in [0, 2**32); ValueError naming it otherwise."""
    if not 0 <= seed < SEED_BOUND:
        raise ValueError(f"genome seed {seed!r} is outside [0, 2**32)")
    return int(seed)


def check_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    """A non-empty seed list, each seed in range, as a tuple of ints."""
    key = tuple(int(s) for s in seeds)
    if not key:
        raise ValueError(f"a genome needs at least one seed, got {list(seeds)}")
    for seed in key:
        check_seed(seed)
    return key


@dataclass(frozen=True)
class Genome:
    """A policy as integers: seeds[0] builds the initial parameters, each later seed mutates."""

    seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("a genome needs at least one seed, got none")
        for seed in self.seeds:
            check_seed(seed)

    def child(self, seed: int) -> Genome:
        """This genome with one more mutation."""
        check_seed(seed)
        # The parent's seeds were checked when it was made. A genome grows by one seed per
        # generation, so checking them all again would cost O(generation) per child.
        child = object.__new__(Genome)
        object.__setattr__(child, "seeds", (*self.seeds, seed))
        return child
