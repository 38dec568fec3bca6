"""Running observation statistics: what Evolution Strategies normalise observations with.

As in OpenAI's ES: workers add up the observations of their episodes (count, sum, sum of
squares, float64), the master adds the workers' sums into the run's, and each parameter version
carries the mean and std they give, so every worker of a version normalises alike. Sums combine
by addition, so the run's statistics are the same however the observations were split among
workers and reports (exactly so while the sums stay exactly representable).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

STD_FLOOR = 1e-2
"""Variances below STD_FLOOR**2 count as that: a constant input is not scaled to infinity."""
INITIAL_COUNT = 1e-2
"""The prior OpenAI's ES starts with: a tiny count of zero-mean, floor-variance observations,
so the first version's normaliser is defined before any observation arrives."""
CLIP = 5.0
"""Normalised observations are clipped to +-CLIP."""
MAX_OBSERVATION_SIZE = 4096
"""Largest observation (flattened) a normaliser is kept for: vector envs only."""
MAX_MAGNITUDE = 1e30
"""Largest mean and root mean square any observation sums may show, component by component.

Far above any env's observations, and what keeps every normaliser usable: sums within it have
|mean| <= MAX_MAGNITUDE and variance <= MAX_MAGNITUDE**2, and so do sums of any number of
them (Cauchy-Schwarz adds up), so the float32 mean and std stay finite and the float64 totals
stay finite until the count passes 1e248. One sums that stay within it cannot overflow a run's."""
ROUNDING = 1e-6
"""Relative room for rounding in the bounds above: sums of up to ~1e9 additions of results at
the bound still pass, while no result can get past it by more than a millionth."""


@dataclass(frozen=True)
class ObservationStats:
    """count, sum and sum of squares of observations (flattened, float64)."""

    count: float
    total: np.ndarray
    squares: np.ndarray

    def __post_init__(self) -> None:
        if not (math.isfinite(self.count) and self.count >= 0):
            raise ValueError(f"observation count must be a finite number >= 0, got {self.count}")
        if self.total.shape != self.squares.shape or self.total.ndim != 1:
            raise ValueError(
                f"observation sums have shapes {self.total.shape} and {self.squares.shape}, "
                "expected two equal 1-D shapes"
            )
        if not (np.all(np.isfinite(self.total)) and np.all(np.isfinite(self.squares))):
            raise ValueError("observation sums must be finite")
        if np.any(self.squares < 0):
            raise ValueError("observation sums of squares must be >= 0")
        # Written so that NaN cannot pass: each comparison is False for NaN.
        limit = self.count * MAX_MAGNITUDE * (1 + ROUNDING)
        largest = float(np.max(np.abs(self.total), initial=0.0))
        if not largest <= limit:
            raise ValueError(
                f"observation sums of {self.count:g} observations have a component of mean "
                f"{largest / max(self.count, INITIAL_COUNT):.3g}, beyond +-{MAX_MAGNITUDE:g}"
            )
        largest = float(np.max(self.squares, initial=0.0))
        if not largest <= limit * MAX_MAGNITUDE:
            raise ValueError(
                f"observation sums of {self.count:g} observations have a component of mean "
                f"square {largest / max(self.count, INITIAL_COUNT):.3g}, beyond "
                f"{MAX_MAGNITUDE:g}**2"
            )

    @classmethod
    def zeros(cls, size: int) -> ObservationStats:
        return cls(0.0, np.zeros(size), np.zeros(size))

    @classmethod
    def prior(cls, size: int) -> ObservationStats:
        """Where a run's statistics start (INITIAL_COUNT observations of mean 0, std STD_FLOOR)."""
        return cls(INITIAL_COUNT, np.zeros(size), np.full(size, INITIAL_COUNT * STD_FLOOR**2))

    @classmethod
    def of(cls, observations: np.ndarray) -> ObservationStats:
        """The statistics of a batch of observations (leading axis: one per step)."""
        x = np.asarray(observations, dtype=np.float64).reshape(len(observations), -1)
        return cls(float(len(x)), x.sum(axis=0), np.square(x).sum(axis=0))

    def to_json(self) -> dict[str, Any]:
        """JSON form; float64 sums round-trip exactly (Python writes the shortest repr)."""
        return {"count": self.count, "sum": self.total.tolist(),
                "sum_of_squares": self.squares.tolist()}  # fmt: skip

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> ObservationStats:
        """Inverse of to_json."""
        return cls(
            float(document["count"]),
            np.array(document["sum"], dtype=np.float64),
            np.array(document["sum_of_squares"], dtype=np.float64),
        )

    @property
    def size(self) -> int:
        return int(self.total.size)

    def __add__(self, other: ObservationStats) -> ObservationStats:
        if other.size != self.size:
            raise ValueError(f"cannot add observation sums of sizes {self.size} and {other.size}")
        return ObservationStats(
            self.count + other.count, self.total + other.total, self.squares + other.squares
        )

    def normaliser(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) as float32: observations are fed as clip((x - mean) / std, +-CLIP).

        Finite, with std >= STD_FLOOR, for any sums (MAX_MAGNITUDE); ValueError if not, which
        would be a bug here, never something a worker sent.
        """
        count = max(self.count, INITIAL_COUNT)
        mean = self.total / count
        variance = np.maximum(self.squares / count - np.square(mean), STD_FLOOR**2)
        mean, std = mean.astype(np.float32), np.sqrt(variance).astype(np.float32)
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise ValueError(f"observation sums of {self.count:g} observations give no usable "
                             "normaliser (mean or std not finite, or std not > 0)")  # fmt: skip
        return mean, std


def normalise(observations: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """clip((x - mean) / std, +-CLIP) over flattened observations, float32."""
    x = np.asarray(observations, dtype=np.float32).reshape(len(observations), -1)
    return np.clip((x - mean) / std, -CLIP, CLIP).astype(np.float32)
