"""The GA's exact overlap: the next offspring, drawn when the offspring phase is told and played
while the elite phase runs, make the same run as the barrier version, bit for bit.

The barrier version is the GA drawing its next population when the elite phase is told, from
the generator state the generation's document keeps: a state document without "ahead" (every
checkpoint written before the overlap) takes that path, and
test_the_drawn_offspring_are_the_generation_ends_draws holds those draws to the rule itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from typing import Any

import numpy as np
import pytest

from master.algorithms.base import ELITE, OFFSPRING, EvaluationRequest, GenerationSummary
from master.algorithms.ga import GAConfig, GeneticAlgorithm
from neuro.genome import SEED_BOUND, Genome

GENERATIONS = 6
CONFIGS = {
    "children": GAConfig(population_size=24, truncation=5, elite_candidates=4,
                         elite_episodes=3, seed=11),
    "random search": GAConfig(population_size=16, truncation=0, elite_candidates=3,
                              elite_episodes=2, seed=5),
    "one candidate": GAConfig(population_size=10, truncation=2, elite_candidates=1,
                              elite_episodes=4, seed=9),
}  # fmt: skip
"""Each way a next population is made: children of the top T, fresh initialisations, and an
elite phase that re-plays the carried elite alone."""


def episode_return(request: EvaluationRequest, episode: int, failing: bool) -> float:
    """A made-up return of one episode, a function of the genome alone; NaN now and then if
    `failing`."""
    assert isinstance(request.genome, Genome)
    seeds = np.asarray(request.genome.seeds, dtype=np.uint32).tobytes()
    value = zlib.crc32(seeds + episode.to_bytes(2, "little"))
    if failing and value % 7 == 0:
        return math.nan
    return float(value % 1000) / 10.0


def evaluate(request: EvaluationRequest, failing: bool) -> list[float]:
    return [episode_return(request, episode, failing) for episode in range(request.episodes)]


def through_json(document: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(document, allow_nan=False))


def without_ahead(document: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key != "ahead"}


@dataclasses.dataclass
class Trace:
    """Everything a run produced: every ask(), state document and summary, in order."""

    asked: list[list[EvaluationRequest]] = dataclasses.field(default_factory=list)
    documents: list[str] = dataclasses.field(default_factory=list)
    """After each tell, "ahead" left out (the barrier version has none)."""
    summaries: list[str] = dataclasses.field(default_factory=list)
    reused: int = 0
    """Offspring returns played ahead, during the previous elite phase."""

    def record(self, ga: GeneticAlgorithm) -> None:
        self.documents.append(json.dumps(without_ahead(through_json(ga.state_dict()))))

    def summary(self, summary: GenerationSummary | None) -> None:
        assert summary is not None
        # repr: NaN compares equal to itself as text, and floats are kept to the bit.
        self.summaries.append(repr(dataclasses.asdict(summary)))


def barrier_run(config: GAConfig, failing: bool, generations: int = GENERATIONS) -> Trace:
    """Tell offspring, tell elite, ask: the next offspring drawn when the elite phase is told."""
    trace, ga = Trace(), GeneticAlgorithm(config)
    for _ in range(generations):
        offspring = ga.ask()
        trace.asked.append(offspring)
        ga.tell({r.key: evaluate(r, failing) for r in offspring})
        # As a checkpoint before the overlap held it: no drawn offspring, so the end of the
        # generation draws them.
        ga = GeneticAlgorithm.from_state_dict(config, without_ahead(through_json(ga.state_dict())))
        assert ga.ask_ahead() == []
        trace.record(ga)
        candidates = ga.ask()
        trace.asked.append(candidates)
        trace.summary(ga.tell({r.key: evaluate(r, failing) for r in candidates}))
        trace.record(ga)
    return trace


def overlapped_run(config: GAConfig, failing: bool) -> Trace:
    """After the offspring phase, ask_ahead()'s requests are played first, then the elite
    phase; the next offspring phase reuses the returns played ahead."""
    trace, ga = Trace(), GeneticAlgorithm(config)
    played: dict[str, tuple[EvaluationRequest, list[float]]] = {}
    for _ in range(GENERATIONS):
        offspring = ga.ask()
        trace.asked.append(offspring)
        returns = {}
        for request in offspring:
            if request.key in played:
                ahead, values = played.pop(request.key)
                assert ahead == request  # key, genome and episodes unchanged
                returns[request.key] = values
                trace.reused += 1
            else:
                returns[request.key] = evaluate(request, failing)
        assert not played, "everything played ahead is asked for"
        ga.tell(returns)
        for request in ga.ask_ahead():
            played[request.key] = (request, evaluate(request, failing))
        trace.record(ga)
        candidates = ga.ask()
        trace.asked.append(candidates)
        trace.summary(ga.tell({r.key: evaluate(r, failing) for r in candidates}))
        trace.record(ga)
    return trace


@pytest.mark.parametrize("failing", [False, True], ids=["scored", "some failed"])
@pytest.mark.parametrize("name", CONFIGS)
def test_the_overlapped_run_is_the_barrier_run_bit_for_bit(name: str, failing: bool) -> None:
    config = CONFIGS[name]
    barrier, overlapped = barrier_run(config, failing), overlapped_run(config, failing)
    assert overlapped.summaries == barrier.summaries
    assert overlapped.documents == barrier.documents
    assert overlapped.asked == barrier.asked  # every genome, key and episode count
    if failing:
        assert overlapped.reused > 0
    else:
        # From generation 2 on, all offspring but the carried elite were played ahead.
        assert overlapped.reused == (GENERATIONS - 2) * (config.population_size - 1)


@pytest.mark.parametrize("name", CONFIGS)
def test_the_drawn_offspring_are_the_generation_ends_draws(name: str) -> None:
    """The rule, stated apart from the GA: from the generation's generator, the parents' picks
    (unless fresh initialisations), then the new seeds, for all but the carried elite."""
    config = CONFIGS[name]
    ga = GeneticAlgorithm(config)
    for _ in range(2):
        for _ in range(2):
            ga.tell({r.key: evaluate(r, False) for r in ga.ask()})
    ga.tell({r.key: evaluate(r, False) for r in ga.ask()})
    document = through_json(ga.state_dict())
    assert document["phase"] == ELITE and document["elite"] is not None
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = document["rng_state"]
    count = config.population_size - 1
    parents = [Genome(tuple(seeds)) for seeds in document["parents"]]
    if config.truncation == 0:
        seeds = rng.integers(SEED_BOUND, size=count, dtype=np.uint64).tolist()
        expected = [Genome((seed,)) for seed in seeds]
    else:
        picks = rng.integers(len(parents), size=count).tolist()
        seeds = rng.integers(SEED_BOUND, size=count, dtype=np.uint64).tolist()
        expected = [parents[i].child(seed) for i, seed in zip(picks, seeds, strict=True)]
    assert [r.genome for r in ga.ask_ahead()] == expected
    assert document["ahead"]["rng_state"] == rng.bit_generator.state
    # The generation's end carries the elite after them and continues from that generator.
    summary = ga.tell({r.key: evaluate(r, False) for r in ga.ask()})
    assert summary is not None
    assert [r.genome for r in ga.ask()] == [*expected, summary.elite]
    assert ga.state_dict()["rng_state"] == rng.bit_generator.state


@pytest.mark.parametrize("name", CONFIGS)
def test_an_elite_phase_checkpoint_from_before_the_overlap_continues_as_the_barrier_did(
    name: str,
) -> None:
    config = CONFIGS[name]
    reference = GeneticAlgorithm(config)
    for _ in range(2):
        for _ in range(2):
            reference.tell({r.key: evaluate(r, False) for r in reference.ask()})
    reference.tell({r.key: evaluate(r, False) for r in reference.ask()})
    document = through_json(reference.state_dict())
    assert "ahead" in document and reference.ask_ahead()
    old = GeneticAlgorithm.from_state_dict(config, without_ahead(document))
    assert old.phase == ELITE and old.ask_ahead() == [] and old.ask() == reference.ask()
    for _ in range(6):  # the elite phase, then five more
        assert old.ask() == reference.ask()
        returns = {r.key: evaluate(r, False) for r in reference.ask()}
        assert repr(old.tell(returns)) == repr(reference.tell(returns))
        assert without_ahead(through_json(old.state_dict())) == without_ahead(
            through_json(reference.state_dict())
        )


def test_nothing_is_asked_ahead_before_there_is_an_elite_to_carry() -> None:
    """Whether the first generation ends with an elite (it may not: every candidate failing)
    decides how many children the second draws, so the first elite phase keeps the barrier."""
    ga = GeneticAlgorithm(CONFIGS["children"])
    assert ga.phase == OFFSPRING and ga.ask_ahead() == []
    ga.tell({r.key: evaluate(r, False) for r in ga.ask()})
    assert ga.phase == ELITE and ga.ask_ahead() == []
    assert "ahead" not in ga.state_dict()
    ga.tell({r.key: evaluate(r, False) for r in ga.ask()})
    assert ga.ask_ahead() == []  # an offspring phase: what follows depends on its results
    ga.tell({r.key: evaluate(r, False) for r in ga.ask()})
    assert len(ga.ask_ahead()) == CONFIGS["children"].population_size - 1
    assert ga.ask_ahead() == ga.ask_ahead()  # the same list until tell()


def elite_phase_document(config: GAConfig) -> dict[str, Any]:
    ga = GeneticAlgorithm(config)
    for _ in range(3):
        ga.tell({r.key: evaluate(r, False) for r in ga.ask()})
    document = through_json(ga.state_dict())
    assert "ahead" in document
    return document


def test_drawn_offspring_that_cannot_be_this_runs_are_refused() -> None:
    config = CONFIGS["children"]
    document = elite_phase_document(config)
    with pytest.raises(ValueError, match="ahead"):
        GeneticAlgorithm.from_state_dict(config, {**document, "phase": OFFSPRING})
    bigger = dataclasses.replace(config, population_size=config.population_size + 1)
    with pytest.raises(ValueError, match=r"ahead: 23 seeds.*population of 25"):
        GeneticAlgorithm.from_state_dict(bigger, document)
    stray = dict(document["ahead"], picks=[99] * (config.population_size - 1))
    with pytest.raises(ValueError, match="5 parents"):
        GeneticAlgorithm.from_state_dict(config, {**document, "ahead": stray})
    fresh = dict(document["ahead"], picks=None)
    with pytest.raises(ValueError, match="ahead"):
        GeneticAlgorithm.from_state_dict(config, {**document, "ahead": fresh})
