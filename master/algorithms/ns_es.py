"""NS-ES and NSR-ES: Evolution Strategies over a meta-population of novelty-seeking agents.

Conti et al. 2018, "Improving exploration in evolution strategies for deep reinforcement
learning via a population of novelty-seeking agents". M parameter vectors, each with its own
Adam state; each generation one member m is picked and evaluated as es.py evaluates theta:
antithetic perturbations theta_m +- sigma * eps(i), plus theta_m itself. The step follows the
perturbations' novelty (NS-ES), or the mean of their reward's and novelty's centered ranks
(NSR-ES). Pure numpy, no I/O, serialisable state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from master.algorithms.base import (
    OFFSPRING,
    Algorithm,
    Behaviours,
    EvaluationRequest,
    Parameters,
    check_behaviours,
    check_format,
    check_returns,
)
from master.algorithms.es import (
    ESConfig,
    ESSummary,
    adam_step,
    centered_ranks,
    gradient_estimate,
    theta_figures,
    update_requests,
)
from master.algorithms.novelty import (
    NoveltyArchive,
    NoveltyConfig,
    finite_mean_max,
    finite_rows,
    novelty,
)
from neuro.genome import SEED_BOUND
from neuro.noise import noise_offset
from neuro.observation_stats import ObservationStats

STATE_FORMAT = "neuro.ns-es/1"


@dataclass(frozen=True)
class NSESSummary(ESSummary):
    """An ES summary of the member evaluated this generation, with the novelty figures."""

    member: int = 0
    """The meta-population member this generation evaluated and stepped."""
    archive_size: int = 0
    novelty_mean: float | None = None
    """Mean novelty of the perturbations (None: none could be measured)."""
    novelty_max: float | None = None

    def metrics(self) -> dict[str, Any]:
        """ES figures and the novelty ones, recorded beside the common ones."""
        return {
            **super().metrics(),
            "member": self.member,
            "archive_size": self.archive_size,
            "novelty_mean": self.novelty_mean,
            "novelty_max": self.novelty_max,
        }


@dataclass
class NSESState:
    """Everything NS-ES needs to continue; to_dict() plus arrays() round-trip it."""

    generation: int
    thetas: list[np.ndarray]
    ms: list[np.ndarray]
    vs: list[np.ndarray]
    archive: NoveltyArchive
    adam_steps: list[int]
    member_behaviours: list[np.ndarray | None]
    """Each member's BC: the mean BC of its last evaluation (None: never measured yet)."""
    member: int = 0
    """The member this generation evaluates."""
    rng_state: dict[str, Any] = field(default_factory=dict)
    noise_indices: list[int] = field(default_factory=list)
    elite_score: float = math.nan
    theta_rank: int | None = None
    phase: str = OFFSPRING

    @property
    def num_params(self) -> int:
        return int(self.thetas[0].size)

    def arrays(self) -> np.ndarray:
        """One float32 vector: the (3, M, n) members' theta, m and v, then the (size, BC length)
        archive, each flattened (the shapes are in to_dict())."""
        n, count = self.num_params, len(self.thetas)
        # Filled in place: for Atari's networks the members alone are 3 x M x 4M floats.
        out = np.empty(3 * count * n + len(self.archive) * (self.archive.behaviour_size or 0),
                       dtype=np.float32)  # fmt: skip
        members = out[: 3 * count * n].reshape(3, count, n)
        for row, vectors in enumerate((self.thetas, self.ms, self.vs)):
            for i, vector in enumerate(vectors):
                members[row, i] = vector
        out[3 * count * n :] = self.archive.behaviours.ravel()
        return out

    def to_dict(self, name: str) -> dict[str, Any]:
        """JSON-compatible part of the state; the arrays go to the checkpoint's sidecar."""
        return {
            "format": STATE_FORMAT,
            "algorithm": name,
            "generation": self.generation,
            "phase": self.phase,
            "member": self.member,
            "adam_steps": list(self.adam_steps),
            "member_behaviours": [
                None if b is None else b.tolist() for b in self.member_behaviours
            ],
            "rng_state": self.rng_state,
            "noise_indices": list(self.noise_indices),
            "elite_score": self.elite_score if math.isfinite(self.elite_score) else None,
            "theta_rank": self.theta_rank,
            "num_params": self.num_params,
            "meta_population": len(self.thetas),
            "archive": self.archive.state_dict(),
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], arrays: np.ndarray, capacity: int, seed: int
    ) -> NSESState:
        """Inverse of to_dict, with the sidecar's arrays."""
        check_format(data, STATE_FORMAT)
        n, count = int(data["num_params"]), int(data["meta_population"])
        members = 3 * count * n
        if arrays.dtype != np.float32 or arrays.ndim != 1 or arrays.size < members:
            raise ValueError(
                f"NS-ES arrays are {arrays.dtype} {arrays.shape}, expected f32 of >= {members}"
            )
        archive_document = data["archive"]
        size, length = int(archive_document["size"]), archive_document["behaviour_size"] or 0
        if arrays.size != members + size * length:
            raise ValueError(
                f"NS-ES arrays hold {arrays.size} values, expected {members + size * length}"
            )
        stacked = arrays[:members].reshape(3, count, n)
        archive = NoveltyArchive.from_state_dict(
            capacity, seed, archive_document, arrays[members:].reshape(size, length)
        )
        score = data["elite_score"]
        return cls(
            generation=int(data["generation"]),
            thetas=[row.copy() for row in stacked[0]],
            ms=[row.copy() for row in stacked[1]],
            vs=[row.copy() for row in stacked[2]],
            archive=archive,
            adam_steps=[int(t) for t in data["adam_steps"]],
            member_behaviours=[_behaviour(b) for b in data["member_behaviours"]],
            member=int(data["member"]),
            rng_state=dict(data["rng_state"]),
            noise_indices=[int(i) for i in data["noise_indices"]],
            elite_score=math.nan if score is None else float(score),
            theta_rank=data.get("theta_rank"),
        )


