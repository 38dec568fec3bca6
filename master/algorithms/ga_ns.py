"""GA-NS: the Deep GA with parents chosen by novelty instead of score (Such et al. 2017).

Pure ask/tell like the GA it extends: no I/O, no clocks, deterministic given its seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from master.algorithms.base import (
    OFFSPRING,
    Behaviours,
    check_behaviours,
    check_format,
    check_returns,
)
from master.algorithms.ga import STATE_FORMAT as GA_STATE_FORMAT
from master.algorithms.ga import GAConfig, GAState, GASummary, GeneticAlgorithm
from master.algorithms.novelty import (
    NoveltyArchive,
    NoveltyConfig,
    best_first,
    finite_mean_max,
    finite_rows,
    novelty,
)
from neuro.observation_stats import ObservationStats

STATE_FORMAT = "neuro.ga-ns/1"


@dataclass(frozen=True)
class GANSSummary(GASummary):
    """A GA-NS generation: the GA's figures and the novelty of its offspring."""

    novelty_mean: float | None = None
    novelty_max: float | None = None
    archive_size: int = 0
    archive_added: int = 0
    """Behaviours this generation put into the archive (reservoir replacements included)."""

    def metrics(self) -> dict[str, Any]:
        """Novelty figures metrics.jsonl records beside the common ones."""
        return {
            "novelty_mean": self.novelty_mean,
            "novelty_max": self.novelty_max,
            "archive_size": self.archive_size,
            "archive_added": self.archive_added,
        }


@dataclass
class Pending:
    """What the offspring phase leaves for the end of the generation (plain data, JSON)."""

    behaviours: list[list[float]] = field(default_factory=list)
    """The offspring BCs chosen for the archive, which takes them when the generation ends."""
    novelty_mean: float | None = None
    novelty_max: float | None = None


class NoveltyGA(GeneticAlgorithm):
    """The GA with truncation selection on novelty: parents are the most novel offspring.

    OFFSPRING: each individual plays one episode; that episode's BC's novelty is measured
    against the archive and the rest of the population, and the `truncation` most novel
    individuals become the parents. Individuals whose evaluation failed (NaN score or BC) are
    never parents. Each offspring BC is offered to the archive with probability
    archive_probability; the archive takes them when the generation ends, so its contents (the
    checkpoint's arrays) change only with the generation. ELITE is the GA's, unchanged: the top
    scorers play E more episodes and the best mean becomes the elite, so elite_genome.json and
    replay give the best-scoring policy found, not the most novel one.
    """

    name = "ga-ns"
    needs_behaviours = True

    def __init__(
        self,
        config: GAConfig,
        novelty_config: NoveltyConfig,
        state: GAState | None = None,
        archive: NoveltyArchive | None = None,
        pending: Pending | None = None,
    ) -> None:
        super().__init__(config, state)
        self.novelty_config = novelty_config
        if archive is None:
            archive = NoveltyArchive(novelty_config.archive_capacity, config.seed)
        self.archive = archive
        self.pending = pending if pending is not None else Pending()

    def state_dict(self) -> dict[str, Any]:
        """The GA's state document (generation, phase, ... at the top, as every algorithm's),
        with the archive's JSON part and what waits for the generation's end."""
        return {
            **self.state.to_dict(),
            "format": STATE_FORMAT,
            "archive": self.archive.state_dict(),
            "pending": {
                "behaviours": self.pending.behaviours,
                "novelty_mean": self.pending.novelty_mean,
                "novelty_max": self.pending.novelty_max,
            },
        }

    def arrays(self) -> np.ndarray:
        """The archived BCs (size, BC length) float32, a new array each call."""
        return self.archive.array()

    @classmethod
    def from_state_dict(  # type: ignore[override]
        cls,
        config: GAConfig,
        novelty_config: NoveltyConfig,
        document: Mapping[str, Any],
        arrays: np.ndarray,
    ) -> NoveltyGA:
        """The GA-NS a state_dict() and arrays() were taken from, ready to continue."""
        check_format(document, STATE_FORMAT)
        archive = NoveltyArchive.from_state_dict(
            novelty_config.archive_capacity, config.seed, document["archive"], arrays
        )
        saved = document["pending"]
        pending = Pending(
            behaviours=[[float(x) for x in row] for row in saved["behaviours"]],
            novelty_mean=saved["novelty_mean"],
            novelty_max=saved["novelty_max"],
        )
        state = GAState.from_dict({**document, "format": GA_STATE_FORMAT})
        return cls(config, novelty_config, state, archive, pending)

    def tell(
        self,
        returns: Mapping[str, Sequence[float]],
        behaviours: Behaviours | None = None,
        observation_stats: ObservationStats | None = None,
    ) -> GANSSummary | None:
        """The GA's tell, with each evaluation's BCs; ValueError, changing nothing, if off."""
        requests = self.ask()
        check_returns(requests, returns)
        checked = check_behaviours(requests, behaviours)
        for rows in checked.values():  # one size for all (an elite phase may ask for none)
            self.archive.check_size(rows.shape[1])
            break
        if self.state.phase == OFFSPRING:
            scores = [float(returns[r.key][0]) for r in requests]
            self._tell_novelty(scores, np.stack([checked[r.key][0] for r in requests]))
            return None
        return self._tell_generation([[float(x) for x in returns[r.key]] for r in requests])

    def _tell_novelty(self, scores: list[float], bcs: np.ndarray) -> None:
        """Elite candidates by score (the GA's rule), then parents by novelty."""
        # A failed evaluation's BC is no neighbour and never a parent, whatever the worker sent.
        usable = finite_rows(bcs) & np.isfinite(scores)
        bcs = np.where(usable[:, None], bcs, np.nan).astype(np.float32)
        reference = bcs if not len(self.archive) else np.concatenate([self.archive.behaviours, bcs])
        own = len(self.archive) + np.arange(len(bcs))
        values = novelty(bcs, reference, self.novelty_config.k, exclude=own)
        chosen = self.archive.choose(len(bcs), self.novelty_config.archive_probability)
        previous = self.state.parents
        self._tell_offspring(scores)
        if self.config.truncation > 0:
            parents = [self.state.population[i] for i in best_first(values.tolist())]
            # With no usable BC at all, the previous parents stay (or fresh inits), as in the GA.
            self.state.parents = parents[: self.config.truncation] or previous
        mean, top = finite_mean_max(values)
        self.pending = Pending(bcs[chosen & usable].tolist(), mean, top)

    def _tell_generation(self, episode_scores: list[list[float]]) -> GANSSummary:
        summary = self._tell_elite(episode_scores)
        chosen = self.pending.behaviours
        added = self.archive.add(np.array(chosen, np.float32)) if chosen else 0
        result = GANSSummary(
            **{f.name: getattr(summary, f.name) for f in fields(summary)},
            novelty_mean=self.pending.novelty_mean,
            novelty_max=self.pending.novelty_max,
            archive_size=len(self.archive),
            archive_added=added,
        )
        self.pending = Pending()
        return result
