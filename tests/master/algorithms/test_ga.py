"""The pure GA core: selection, elitism, random search, determinism, state round-trip."""

import json
import math

import pytest

from master.algorithms.ga import ELITE, OFFSPRING, GAConfig, GAState, GeneticAlgorithm, Genome

SMALL = GAConfig(population_size=20, truncation=4, elite_candidates=3, elite_episodes=5, seed=7)


def play_generation(ga: GeneticAlgorithm, fitness, elite_fitness=None):
    """Answers both phases with deterministic scores computed from the genome."""
    elite_fitness = elite_fitness or fitness
    offspring = ga.ask()
    assert ga.tell({r.key: [fitness(r.genome)] for r in offspring}) is None
    candidates = ga.ask()
    summary = ga.tell({r.key: [elite_fitness(r.genome)] * r.episodes for r in candidates})
    assert summary is not None
    return offspring, candidates, summary


def last_seed_score(genome: Genome) -> float:
    return float(genome.seeds[-1] % 1000)


def test_defaults_are_the_papers_atari_settings():
    config = GAConfig()
    assert (config.population_size, config.truncation, config.mutation_power) == (1000, 20, 0.002)
    assert (config.elite_candidates, config.elite_episodes) == (10, 30)
    assert config.evaluations_per_generation == 1300


def test_first_generation_is_fresh_inits_with_one_episode_each():
    ga = GeneticAlgorithm(SMALL)
    requests = ga.ask()
    assert len(requests) == 20 and ga.phase == OFFSPRING
    assert all(len(r.genome.seeds) == 1 and r.episodes == 1 for r in requests)
    assert len({r.key for r in requests}) == 20
    assert ga.ask() == requests  # ask is idempotent until tell


def test_truncation_selection_elitism_and_evaluation_count():
    ga = GeneticAlgorithm(SMALL)
    offspring, candidates, summary = play_generation(ga, last_seed_score)
    ranked = sorted(offspring, key=lambda r: -last_seed_score(r.genome))
    # Elite candidates are the top K of the generation, each playing E episodes.
    assert [c.genome for c in candidates] == [r.genome for r in ranked[:3]]
    assert all(c.episodes == 5 for c in candidates)
    assert summary.evaluations == 20 + 3 * 5 == SMALL.evaluations_per_generation
    assert summary.elite == ranked[0].genome
    # Next generation: N-1 children of the top T, and the elite unmodified as the last one.
    parents = {r.genome for r in ranked[:4]}
    population = [r.genome for r in ga.ask()]
    assert ga.generation == 1 and len(population) == 20
    assert population[-1] == summary.elite
    for child in population[:-1]:
        assert Genome(child.seeds[:-1]) in parents and len(child.seeds) == 2


def test_elite_is_chosen_by_reevaluation_not_by_its_lucky_episode():
    ga = GeneticAlgorithm(SMALL)
    lucky = ga.ask()[0].genome

    def one_episode(g):  # the lucky one wins its single episode ...
        return 1000.0 if g == lucky else last_seed_score(g)

    def re_evaluation(g):  # ... but is poor on average
        return -1.0 if g == lucky else last_seed_score(g)

    _, candidates, summary = play_generation(ga, one_episode, re_evaluation)
    assert lucky in [c.genome for c in candidates]
    assert summary.elite != lucky
    assert summary.elite_score == max(re_evaluation(c.genome) for c in candidates)


def test_previous_elite_is_always_a_candidate_and_candidates_are_distinct():
    ga = GeneticAlgorithm(SMALL)
    _, _, first = play_generation(ga, last_seed_score)
    # Make the elite look terrible in the next one-episode pass: it must still be a candidate.
    _, candidates, _ = play_generation(
        ga, lambda g: -5.0 if g == first.elite else last_seed_score(g)
    )
    genomes = [c.genome for c in candidates]
    assert genomes[0] == first.elite
    assert len(set(genomes)) == len(genomes) == 3


def test_failed_evaluations_are_never_selected():
    ga = GeneticAlgorithm(SMALL)
    offspring = ga.ask()
    failed = {r.genome for r in offspring[::2]}
    ga.tell({r.key: [math.nan if r.genome in failed else 1.0] for r in offspring})
    assert not failed & {c.genome for c in ga.ask()}
    assert not failed & set(ga.state.parents)
    # A candidate with one failed re-evaluation episode cannot become the elite.
    candidates = ga.ask()
    returns = {r.key: [2.0] * r.episodes for r in candidates}
    returns[candidates[0].key] = [100.0] * 4 + [math.nan]
    summary = ga.tell(returns)
    assert summary.elite == candidates[1].genome and summary.elite_score == 2.0
    assert summary.failed == len(failed)