def _behaviour(saved: Sequence[float] | None) -> np.ndarray | None:
    return None if saved is None else np.asarray(saved, dtype=np.float32)


def member_probabilities(member_novelty: Sequence[float]) -> np.ndarray:
    """Conti et al.'s P(m) = N(theta_m, A) / sum_j N(theta_j, A); uniform if none is positive."""
    values = np.nan_to_num(np.asarray(member_novelty, dtype=np.float64), nan=0.0)
    values = np.maximum(values, 0.0)
    total = values.sum()
    if not (math.isfinite(total) and total > 0):
        return np.full(len(values), 1 / len(values))
    return values / total


class NoveltySearchES(Algorithm):
    """NS-ES: ES steps towards novel behaviour, over a meta-population of M members.

    Each generation evaluates one member m: 2 * pairs antithetic perturbations of theta_m (one
    episode each) and theta_m itself (eval_episodes). theta_m's BC, the mean of its episodes'
    BCs, joins the archive and becomes member m's BC; then each perturbation's novelty is
    measured against the archive (Conti et al.: the archive alone, not the other
    perturbations), and Adam steps theta_m with ES's antithetic estimate over the novelty's
    centered ranks. The next member is one whose BC is not known yet, in order (so the first
    M generations visit each once), else one drawn with probability proportional to its
    novelty against the archive, which holds its own BC too (as in the paper). A pair with a
    failed half (NaN return or BC) adds nothing. The summary's elite is theta_m as evaluated.
    """

    name = "ns-es"
    needs_behaviours = True
    reward_weight: ClassVar[float] = 0.0
    """Weight of the reward's centered ranks in each perturbation's shaped value; the rest is
    the novelty's."""

    def __init__(
        self,
        config: ESConfig,
        novelty_config: NoveltyConfig,
        table: np.ndarray,
        thetas: Sequence[np.ndarray] | None = None,
        state: NSESState | None = None,
    ) -> None:
        """`table`: the shared noise table; `thetas`: the members' initial parameters."""
        self.config = config
        self.novelty_config = novelty_config
        self.table = table
        self._rng = np.random.Generator(np.random.PCG64(config.seed))
        count = novelty_config.meta_population
        if state is None:
            if thetas is None or len(thetas) != count:
                raise ValueError(f"a new {self.name} needs meta_population={count} initial thetas")
            members = [np.ascontiguousarray(t, dtype=np.float32) for t in thetas]
            if len({t.shape for t in members}) != 1 or members[0].ndim != 1:
                raise ValueError(f"initial thetas must be 1-d and of one size, got "
                                 f"{sorted({t.shape for t in members})}")  # fmt: skip
            archive = NoveltyArchive(novelty_config.archive_capacity, config.seed)
            state = NSESState(0, members, [np.zeros_like(t) for t in members],
                              [np.zeros_like(t) for t in members], archive, [0] * count,
                              [None] * count)  # fmt: skip
            state.noise_indices = self._draw_indices()
            state.member = self._pick_member(state)
            state.rng_state = self._rng.bit_generator.state
        else:
            if len(state.thetas) != count:
                raise ValueError(
                    f"the state holds {len(state.thetas)} members, meta_population is {count}"
                )
            self._rng.bit_generator.state = state.rng_state
        noise_offset(0, state.num_params, table.size)  # raises if the table is too small
        self.state = state

    @property
    def generation(self) -> int:
        return self.state.generation

    @property
    def phase(self) -> str:
        return self.state.phase

    @property
    def elite(self) -> None:
        """No genome: the elite is the evaluated theta, which the run dir saves per summary."""
        return None

    @property
    def elite_score(self) -> float:
        return self.state.elite_score

    @property
    def member(self) -> int:
        """The member this generation evaluates."""
        return self.state.member

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's algorithm section; members and archive are in arrays()."""
        return self.state.to_dict(self.name)

    def arrays(self) -> np.ndarray:
        """Members' theta, m, v and the archive in one new float32 vector (NSESState.arrays)."""
        return self.state.arrays()

    @classmethod
    def from_state_dict(
        cls,
        config: ESConfig,
        novelty_config: NoveltyConfig,
        table: np.ndarray,
        document: Mapping[str, Any],
        arrays: np.ndarray,
    ) -> NoveltySearchES:
        """The algorithm a state_dict() and arrays() were taken from, ready to continue."""
        if document.get("algorithm") != cls.name:
            raise ValueError(f"the state is {document.get('algorithm')!r}'s, not {cls.name!r}'s")
        state = NSESState.from_dict(document, arrays, novelty_config.archive_capacity, config.seed)
        return cls(config, novelty_config, table, state=state)

    def parameters(self) -> Parameters:
        """The selected member's parameters, the ones this generation's tasks perturb."""
        return Parameters(self.state.generation, self.state.thetas[self.state.member])

    def ask(self) -> list[EvaluationRequest]:
        """Every perturbation of the selected member, + and - per pair, then the member itself."""
        state = self.state
        return update_requests(state.generation, state.noise_indices, self.config.eval_episodes)

    def tell(
        self,
        returns: Mapping[str, Sequence[float]],
        behaviours: Behaviours | None = None,
        observation_stats: ObservationStats | None = None,
    ) -> NSESSummary:
        """Takes every asked key's returns and BCs, steps the member, picks the next one."""
        requests = self.ask()
        check_returns(requests, returns)
        checked = check_behaviours(requests, behaviours)
        state = self.state
        state.archive.check_size(checked[requests[-1].key].shape[1])
        m = state.member
        scores = np.array([float(returns[r.key][0]) for r in requests[:-1]])
        theta_returns = [float(x) for x in returns[requests[-1].key]]
        theta_bcs = checked[requests[-1].key]
        measured = theta_bcs[finite_rows(theta_bcs)]
        if len(measured):
            bc = measured.mean(axis=0, dtype=np.float64).astype(np.float32)
            state.archive.add(bc[None])
            state.member_behaviours[m] = bc
        values = novelty(np.stack([checked[r.key][0] for r in requests[:-1]]),
                         state.archive.behaviours, self.novelty_config.k)  # fmt: skip
        values[~np.isfinite(scores)] = np.nan
        grad = self._gradient(scores, values)
        theta_score, rank = theta_figures(scores.tolist(), theta_returns)
        evaluated = Parameters(state.generation, state.thetas[m])
        if grad is not None:
            state.adam_steps[m] += 1
            state.thetas[m], state.ms[m], state.vs[m] = adam_step(
                self.config, state.thetas[m], state.ms[m], state.vs[m], state.adam_steps[m], grad
            )
        mean, top = finite_mean_max(values)
        summary = NSESSummary(
            generation=state.generation,
            scores=tuple(scores.tolist()),
            elite=evaluated,
            elite_score=theta_score,
            theta_rank=rank,
            evaluations=len(scores) + len(theta_returns),
            grad_norm=0.0 if grad is None else float(np.linalg.norm(grad)),
            member=m,
            archive_size=len(state.archive),
            novelty_mean=mean,
            novelty_max=top,
        )
        state.elite_score = theta_score
        state.theta_rank = rank
        state.generation += 1
        state.noise_indices = self._draw_indices()
        state.member = self._pick_member(state)
        state.rng_state = self._rng.bit_generator.state
        return summary

    def _gradient(self, scores: np.ndarray, values: np.ndarray) -> np.ndarray | None:
        """ES's antithetic estimate over the shaped values; None when no pair is whole."""
        both = (np.isfinite(scores) & np.isfinite(values)).reshape(-1, 2).all(axis=1)
        valid = np.flatnonzero(both)
        if not valid.size:
            return None
        # Pairs with a failed half are dropped whole: antithetic symmetry needs both.
        picked = np.stack([2 * valid, 2 * valid + 1], axis=1).ravel()
        shaped = centered_ranks(values[picked]).reshape(-1, 2)
        if self.reward_weight:
            rewards = centered_ranks(scores[picked]).reshape(-1, 2)
            shaped = (1 - self.reward_weight) * shaped + self.reward_weight * rewards
        return gradient_estimate(
            self.table,
            [self.state.noise_indices[i] for i in valid.tolist()],
            shaped[:, 0] - shaped[:, 1],
            self.state.num_params,
            self.config.sigma,
        )

    def _pick_member(self, state: NSESState) -> int:
        unknown = [i for i, bc in enumerate(state.member_behaviours) if bc is None]
        if unknown:
            return unknown[0]
        known = np.stack([bc for bc in state.member_behaviours if bc is not None])
        values = novelty(known, state.archive.behaviours, self.novelty_config.k)
        cumulative = np.cumsum(member_probabilities(values.tolist()))
        drawn = int(np.searchsorted(cumulative, self._rng.random() * cumulative[-1], side="right"))
        return min(drawn, len(cumulative) - 1)

    def _draw_indices(self) -> list[int]:
        # A noise index selects a table slice exactly as a genome seed does, so the same bound.
        return self._rng.integers(SEED_BOUND, size=self.config.pairs, dtype=np.uint64).tolist()


class NoveltyRewardSearchES(NoveltySearchES):
    """NSR-ES: NS-ES whose step follows the mean of reward's and novelty's centered ranks."""

    name = "nsr-es"
    reward_weight = 0.5
