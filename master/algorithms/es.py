"""Evolution Strategies as a pure ask/tell object: numpy only, no I/O, serialisable state.

Each update evaluates 2 * pairs antithetic perturbations theta +- sigma * eps(i), where eps(i)
is the noise table slice a GA genome seed i selects (so master and workers agree bit for bit),
plus theta itself. Returns are shaped by centered ranks; Adam takes the step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from master.algorithms.base import (
    OFFSPRING,
    Algorithm,
    Behaviours,
    EvaluationRequest,
    GenerationSummary,
    Parameters,
    Perturbation,
    check_format,
    check_returns,
)
from master.algorithms.settings import (
    POSITIVE,
    SEED,
    Bound,
    EnvTraits,
    RunFacts,
    SettingsSection,
    bounded,
    check_bounds,
    integer,
    number,
)
from neuro.genome import SEED_BOUND
from neuro.noise import noise_offset
from neuro.observation_stats import MAX_OBSERVATION_SIZE, ObservationStats

THETA = "theta"
STATE_FORMAT = "neuro.es/1"
ADAM_BETA = Bound(0, 1, integer=False, high_open=True)
"""Adam's moment decay: 1 would divide its bias correction by zero."""


@dataclass(frozen=True)
class ESConfig:
    """Hyperparameters of the ES update."""

    pairs: int = bounded(25, integer(1))
    """Antithetic pairs per update (2 * pairs perturbed evaluations)."""
    sigma: float = bounded(0.1, POSITIVE)
    """Standard deviation of the parameter noise."""
    learning_rate: float = bounded(0.03, POSITIVE)
    """Adam step size."""
    weight_decay: float = bounded(0.005, number(0))
    """L2 coefficient pulling theta towards 0 (OpenAI ES's l2coeff)."""
    eval_episodes: int = bounded(30, integer(1))
    """Episodes the unperturbed theta plays each update (its score and rank)."""
    beta1: float = bounded(0.9, ADAM_BETA)
    beta2: float = bounded(0.999, ADAM_BETA)
    seed: int = bounded(0, SEED)
    """Seeds the noise indices and theta's initialisation."""
    observation_norm: bool = False
    """Feed the policy observations normalised by the running mean and std of every
    observation workers saw (OpenAI's ES; for vector observations, e.g. MuJoCo tasks)."""

    def __post_init__(self) -> None:
        check_bounds(self)

    @property
    def evaluations_per_generation(self) -> int:
        """Episodes one update plays."""
        return 2 * self.pairs + self.eval_episodes


