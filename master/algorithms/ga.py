"""The Deep GA as a pure ask/tell object: no I/O, no clocks, deterministic given its seed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from master.algorithms.base import (
    ELITE,
    OFFSPRING,
    Algorithm,
    Behaviours,
    EvaluationRequest,
    GenerationSummary,
    check_format,
    check_returns,
)
from master.algorithms.settings import (
    POSITIVE,
    SEED,
    EnvTraits,
    SettingsSection,
    bounded,
    check_bounds,
    integer,
)
from neuro.genome import SEED_BOUND, Genome
from neuro.observation_stats import ObservationStats

STATE_FORMAT = "neuro.ga/1"


@dataclass(frozen=True)
class GAConfig:
    """Hyperparameters; the defaults are the paper's Atari settings."""

    population_size: int = bounded(1000, integer(2))
    """Individuals per generation, the carried-over elite included (paper: 1000)."""
    truncation: int = bounded(20, integer(0, "population_size"))
    """Top individuals that become parents; 0 turns the GA into random search."""
    mutation_power: float = bounded(0.002, POSITIVE)
    """Standard deviation of the Gaussian mutation (paper: 0.002)."""
    elite_candidates: int = bounded(10, integer(1, "population_size"))
    """Individuals re-evaluated to choose the elite (paper: 10)."""
    elite_episodes: int = bounded(30, integer(1))
    """Extra episodes each elite candidate plays (paper: 30)."""
    seed: int = bounded(0, SEED)
    """Seeds every random choice of the run."""

    def __post_init__(self) -> None:
        check_bounds(self)

    @property
    def evaluations_per_generation(self) -> int:
        """Episodes one generation plays: N offspring plus K candidates x E episodes."""
        return self.population_size + self.elite_candidates * self.elite_episodes


SMALL_GA = {"population_size": 100, "truncation": 10, "mutation_power": 0.05,
            "elite_candidates": 3}  # fmt: skip
"""A vector-observation env's GA: small and fast (the elite's episodes depend on the env)."""


def preset(kind: EnvTraits, overrides: Mapping[str, Any]) -> GAConfig:
    """Atari: the paper's GA. Other envs: SMALL_GA, whose elite is still judged over 30 episodes,
    so "solved" means what the env's threshold means (one episode where the return cannot vary).
    Defaults the user did not override shrink to fit a small population."""
    defaults: dict[str, Any] = (
        {} if kind.atari else {**SMALL_GA, "elite_episodes": 1 if kind.deterministic else 30}
    )
    settings = {**defaults, **overrides}
    population = settings.get("population_size", GAConfig.population_size)
    for name in ("truncation", "elite_candidates"):
        if name not in overrides:
            settings[name] = min(settings.get(name, getattr(GAConfig, name)), population)
    return GAConfig(**settings)


def generation_size(config: GAConfig) -> tuple[int, str]:
    """Episodes one generation asks for, and how they add up."""
    formula = (
        f"population_size ({config.population_size}) + elite_candidates "
        f"({config.elite_candidates}) x elite_episodes ({config.elite_episodes})"
    )
    return config.evaluations_per_generation, formula


GA_SETTINGS = SettingsSection(
    name="ga",
    settings=GAConfig,
    noun="GA",
    title="genetic algorithm (defaults: the paper's for Atari)",
    preset=preset,
    generation_size=generation_size,
    # --population, as before the flags were generated, so scripts and templates keep working.
    flag_names={"population_size": "--population"},
    every_run=True,
)
"""The GA's settings: --algo ga and ga-ns run on them."""


@dataclass(frozen=True)
class GASummary(GenerationSummary):
    """A generation's summary; elite_score is the mean over the elite's re-evaluation episodes."""

    elite_episode_scores: tuple[float, ...] = ()


