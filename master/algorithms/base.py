"""What every algorithm is to the rest of the master: ask/tell over explicit, serialisable state.

The trainer, the fleet and the observers speak only the types here; which algorithm runs is
the registry's business (master.algorithms.registry), and
tests/master/algorithms/test_algorithm_contract.py holds every registered one to this
interface.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import numpy as np

from neuro.genome import Genome
from neuro.observation_stats import ObservationStats

OFFSPRING = "offspring"
"""The phase that evaluates a generation's new candidates."""
ELITE = "elite"
"""The GA's second phase: its elite candidates play more episodes."""


@dataclass(frozen=True)
class Perturbation:
    """An ES candidate: parameters `version` + sign * sigma * eps(noise_index); sign 0: theta."""

    version: int
    noise_index: int
    sign: int


@dataclass(frozen=True)
class Parameters:
    """A parameter vector with the version it belongs to (the vector ES workers perturb)."""

    version: int
    theta: np.ndarray
    seeds: tuple[int, ...] = ()
    observation_norm: tuple[np.ndarray, np.ndarray] | None = None
    """(mean, std) float32 workers normalise observations with under this version; None: none."""


Candidate: TypeAlias = Genome | Perturbation
"""What one evaluation plays: a seed-list genome, or a perturbation of shared parameters."""

Behaviours: TypeAlias = Mapping[str, np.ndarray]
"""Per asked key, (episodes, behaviour size) float32: each episode's behaviour
characterisation (the Atari RAM, the env's info["bc"], or the final observation at the
episode's end); rows of a failed evaluation are NaN."""


@dataclass(frozen=True)
class EvaluationRequest:
    """Play `episodes` episodes with `genome`; `key` names the answer in tell()."""

    key: str
    genome: Candidate
    episodes: int


@dataclass(frozen=True)
class GenerationSummary:
    """What one finished generation produced: the figures every algorithm reports."""

    generation: int
    scores: tuple[float, ...]
    """One-episode score of each new candidate, NaN where its evaluation failed."""
    elite: Genome | Parameters | None
    """What the run dir saves as this generation's elite (None: nothing to save yet)."""
    elite_score: float
    """The elite's mean over its evaluation episodes (NaN if it could not be scored)."""
    evaluations: int
    """Episodes the generation played, every phase included."""

    @property
    def valid_scores(self) -> list[float]:
        return [s for s in self.scores if math.isfinite(s)]

    @property
    def score_mean(self) -> float:
        valid = self.valid_scores
        return float(np.mean(valid)) if valid else math.nan

    @property
    def score_max(self) -> float:
        valid = self.valid_scores
        return max(valid) if valid else math.nan

    @property
    def failed(self) -> int:
        return len(self.scores) - len(self.valid_scores)

    def metrics(self) -> dict[str, Any]:
        """The algorithm's own figures (JSON values), recorded beside the common ones."""
        return {}