def test_a_generation_where_everything_failed_keeps_going():
    ga = GeneticAlgorithm(SMALL)
    _, _, first = play_generation(ga, last_seed_score)
    parents = list(ga.state.parents)
    _, _, second = play_generation(ga, lambda g: math.nan)
    assert second.elite == first.elite and math.isnan(second.elite_score)
    assert math.isnan(second.score_mean) and second.failed == 20
    assert ga.state.parents == parents
    assert len(ga.ask()) == 20


def test_random_search_has_no_selection():
    ga = GeneticAlgorithm(
        GAConfig(population_size=10, truncation=0, elite_candidates=2, elite_episodes=2, seed=1)
    )
    _, _, summary = play_generation(ga, last_seed_score)
    population = [r.genome for r in ga.ask()]
    assert population[-1] == summary.elite
    assert all(len(g.seeds) == 1 for g in population)


def test_same_seed_same_run_and_other_seed_other_run():
    def run(seed):
        ga = GeneticAlgorithm(
            GAConfig(
                population_size=12, truncation=3, elite_candidates=2, elite_episodes=2, seed=seed
            )
        )
        return [play_generation(ga, last_seed_score)[2] for _ in range(4)]

    assert run(3) == run(3)
    assert run(3) != run(4)


@pytest.mark.parametrize("stop_phase", [OFFSPRING, ELITE])
def test_state_round_trips_through_json_and_the_run_continues_identically(stop_phase):
    reference = GeneticAlgorithm(SMALL)
    for _ in range(3):
        play_generation(reference, last_seed_score)
    interrupted = GeneticAlgorithm(SMALL)
    for _ in range(2):
        play_generation(interrupted, last_seed_score)
    if stop_phase == ELITE:
        offspring = interrupted.ask()
        interrupted.tell({r.key: [last_seed_score(r.genome)] for r in offspring})
    saved = json.dumps(interrupted.state.to_dict())
    restored = GeneticAlgorithm(SMALL, GAState.from_dict(json.loads(saved)))
    assert restored.state == interrupted.state
    assert restored.phase == stop_phase
    if stop_phase == ELITE:
        candidates = restored.ask()
        restored.tell({r.key: [last_seed_score(r.genome)] * r.episodes for r in candidates})
    else:
        play_generation(restored, last_seed_score)
    assert restored.state == reference.state
    assert [r.genome for r in restored.ask()] == [r.genome for r in reference.ask()]
    assert (
        play_generation(restored, last_seed_score)[2]
        == play_generation(reference, last_seed_score)[2]
    )


def test_tell_rejects_missing_extra_and_short_answers():
    ga = GeneticAlgorithm(SMALL)
    requests = ga.ask()
    answers = {r.key: [1.0] for r in requests}
    with pytest.raises(ValueError, match="missing"):
        ga.tell({k: v for k, v in list(answers.items())[1:]})
    with pytest.raises(ValueError, match="extra"):
        ga.tell({**answers, "g9/o/0": [1.0]})
    with pytest.raises(ValueError, match="g0/o/0 needs 1"):
        ga.tell({**answers, "g0/o/0": [1.0, 2.0]})
    assert ga.phase == OFFSPRING and ga.ask() == requests


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"population_size": 1}, "population_size must be >= 2, got 1"),
        ({"truncation": 30, "population_size": 10}, "truncation .* got 30"),
        ({"mutation_power": float("nan")}, "mutation_power .* got nan"),
        ({"mutation_power": -0.1}, "got -0.1"),
        ({"elite_candidates": 0}, "elite_candidates .* got 0"),
        ({"elite_episodes": 0}, "elite_episodes must be >= 1, got 0"),
    ],
)
def test_config_errors_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GAConfig(**kwargs)


def test_genome_rejects_bad_seeds():
    with pytest.raises(ValueError, match="4294967296"):
        Genome((1, 2**32))
    with pytest.raises(ValueError, match="at least one seed"):
        Genome(())