@dataclass(frozen=True)
class Ahead:
    """The next generation's offspring but the carried elite, drawn when the offspring phase is
    told: the elite phase decides which genome is carried, never these (the parents are the
    offspring phase's top T), so they are the draws the end of the generation would make."""

    picks: tuple[int, ...] | None
    """Each child's parent, an index into GAState.parents; None: fresh initialisations."""
    seeds: tuple[int, ...]
    """Each child's new seed (a fresh initialisation's only one)."""
    rng_state: dict[str, Any]
    """The generator after these draws: the generation's end continues from it."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "picks": None if self.picks is None else list(self.picks),
            "seeds": list(self.seeds),
            "rng_state": self.rng_state,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ahead:
        picks = data["picks"]
        return cls(
            picks=None if picks is None else tuple(int(i) for i in picks),
            seeds=tuple(int(seed) for seed in data["seeds"]),
            rng_state=dict(data["rng_state"]),
        )


@dataclass
class GAState:
    """Everything the GA needs to continue; plain data so it round-trips through JSON."""

    generation: int = 0
    phase: str = OFFSPRING
    rng_state: dict[str, Any] = field(default_factory=dict)
    population: list[Genome] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    candidates: list[Genome] = field(default_factory=list)
    parents: list[Genome] = field(default_factory=list)
    elite: Genome | None = None
    elite_score: float = math.nan
    ahead: Ahead | None = None
    """ELITE phase only: the next offspring, already drawn (GeneticAlgorithm.ask_ahead). The
    rest of the state is the barrier version's: rng_state is still the generator before those
    draws, so a document without this key (an older checkpoint) continues identically."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form (NaN scores become None; "ahead" only while there is one)."""
        ahead = {} if self.ahead is None else {"ahead": self.ahead.to_dict()}
        return {
            "format": STATE_FORMAT,
            "generation": self.generation,
            "phase": self.phase,
            "rng_state": self.rng_state,
            "population": [list(g.seeds) for g in self.population],
            "scores": [_encode_float(s) for s in self.scores],
            "candidates": [list(g.seeds) for g in self.candidates],
            "parents": [list(g.seeds) for g in self.parents],
            "elite": list(self.elite.seeds) if self.elite else None,
            "elite_score": _encode_float(self.elite_score),
            **ahead,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GAState:
        """Inverse of to_dict."""
        check_format(data, STATE_FORMAT)
        phase = data["phase"]
        if phase not in (OFFSPRING, ELITE):
            raise ValueError(f"unknown GA phase {phase!r}")
        ahead = data.get("ahead")
        if ahead is not None and phase != ELITE:
            raise ValueError(f"a GA state in the {phase} phase holds no drawn offspring (ahead)")
        return cls(
            generation=int(data["generation"]),
            phase=phase,
            rng_state=dict(data["rng_state"]),
            population=[Genome(tuple(s)) for s in data["population"]],
            scores=[_decode_float(s) for s in data["scores"]],
            candidates=[Genome(tuple(s)) for s in data["candidates"]],
            parents=[Genome(tuple(s)) for s in data["parents"]],
            elite=Genome(tuple(data["elite"])) if data["elite"] is not None else None,
            elite_score=_decode_float(data["elite_score"]),
            ahead=None if ahead is None else Ahead.from_dict(ahead),
        )


class GeneticAlgorithm(Algorithm):
    """Truncation selection, Gaussian seed mutations, an elite chosen by re-evaluation.

    One generation has two phases. OFFSPRING: every individual plays one episode (the Nth is
    the previous elite, unmodified). ELITE: the top K (or the previous elite and the top K-1)
    play E more episodes each; the best mean becomes the elite. Random search is truncation 0:
    every individual is a fresh initialisation.

    The next generation's offspring but the carried elite depend on the offspring phase
    alone: once a previous elite exists (so one genome is carried), they are drawn when the
    offspring phase is told, and ask_ahead() offers them while the elite phase runs. The draws
    are the barrier version's, in its order, so the run is the same bit for bit.
    """

    name = "ga"

    def __init__(self, config: GAConfig, state: GAState | None = None) -> None:
        self.config = config
        self._rng = np.random.Generator(np.random.PCG64(config.seed))
        if state is None:
            state = GAState(rng_state={})
            state.population = [self._fresh_genome() for _ in range(config.population_size)]
            state.rng_state = self._rng.bit_generator.state
        else:
            self._rng.bit_generator.state = state.rng_state
        self.state = state
        self._ahead_children = None if state.ahead is None else self._checked_ahead(state.ahead)

    @property
    def generation(self) -> int:
        return self.state.generation

    @property
    def phase(self) -> str:
        return self.state.phase

    @property
    def elite(self) -> Genome | None:
        return self.state.elite

    @property
    def elite_score(self) -> float:
        return self.state.elite_score

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's algorithm section: GAState as JSON."""
        return self.state.to_dict()

    @classmethod
    def from_state_dict(cls, config: GAConfig, document: Mapping[str, Any]) -> GeneticAlgorithm:
        """The GA a state_dict() was taken from, ready to continue."""
        return cls(config, GAState.from_dict(document))

    def ask(self) -> list[EvaluationRequest]:
        """The evaluations the current phase needs; the same list until tell() is called."""
        g = self.state.generation
        if self.state.phase == OFFSPRING:
            return [
                EvaluationRequest(f"g{g}/o/{i}", genome, 1)
                for i, genome in enumerate(self.state.population)
            ]
        return [
            EvaluationRequest(f"g{g}/e/{i}", genome, self.config.elite_episodes)
            for i, genome in enumerate(self.state.candidates)
        ]

    def ask_ahead(self) -> list[EvaluationRequest]:
        """In the ELITE phase, the next generation's offspring but the carried elite (the first
        N-1 of its ask(), same keys), once they are drawn; [] otherwise."""
        children = self._ahead_children
        if self.state.phase != ELITE or children is None:
            return []
        g = self.state.generation + 1
        return [EvaluationRequest(f"g{g}/o/{i}", genome, 1) for i, genome in enumerate(children)]

    def tell(
        self,
        returns: Mapping[str, Sequence[float]],
        behaviours: Behaviours | None = None,
        observation_stats: ObservationStats | None = None,
    ) -> GASummary | None:
        """Takes the episode returns of every asked key; NaN marks a failed evaluation.

        Returns the generation's summary when it completes (after the ELITE phase).
        """
        requests = self.ask()
        check_returns(requests, returns)
        if self.state.phase == OFFSPRING:
            self._tell_offspring([float(returns[r.key][0]) for r in requests])
            self._draw_ahead()
            return None
        return self._tell_elite([[float(x) for x in returns[r.key]] for r in requests])

    def _tell_offspring(self, scores: list[float]) -> None:
        state = self.state
        state.scores = scores
        order = _rank(scores)
        previous_elite = state.elite
        if previous_elite is None:
            picked = order[: self.config.elite_candidates]
            candidates = [state.population[i] for i in picked]
        else:
            # The elite sits in the population as its last individual; it is a candidate
            # anyway, so the top K-1 are chosen among the others.
            others = [i for i in order if i != len(state.population) - 1]
            candidates = [previous_elite]
            candidates += [state.population[i] for i in others[: self.config.elite_candidates - 1]]
        state.candidates = candidates
        if self.config.truncation > 0:
            parents = [state.population[i] for i in order[: self.config.truncation]]
            # With every evaluation failed, the previous parents stay (or fresh inits).
            state.parents = parents or state.parents
        state.phase = ELITE

    def _tell_elite(self, episode_scores: list[list[float]]) -> GASummary:
        state = self.state
        means = [_mean_or_nan(s) for s in episode_scores]
        order = _rank(means)
        if order:
            best = order[0]
            state.elite = state.candidates[best]
            state.elite_score = means[best]
            elite_episodes = tuple(episode_scores[best])
        else:
            # No candidate could be scored: keep the previous elite, but do not claim a score.
            state.elite_score = math.nan
            elite_episodes = ()
        summary = GASummary(
            generation=state.generation,
            scores=tuple(state.scores),
            elite=state.elite,
            elite_score=state.elite_score,
            elite_episode_scores=elite_episodes,
            evaluations=len(state.scores) + sum(len(s) for s in episode_scores),
        )
        if state.ahead is not None and self._ahead_children is not None:
            # Drawn at the offspring phase's end; the elite, known now, is carried as always.
            assert state.elite is not None, "offspring are drawn ahead only once an elite exists"
            state.population = [*self._ahead_children, state.elite]
            self._rng.bit_generator.state = state.ahead.rng_state
        else:
            state.population = self._next_population()
        state.ahead = None
        self._ahead_children = None
        state.scores = []
        state.candidates = []
        state.generation += 1
        state.phase = OFFSPRING
        state.rng_state = self._rng.bit_generator.state
        return summary

    def _draw_ahead(self) -> None:
        """The next offspring, drawn now where the elite phase cannot change them."""
        if self.state.elite is None:
            # The first generation may end with no elite to carry (every candidate failed):
            # how many children to draw is known only at its end.
            return
        picks, seeds = self._draw_children(self.config.population_size - 1)
        self.state.ahead = Ahead(picks, seeds, self._rng.bit_generator.state)
        self._ahead_children = self._children(picks, seeds)

    def _next_population(self) -> list[Genome]:
        carried = [self.state.elite] if self.state.elite is not None else []
        picks, seeds = self._draw_children(self.config.population_size - len(carried))
        return self._children(picks, seeds) + carried

    def _draw_children(self, count: int) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
        """`count` children's parents (None: fresh initialisations) and new seeds."""
        if self.config.truncation == 0 or not self.state.parents:
            seeds = self._rng.integers(SEED_BOUND, size=count, dtype=np.uint64).tolist()
            return None, tuple(seeds)
        # Vectorised draws: per-child scalar calls would cost more than the rest of a
        # generation's bookkeeping.
        picks = self._rng.integers(len(self.state.parents), size=count).tolist()
        seeds = self._rng.integers(SEED_BOUND, size=count, dtype=np.uint64).tolist()
        return tuple(picks), tuple(seeds)

    def _children(self, picks: tuple[int, ...] | None, seeds: tuple[int, ...]) -> list[Genome]:
        if picks is None:
            return [Genome((seed,)) for seed in seeds]
        parents = self.state.parents
        return [parents[i].child(seed) for i, seed in zip(picks, seeds, strict=True)]

    def _checked_ahead(self, ahead: Ahead) -> list[Genome]:
        """The children a restored state's drawn offspring name; ValueError if they cannot be
        this run's (another population size, a parent that does not exist)."""
        state, count = self.state, self.config.population_size - 1
        fresh = self.config.truncation == 0 or not state.parents
        fits = (
            state.elite is not None
            and len(ahead.seeds) == count
            and (ahead.picks is None) == fresh
            and (ahead.picks is None or len(ahead.picks) == count)
            and all(0 <= i < len(state.parents) for i in ahead.picks or ())
        )
        if not fits:
            raise ValueError(
                f"the GA state's drawn offspring (ahead: {len(ahead.seeds)} seeds) do not fit "
                f"a population of {self.config.population_size} and {len(state.parents)} parents"
            )
        return self._children(ahead.picks, ahead.seeds)

    def _fresh_genome(self) -> Genome:
        return Genome((self._draw_seed(),))

    def _draw_seed(self) -> int:
        return int(self._rng.integers(SEED_BOUND, dtype=np.uint64))


def _rank(scores: Sequence[float]) -> list[int]:
    """Indices of the finite scores, best first; ties keep index order, NaN never appears."""
    finite = [i for i, s in enumerate(scores) if math.isfinite(s)]
    return sorted(finite, key=lambda i: -scores[i])


def _mean_or_nan(values: Sequence[float]) -> float:
    if not values or not all(math.isfinite(v) for v in values):
        return math.nan
    return float(np.mean(values))


def _encode_float(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _decode_float(value: float | None) -> float:
    return math.nan if value is None else float(value)