class Algorithm(abc.ABC):
    """An ask/tell optimiser: pure (no I/O, no clocks), deterministic given its seed.

    A generation is one or more phases; each phase is one ask() and the tell() that answers
    it, and the last tell() of a generation returns its summary. Each class also has a
    `from_state_dict` classmethod (its arguments are its own: the ES needs the noise table);
    the registry calls it with a uniform signature.
    """

    name: ClassVar[str]
    """The registry name, recorded in checkpoints."""
    needs_behaviours: ClassVar[bool] = False
    """Whether tell() needs behaviour characterisations (workers then report them)."""

    @property
    def needs_observation_stats(self) -> bool:
        """Whether tell() needs the phase's observation sums (workers then report them)."""
        return False

    @property
    @abc.abstractmethod
    def generation(self) -> int:
        """Generations completed."""

    @property
    @abc.abstractmethod
    def phase(self) -> str:
        """The running phase (OFFSPRING, ELITE, ...)."""

    @property
    @abc.abstractmethod
    def elite(self) -> Genome | None:
        """The genome Status names as the elite; None when there is none (or it is no genome)."""

    @property
    @abc.abstractmethod
    def elite_score(self) -> float:
        """The last elite's score; NaN before the first, or when it could not be scored."""

    @abc.abstractmethod
    def ask(self) -> list[EvaluationRequest]:
        """The evaluations the running phase needs; the same list until tell() is called."""

    def ask_ahead(self) -> list[EvaluationRequest]:
        """Requests of the NEXT phase already fixed before this phase's results are in.

        After tell() of the running phase, ask() holds each of them unchanged (key, candidate,
        episodes), so a fleet may play them while this phase still runs, at lower priority,
        and hand their returns to the next tell(). The same list until tell(); [] where the
        next phase depends on this one's results (the default: such an algorithm keeps the
        barrier between phases).
        """
        return []

    @abc.abstractmethod
    def tell(
        self,
        returns: Mapping[str, Sequence[float]],
        behaviours: Behaviours | None = None,
        observation_stats: ObservationStats | None = None,
    ) -> GenerationSummary | None:
        """The episode returns of every asked key (NaN: failed); the summary if a generation ends.

        `behaviours` (for an algorithm that needs_behaviours) has the same keys as `returns`;
        `observation_stats` (when it needs_observation_stats) sums the phase's observations.
        ValueError, changing nothing, unless the keys and lengths are exactly those asked.
        """

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue, as a JSON document with its own "format" version."""

    def arrays(self) -> np.ndarray | None:
        """State too big for JSON, saved beside the checkpoint as an .npy (None: none)."""
        return None

    def parameters(self) -> Parameters | None:
        """The parameter vector workers fetch to apply perturbations to (None: none)."""
        return None


def check_returns(
    requests: Sequence[EvaluationRequest], returns: Mapping[str, Sequence[float]]
) -> None:
    """ValueError naming the keys at fault unless `returns` answers exactly `requests`."""
    expected = {r.key for r in requests}
    if set(returns) != expected:
        missing = sorted(expected - set(returns))[:3]
        extra = sorted(set(returns) - expected)[:3]
        raise ValueError(f"tell() needs exactly the asked keys; missing {missing}, extra {extra}")
    for r in requests:
        if len(returns[r.key]) != r.episodes:
            raise ValueError(
                f"{r.key} needs {r.episodes} episode returns, got {len(returns[r.key])}"
            )


def check_behaviours(
    requests: Sequence[EvaluationRequest], behaviours: Behaviours | None
) -> dict[str, np.ndarray]:
    """`behaviours` as float32 (episodes, size) arrays, one size for all; else ValueError."""
    if behaviours is None:
        raise ValueError("this algorithm needs the behaviour characterisation of each evaluation")
    expected = {r.key for r in requests}
    if set(behaviours) != expected:
        missing = sorted(expected - set(behaviours))[:3]
        extra = sorted(set(behaviours) - expected)[:3]
        raise ValueError(
            f"behaviours need exactly the asked keys; missing {missing}, extra {extra}"
        )
    checked, sizes = {}, set()
    for r in requests:
        array = np.asarray(behaviours[r.key], dtype=np.float32)
        if array.ndim != 2 or array.shape[0] != r.episodes or array.shape[1] < 1:
            raise ValueError(
                f"{r.key} needs ({r.episodes}, size) behaviours, got shape {array.shape}"
            )
        sizes.add(array.shape[1])
        checked[r.key] = array
    if len(sizes) > 1:
        raise ValueError(f"behaviours of one phase must share a size, got sizes {sorted(sizes)}")
    return checked


def check_format(document: Mapping[str, Any], expected: str) -> None:
    """ValueError unless a state document is of `expected` format (none: written before formats)."""
    found = document.get("format", expected)
    if found != expected:
        raise ValueError(f"state document is {found!r}, expected {expected!r}")