@dataclass
class ESState:
    """Everything the ES needs to continue; to_dict() plus arrays() round-trip it."""

    generation: int
    theta: np.ndarray
    m: np.ndarray
    v: np.ndarray
    adam_steps: int = 0
    rng_state: dict[str, Any] = field(default_factory=dict)
    noise_indices: list[int] = field(default_factory=list)
    elite_score: float = math.nan
    theta_rank: int | None = None
    phase: str = OFFSPRING
    observations: ObservationStats | None = None
    """With observation normalisation: the sums of every observation so far (from the prior).
    The current version's normaliser is made from them; they change only when it ends."""
    _digest: tuple[int, str] | None = field(default=None, repr=False)

    def arrays(self) -> np.ndarray:
        """theta, Adam's m and v stacked (3, n) float32: the checkpoint's .npy sidecar."""
        return np.stack([self.theta, self.m, self.v])

    def arrays_sha256(self) -> str:
        """sha256 of arrays()' bytes; computed once per generation."""
        if self._digest is None or self._digest[0] != self.generation:
            digest = hashlib.sha256(self.arrays().tobytes()).hexdigest()
            self._digest = (self.generation, digest)
        return self._digest[1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible part of the state; the arrays go to a sidecar named by their hash."""
        return {
            "format": STATE_FORMAT,
            "generation": self.generation,
            "phase": self.phase,
            "adam_steps": self.adam_steps,
            "rng_state": self.rng_state,
            "noise_indices": list(self.noise_indices),
            "elite_score": self.elite_score if math.isfinite(self.elite_score) else None,
            "theta_rank": self.theta_rank,
            "num_params": int(self.theta.size),
            "arrays_sha256": self.arrays_sha256(),
            "observations": None if self.observations is None else self.observations.to_json(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], arrays: np.ndarray) -> ESState:
        """Inverse of to_dict, with the sidecar's arrays."""
        check_format(data, STATE_FORMAT)
        if arrays.shape != (3, int(data["num_params"])) or arrays.dtype != np.float32:
            raise ValueError(f"ES arrays have {arrays.dtype} {arrays.shape}, expected (3, n) f32")
        score = data["elite_score"]
        stats = data.get("observations")  # absent before observation normalisation
        observations = None if stats is None else ObservationStats.from_json(stats)
        return cls(
            generation=int(data["generation"]),
            theta=arrays[0].copy(),
            m=arrays[1].copy(),
            v=arrays[2].copy(),
            adam_steps=int(data["adam_steps"]),
            rng_state=dict(data["rng_state"]),
            noise_indices=[int(i) for i in data["noise_indices"]],
            elite_score=math.nan if score is None else float(score),
            theta_rank=data.get("theta_rank"),
            observations=observations,
        )


@dataclass(frozen=True)
class ESSummary(GenerationSummary):
    """What one update produced.

    `scores`: one per perturbation (+ then - per pair); `elite`: the parameters evaluated
    unperturbed this update (before the step), and `elite_score` their mean.
    """

    theta_rank: int | None
    """How many perturbations scored strictly above theta's first episode (0: theta is best)."""
    grad_norm: float
    observation_count: float | None = None
    """With observation normalisation: observations summed so far (this update's included)."""

    def metrics(self) -> dict[str, Any]:
        """ES figures metrics.jsonl records beside the common ones."""
        figures: dict[str, Any] = {
            "theta_rank": self.theta_rank,
            "population": len(self.scores),
            "grad_norm": self.grad_norm,
        }
        if self.observation_count is not None:
            figures["observation_count"] = self.observation_count
        return figures


def centered_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks scaled to [-0.5, 0.5], summing to 0; tied values share their average rank."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return np.zeros(x.size)
    _, inverse = np.unique(x, return_inverse=True)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(x.size)
    # Averaging within ties keeps equal returns equally weighted and the sum exactly zero.
    average = np.bincount(inverse, ranks) / np.bincount(inverse)
    return average[inverse] / (x.size - 1) - 0.5


def perturbation_noise(table: np.ndarray, noise_index: int, num_params: int) -> np.ndarray:
    """eps(noise_index): the table slice a genome seed of that value selects (read-only view)."""
    offset = noise_offset(noise_index, num_params, table.size)
    return table[offset : offset + num_params]


def gradient_estimate(
    table: np.ndarray,
    noise_indices: Sequence[int],
    weights: Sequence[float],
    num_params: int,
    sigma: float,
) -> np.ndarray:
    """sum_i w_i * eps(i) / (len * sigma): with w = F(+) - F(-), the antithetic estimate."""
    grad = np.zeros(num_params, dtype=np.float64)
    for index, weight in zip(noise_indices, weights, strict=True):
        if weight:
            grad += weight * perturbation_noise(table, index, num_params)
    return grad / (max(len(noise_indices), 1) * 2 * sigma)


def adam_step(
    config: ESConfig, theta: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, grad: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Adam's t-th step (from 1) ascending grad - weight_decay * theta: new theta, m, v (f32)."""
    g = grad - config.weight_decay * theta.astype(np.float64)
    m = config.beta1 * m + (1 - config.beta1) * g
    v = config.beta2 * v + (1 - config.beta2) * g * g
    step = config.learning_rate * math.sqrt(1 - config.beta2**t) / (1 - config.beta1**t)
    theta = theta + step * m / (np.sqrt(v) + 1e-8)
    return theta.astype(np.float32), m.astype(np.float32), v.astype(np.float32)


def update_requests(
    generation: int, noise_indices: Sequence[int], eval_episodes: int
) -> list[EvaluationRequest]:
    """An update's evaluations: + and - of each noise index, then theta itself (sign 0)."""
    g = generation
    requests = []
    for i, index in enumerate(noise_indices):
        for sign, name in ((1, "+"), (-1, "-")):
            requests.append(EvaluationRequest(f"v{g}/p/{i}{name}", Perturbation(g, index, sign), 1))
    requests.append(EvaluationRequest(f"v{g}/{THETA}", Perturbation(g, 0, 0), eval_episodes))
    return requests


def theta_figures(
    scores: Sequence[float], theta_returns: Sequence[float]
) -> tuple[float, int | None]:
    """theta's mean return (NaN unless every episode scored) and how many perturbations scored
    strictly above its first episode (None when that episode failed)."""
    score = float(np.mean(theta_returns)) if all(map(math.isfinite, theta_returns)) else math.nan
    rank = None
    if math.isfinite(theta_returns[0]):
        rank = sum(1 for s in scores if math.isfinite(s) and s > theta_returns[0])
    return score, rank


class EvolutionStrategy(Algorithm):
    """Antithetic ES with centered-rank shaping and Adam, asked and told like the GA."""

    name = "es"

    def __init__(
        self,
        config: ESConfig,
        table: np.ndarray,
        theta: np.ndarray | None = None,
        state: ESState | None = None,
        observation_size: int = 0,
    ) -> None:
        """`table`: the shared noise table; `theta`: initial parameters (unless `state`).

        `observation_size`: the flattened observation's size, which a new ES with
        observation normalisation needs (a restored one has its sums).
        """
        self.config = config
        self.table = table
        self._rng = np.random.Generator(np.random.PCG64(config.seed))
        if state is None:
            if theta is None:
                raise ValueError("a new ES needs initial parameters (theta)")
            theta = np.ascontiguousarray(theta, dtype=np.float32)
            zeros = np.zeros_like(theta)
            state = ESState(0, theta, zeros, zeros.copy())
            state.noise_indices = self._draw_indices()
            state.rng_state = self._rng.bit_generator.state
            if config.observation_norm:
                if not 1 <= observation_size <= MAX_OBSERVATION_SIZE:
                    raise ValueError(
                        "observation normalisation needs vector observations of 1 to "
                        f"{MAX_OBSERVATION_SIZE} values, got {observation_size}"
                    )
                state.observations = ObservationStats.prior(observation_size)
        else:
            self._rng.bit_generator.state = state.rng_state
        if config.observation_norm != (state.observations is not None):
            raise ValueError(
                f"observation_norm is {config.observation_norm}, but the state "
                f"{'lacks' if config.observation_norm else 'has'} observation sums"
            )
        noise_offset(0, state.theta.size, table.size)  # raises if the table is too small
        self.state = state
        self._normaliser: tuple[int, tuple[np.ndarray, np.ndarray]] | None = None

    @property
    def needs_observation_stats(self) -> bool:
        return self.config.observation_norm

    def observation_norm(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The current version's (mean, std), made once per version; None without one."""
        observations = self.state.observations
        if observations is None:
            return None
        if self._normaliser is None or self._normaliser[0] != self.state.generation:
            self._normaliser = (self.state.generation, observations.normaliser())
        return self._normaliser[1]

    @property
    def generation(self) -> int:
        return self.state.generation

    @property
    def phase(self) -> str:
        return self.state.phase

    @property
    def elite(self) -> None:
        """No genome: the ES's elite is theta, which the run dir saves from each summary."""
        return None

    @property
    def elite_score(self) -> float:
        return self.state.elite_score

    @property
    def num_params(self) -> int:
        return int(self.state.theta.size)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's algorithm section; theta and Adam's moments are in arrays()."""
        return self.state.to_dict()

    def arrays(self) -> np.ndarray:
        """theta, m and v (3, n) float32; a new array each call, so it can be written later."""
        return self.state.arrays()

    @classmethod
    def from_state_dict(
        cls, config: ESConfig, table: np.ndarray, document: Mapping[str, Any], arrays: np.ndarray
    ) -> EvolutionStrategy:
        """The ES a state_dict() and arrays() were taken from, ready to continue."""
        return cls(config, table, state=ESState.from_dict(document, arrays))

    def parameters(self) -> Parameters:
        """The current parameters, the ones this generation's tasks perturb."""
        return Parameters(
            self.state.generation, self.state.theta, observation_norm=self.observation_norm()
        )

    def noise(self, noise_index: int) -> np.ndarray:
        """eps(noise_index) for this run's parameter count."""
        return perturbation_noise(self.table, noise_index, self.num_params)

    def ask(self) -> list[EvaluationRequest]:
        """Every perturbation of this update, + and - per pair, then theta itself."""
        state = self.state
        return update_requests(state.generation, state.noise_indices, self.config.eval_episodes)

    def tell(
        self,
        returns: Mapping[str, Sequence[float]],
        behaviours: Behaviours | None = None,
        observation_stats: ObservationStats | None = None,
    ) -> ESSummary:
        """Takes the returns of every asked key (NaN: failed), steps theta, starts the next.

        ValueError, changing nothing, if the returns or the sums do not fit: everything is
        checked (the next version's normaliser included) before any state changes.
        """
        requests = self.ask()
        check_returns(requests, returns)
        state = self.state
        observations = self._next_observations(observation_stats)
        normaliser = None if observations is None else observations.normaliser()
        scores = [float(returns[r.key][0]) for r in requests[:-1]]
        theta_returns = [float(x) for x in returns[requests[-1].key]]
        pairs = [(scores[2 * i], scores[2 * i + 1]) for i in range(len(state.noise_indices))]
        valid = [i for i, (p, n) in enumerate(pairs) if math.isfinite(p) and math.isfinite(n)]
        grad = np.zeros(self.num_params)
        if valid:
            # Pairs with a failed half are dropped whole: antithetic symmetry needs both.
            shaped = centered_ranks([x for i in valid for x in pairs[i]]).reshape(-1, 2)
            grad = gradient_estimate(
                self.table,
                [state.noise_indices[i] for i in valid],
                shaped[:, 0] - shaped[:, 1],
                self.num_params,
                self.config.sigma,
            )
        theta_score, rank = theta_figures(scores, theta_returns)
        evaluated = Parameters(
            state.generation, state.theta, observation_norm=self.observation_norm()
        )
        if valid:
            self._adam_step(grad)
        summary = ESSummary(
            generation=state.generation,
            scores=tuple(scores),
            elite=evaluated,
            elite_score=theta_score,
            theta_rank=rank,
            evaluations=len(scores) + len(theta_returns),
            grad_norm=float(np.linalg.norm(grad)),
        )
        state.elite_score = theta_score
        state.theta_rank = rank
        state.observations = observations
        if observations is not None:
            summary = dataclasses.replace(summary, observation_count=observations.count)
        state.generation += 1
        state.noise_indices = self._draw_indices()
        state.rng_state = self._rng.bit_generator.state
        if normaliser is not None:
            self._normaliser = (state.generation, normaliser)
        return summary

    def _next_observations(
        self, observation_stats: ObservationStats | None
    ) -> ObservationStats | None:
        """The sums the next version normalises with (everything seen so far, as OpenAI's ES);
        ValueError if this phase's do not fit the run's."""
        observations = self.state.observations
        if observation_stats is None or observations is None:
            return observations
        if observation_stats.size != observations.size:
            raise ValueError(
                f"observation sums of size {observation_stats.size}; this run's "
                f"observations have {observations.size} values"
            )
        return observations + observation_stats

    def _adam_step(self, grad: np.ndarray) -> None:
        """Ascends grad - weight_decay * theta; new arrays, so earlier snapshots stay valid."""
        state = self.state
        state.adam_steps += 1
        state.theta, state.m, state.v = adam_step(
            self.config, state.theta, state.m, state.v, state.adam_steps, grad
        )

    def _draw_indices(self) -> list[int]:
        size = self.config.pairs
        # A noise index selects a table slice exactly as a genome seed does, so the same bound.
        return self._rng.integers(SEED_BOUND, size=size, dtype=np.uint64).tolist()


PAPER_ES = {"pairs": 500, "sigma": 0.02, "learning_rate": 0.01, "eval_episodes": 1}
"""Atari's ES: untuned starting points at the GA paper's scale."""


def preset(kind: EnvTraits, overrides: Mapping[str, Any]) -> ESConfig:
    """Atari: PAPER_ES. Other envs: the dataclass's defaults, theta judged over 30 episodes (one
    where the return cannot vary)."""
    defaults = PAPER_ES if kind.atari else {"eval_episodes": 1 if kind.deterministic else 30}
    return ESConfig(**{**defaults, **overrides})


def generation_size(config: ESConfig) -> tuple[int, str]:
    """Episodes one update asks for, and how they add up."""
    formula = f"2 x pairs ({config.pairs}) + eval_episodes ({config.eval_episodes})"
    return config.evaluations_per_generation, formula


def fits_run(config: ESConfig, run: RunFacts) -> None:
    """Observation normalisation is plain ES's, on vector observations."""
    if not config.observation_norm:
        return
    if run.algorithm != EvolutionStrategy.name:
        # NS-ES's members would need a normaliser each; only plain ES keeps one.
        raise ValueError(f"observation_norm is an --algo es setting, not {run.algorithm}'s")
    if run.atari:
        raise ValueError(
            f"observation_norm is for vector observations, not Atari frames ({run.env_id})"
        )


ES_SETTINGS = SettingsSection(
    name="es",
    settings=ESConfig,
    noun="ES",
    title="evolution strategies (--algo {algorithms})",
    preset=preset,
    generation_size=generation_size,
    fits_run=fits_run,
    # Adam's moments: the paper's settings never change them.
    fixed=frozenset({"beta1", "beta2"}),
    # Its gradient estimate from quantised policies was never measured.
    learns_quantised=False,
)
"""The ES update's settings: --algo es, ns-es and nsr-es run on them."""
