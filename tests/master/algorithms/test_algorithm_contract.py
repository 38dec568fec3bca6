"""The contract every registered algorithm keeps: an entry added to the registry is tested here.

Tiny CartPole configs, numpy only, no workers: each test asks, makes up episode returns (and,
for an algorithm that needs them, behaviour characterisations) and tells, as the trainer would
with real ones.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from master.algorithms import registry
from master.algorithms.base import Algorithm, EvaluationRequest, GenerationSummary
from master.algorithms.settings import Bound, SettingsSection, bounds
from master.cli import _resolve_config, _settings, build_parser
from master.config import RunConfig, inspect_env_id, preset
from master.observe.events import GenerationRecord
from master.run.algorithm_setup import create_algorithm, restore_algorithm
from master.run.checkpoint import load_checkpoint, save_checkpoint
from master.run.rundir import RunDirectory
from master.run.start import resume_config
from neuro.genome import Genome

TINY: dict[str, dict[str, Any]] = {
    "ga": {"population_size": 12, "truncation": 3, "elite_candidates": 3, "elite_episodes": 2},
    "es": {"pairs": 4, "eval_episodes": 2},
    # A small archive, so that reservoir replacement happens within a few generations.
    "ga-ns": {"population_size": 12, "truncation": 3, "elite_candidates": 3, "elite_episodes": 2,
              "k": 3, "archive_probability": 0.5, "archive_capacity": 8},
    "ns-es": {"pairs": 4, "eval_episodes": 2, "meta_population": 3, "k": 2, "archive_capacity": 4},
    "nsr-es": {"pairs": 4, "eval_episodes": 2, "meta_population": 3, "k": 2,
               "archive_capacity": 4},
}  # fmt: skip
"""Small settings per algorithm; an entry not named here runs with its CartPole defaults."""
BEHAVIOUR_SIZE = 5
"""Values in each made-up behaviour characterisation."""
MAX_PHASES = 50
"""A generation with more phases than this is taken for one that never ends."""


@pytest.fixture(params=registry.ALGORITHMS)
def entry(request: pytest.FixtureRequest) -> registry.Entry:
    return registry.get(request.param)


@pytest.fixture
def config(entry: registry.Entry, noise_cache) -> RunConfig:
    return preset(inspect_env_id("CartPole-v1"), algorithm=entry.name, seed=3, hidden_sizes=(8,),
                  noise_table_size=2**16, **TINY.get(entry.name, {}))  # fmt: skip


def answers(
    requests: Iterable[EvaluationRequest], rng: np.random.Generator, failed: Iterable[str] = ()
) -> dict[str, list[float]]:
    """Made-up episode returns for every request; NaN (failed) for the keys in `failed`."""
    failed = set(failed)
    return {
        r.key: [math.nan if r.key in failed else float(rng.normal()) for _ in range(r.episodes)]
        for r in requests
    }


def behaviours_for(
    requests: Iterable[EvaluationRequest], returns: Mapping[str, Sequence[float]]
) -> dict[str, np.ndarray]:
    """Made-up BCs for every request, a function of its key; NaN rows where a return is NaN."""
    behaviours = {}
    for r in requests:
        rows = np.random.default_rng(zlib.crc32(r.key.encode())).normal(
            size=(r.episodes, BEHAVIOUR_SIZE)
        )
        failed = [
            i for i, x in enumerate(returns.get(r.key, ())) if i < r.episodes and math.isnan(x)
        ]
        rows[failed] = math.nan
        behaviours[r.key] = rows.astype(np.float32)
    return behaviours


def tell(algorithm: Algorithm, returns: Mapping[str, Sequence[float]]) -> GenerationSummary | None:
    """algorithm.tell(returns), with made-up BCs of what it asked if it needs them."""
    if not algorithm.needs_behaviours:
        return algorithm.tell(returns)
    return algorithm.tell(returns, behaviours_for(algorithm.ask(), returns))


def play_generation(
    algorithm: Algorithm,
    rng: np.random.Generator,
    failed: Callable[[list[EvaluationRequest]], Iterable[str]] = lambda requests: (),
) -> tuple[GenerationSummary, int]:
    """Tells every phase of one generation; its summary and the episodes it asked for."""
    episodes = 0
    for _ in range(MAX_PHASES):
        requests = algorithm.ask()
        episodes += sum(r.episodes for r in requests)
        summary = tell(algorithm, answers(requests, rng, failed(requests)))
        if summary is not None:
            return summary, episodes
    raise AssertionError(f"no generation summary after {MAX_PHASES} phases")


def fingerprint(algorithm: Algorithm) -> tuple[Any, ...]:
    """Everything that decides what an algorithm does next, in comparable form."""
    arrays = algorithm.arrays()
    return (
        algorithm.generation,
        algorithm.phase,
        algorithm.ask(),
        json.dumps(algorithm.state_dict(), sort_keys=True),
        None if arrays is None else (arrays.dtype.str, arrays.shape, arrays.tobytes()),
    )


def plain(value: Any) -> Any:
    """A summary (or any part of it) as JSON text can hold it: NaN-safe, arrays by value."""
    if isinstance(value, np.ndarray):
        return [value.dtype.str, value.shape, value.tobytes().hex()]
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return repr(value) if isinstance(value, float) else value


def restored(config: RunConfig, algorithm: Algorithm) -> Algorithm:
    """The algorithm as a checkpoint would bring it back: state through JSON, arrays copied."""
    document = json.loads(json.dumps(algorithm.state_dict(), allow_nan=False))
    arrays = algorithm.arrays()
    return restore_algorithm(config, document, None if arrays is None else arrays.copy())


def common_names() -> set[str]:
    """The names a metrics.jsonl line gives the figures every generation has."""
    values = {f.name: [1] if "seeds" in f.name else 0
              for f in dataclasses.fields(GenerationRecord) if f.name != "extra"}  # fmt: skip
    return set(values) | set(json.loads(GenerationRecord(**values).to_json()))


def test_ask_is_stable_until_tell_and_no_key_is_asked_twice(entry, config) -> None:
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(0)
    asked: set[str] = set()
    for _ in range(6):
        requests = algorithm.ask()
        keys = [r.key for r in requests]
        assert len(set(keys)) == len(keys) and not asked & set(keys)
        assert all(r.episodes >= 1 for r in requests)
        assert algorithm.ask() == requests and algorithm.ask() == requests  # keys, order, genomes
        asked |= set(keys)
        tell(algorithm, answers(requests, rng))


OVERLAPS = ("ga",)
"""The entries whose ask_ahead() offers anything: the others keep the barrier between phases."""


def test_what_is_asked_ahead_the_next_phase_asks_unchanged(entry, config) -> None:
    """ask_ahead() is stable until tell(), survives a checkpoint, asks nothing the running
    phase asks, and every request of it is in the next ask() as it was (key, candidate,
    episodes), whatever the phase's returns were, failures included."""
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(9)
    seen = 0
    for phase in range(4 * 2):
        ahead = algorithm.ask_ahead()
        assert algorithm.ask_ahead() == ahead
        assert restored(config, algorithm).ask_ahead() == ahead
        assert not {r.key for r in ahead} & {r.key for r in algorithm.ask()}
        requests = algorithm.ask()
        failed = [r.key for r in requests[::3]] if phase in (4, 5) else []
        tell(algorithm, answers(requests, rng, failed))
        asked = algorithm.ask()
        for request in ahead:
            assert request in asked, request.key
        seen += len(ahead)
    assert (seen > 0) == (entry.name in OVERLAPS), f"{entry.name} asked {seen} ahead"


@pytest.mark.parametrize("fault", ["unknown", "missing", "too few", "too many"])
def test_tell_refuses_keys_it_did_not_ask_for_and_changes_nothing(entry, config, fault) -> None:
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(1)
    play_generation(algorithm, rng)  # some history first: an elite, a moved rng
    for _ in range(MAX_PHASES):  # every phase of the next generation
        requests = algorithm.ask()
        good = answers(requests, rng)
        named = requests[-1].key
        bad = dict(good)
        if fault == "unknown":
            named = "no/such/key"
            bad[named] = [1.0]
        elif fault == "missing":
            del bad[named]
        elif fault == "too few":
            bad[named] = good[named][:-1]
        else:
            bad[named] = [*good[named], 1.0]
        before = fingerprint(algorithm)
        with pytest.raises(ValueError, match=re.escape(named)):
            tell(algorithm, bad)
        assert fingerprint(algorithm) == before
        if tell(algorithm, good) is not None:
            return
    raise AssertionError(f"no generation summary after {MAX_PHASES} phases")


def test_state_round_trips_through_json_and_the_run_goes_on_identically(entry, config) -> None:
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(2)
    for _ in range(5):  # a few phases: a checkpoint may be taken in any of them
        # A resumed run's notice reads the generation from the document, whatever the algorithm.
        assert algorithm.state_dict()["generation"] == algorithm.generation
        again = restored(config, algorithm)
        assert fingerprint(again) == fingerprint(algorithm)
        returns = answers(algorithm.ask(), rng)
        assert plain(tell(again, returns)) == plain(tell(algorithm, returns))
        assert fingerprint(again) == fingerprint(algorithm)


def test_a_summary_counts_what_was_asked_and_its_metrics_are_json(entry, config) -> None:
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(3)
    for generation in range(2):
        summary, episodes = play_generation(algorithm, rng)
        # The trainer checks this against the episodes the fleet played.
        assert summary.evaluations == episodes
        assert summary.generation == generation and algorithm.generation == generation + 1
        assert summary.failed == 0 and len(summary.valid_scores) == len(summary.scores)
        metrics = summary.metrics()
        json.dumps(metrics)
        assert all(isinstance(name, str) for name in metrics)
        # metrics.jsonl writes them beside the common figures, which they must not overwrite.
        assert not set(metrics) & common_names()


def test_a_generation_where_every_evaluation_fails_is_survived(entry, config) -> None:
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(4)
    summary, _ = play_generation(algorithm, rng, lambda requests: [r.key for r in requests])
    assert summary.failed == len(summary.scores) > 0
    assert math.isnan(summary.score_mean) and math.isnan(summary.score_max)
    assert math.isnan(summary.elite_score) and math.isnan(algorithm.elite_score)
    json.dumps(algorithm.state_dict(), allow_nan=False)  # NaN is written as null
    json.dumps(summary.metrics())
    summary, _ = play_generation(algorithm, rng)
    assert summary.failed == 0 and math.isfinite(summary.elite_score)


def ga_never_selects_nan(entry: registry.Entry, config: RunConfig) -> None:
    """A genome whose evaluation failed becomes neither an elite candidate nor a parent."""
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(5)
    play_generation(algorithm, rng)
    offspring = algorithm.ask()
    # Every other individual fails; the last, the carried elite, is re-evaluated anyway.
    failed = {r.key for r in offspring[:-1][::2]}
    failed_genomes = {r.genome for r in offspring if r.key in failed}
    tell(algorithm, answers(offspring, rng, failed))
    candidates = algorithm.ask()
    assert not failed_genomes & {r.genome for r in candidates}
    # The first candidate fails one re-evaluation episode and scores far above the rest in the
    # others: a mean with a NaN in it is no mean, so it cannot become the elite.
    returns = answers(candidates, rng)
    returns[candidates[0].key] = [math.nan] + [1e9] * (candidates[0].episodes - 1)
    summary = tell(algorithm, returns)
    assert summary is not None and summary.elite != candidates[0].genome
    assert math.isfinite(summary.elite_score)
    # Parents were chosen in the offspring phase, from evaluations that did not fail: the
    # candidate that failed a re-evaluation episode may be one of them, the failed offspring not.
    for request in algorithm.ask():
        assert isinstance(request.genome, Genome)
        parent = request.genome.seeds[:-1]
        assert request.genome == summary.elite or Genome(parent) not in failed_genomes


def es_never_selects_nan(entry: registry.Entry, config: RunConfig) -> None:
    """A pair with a failed half adds nothing to the step, whatever its other half scored."""
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(6)
    play_generation(algorithm, rng)
    twin = restored(config, algorithm)
    requests = algorithm.ask()
    first = requests[0].genome
    pair = [r.key for r in requests if r.genome.noise_index == first.noise_index and r.genome.sign]
    assert len(pair) == 2
    returns = answers(requests, rng, failed=pair[1:])
    tell(algorithm, {**returns, pair[0]: [1e9]})
    tell(twin, {**returns, pair[0]: [-1e9]})
    theta = algorithm.parameters().theta
    assert np.array_equal(theta, twin.parameters().theta) and np.isfinite(theta).all()
    assert np.array_equal(algorithm.arrays(), twin.arrays())  # every member, when there are more
    # With every pair failed there is no gradient at all: theta stays where it was.
    before = STEPPED[entry.name](algorithm).copy()
    summary, _ = play_generation(algorithm, rng, lambda requests: [r.key for r in requests])
    assert np.array_equal(STEPPED[entry.name](algorithm), before)
    assert summary.metrics()["grad_norm"] == 0.0


STEPPED: dict[str, Callable[[Algorithm], np.ndarray]] = {
    "es": lambda algorithm: algorithm.parameters().theta,
    # The next generation may evaluate another member: all of them, and the archive, stay.
    "ns-es": lambda algorithm: algorithm.arrays(),
    "nsr-es": lambda algorithm: algorithm.arrays(),
}
"""What an ES-family step moves, for each ES-family algorithm."""
NEVER_SELECTS_NAN: dict[str, Callable[[registry.Entry, RunConfig], None]] = {
    "ga": ga_never_selects_nan,
    "es": es_never_selects_nan,
    "ga-ns": ga_never_selects_nan,  # a failed evaluation has a NaN BC too: it is never novel
    "ns-es": es_never_selects_nan,
    "nsr-es": es_never_selects_nan,
}
"""What "a failed evaluation is never selected" means for each algorithm."""


def test_a_failed_evaluation_is_never_selected(entry, config) -> None:
    check = NEVER_SELECTS_NAN.get(entry.name)
    assert check is not None, f"say what never selecting NaN means for {entry.name!r} here"
    check(entry, config)


def test_arrays_change_only_with_the_generation(entry, config) -> None:
    """The checkpoint's sidecar is named by the generation, so a generation has one content."""
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(7)
    for _ in range(3):
        arrays = algorithm.arrays()
        generation = algorithm.generation
        for _ in range(MAX_PHASES):
            tell(algorithm, answers(algorithm.ask(), rng))
            if algorithm.generation != generation:
                break
            assert fingerprint(algorithm)[-1] == fingerprint_arrays(arrays)
        else:
            raise AssertionError(f"no generation summary after {MAX_PHASES} phases")


def fingerprint_arrays(arrays: np.ndarray | None) -> Any:
    return None if arrays is None else (arrays.dtype.str, arrays.shape, arrays.tobytes())


BEHAVIOUR_FAULTS = ("none", "missing", "extra", "rows", "flat", "sizes", "archive size")


NEEDS_BEHAVIOURS = ("ga-ns", "ns-es", "nsr-es")


def test_the_entries_that_need_behaviours_are_those_tested_for_them(noise_cache) -> None:
    kind = inspect_env_id("CartPole-v1")
    needing = {
        name
        for name in registry.ALGORITHMS
        if create_algorithm(
            preset(kind, algorithm=name, hidden_sizes=(8,), noise_table_size=2**16)
        ).needs_behaviours
    }
    assert needing == set(NEEDS_BEHAVIOURS)


@pytest.mark.parametrize("fault", BEHAVIOUR_FAULTS)
@pytest.mark.parametrize("name", NEEDS_BEHAVIOURS)
def test_tell_refuses_behaviours_unless_they_answer_what_was_asked(
    name, fault, noise_cache
) -> None:
    config = preset(inspect_env_id("CartPole-v1"), algorithm=name, seed=3, hidden_sizes=(8,),
                    noise_table_size=2**16, **TINY.get(name, {}))  # fmt: skip
    algorithm = create_algorithm(config)
    rng = np.random.default_rng(8)
    play_generation(algorithm, rng)  # a known BC size, an archive, a moved rng
    for _ in range(MAX_PHASES):  # every phase of the next generation
        requests = algorithm.ask()
        returns = answers(requests, rng)
        good = behaviours_for(requests, returns)
        first, last = requests[0].key, requests[-1].key
        bad: dict[str, np.ndarray] | None = dict(good)
        if fault == "none":
            bad = None
        elif fault == "missing":
            del bad[last]
        elif fault == "extra":
            bad["no/such/key"] = good[last]
        elif fault == "rows":
            bad[last] = np.concatenate([good[last], good[last][:1]])
        elif fault == "flat":
            bad[last] = good[last].ravel()
        elif fault == "sizes":
            bad[first] = good[first][:, :-1]
        else:
            bad = {key: np.concatenate([rows, rows], axis=1) for key, rows in good.items()}
        before = fingerprint(algorithm)
        with pytest.raises(ValueError):
            algorithm.tell(returns, bad)
        assert fingerprint(algorithm) == before
        if algorithm.tell(returns, good) is not None:
            return
    raise AssertionError(f"no generation summary after {MAX_PHASES} phases")


# --- settings: the command line -> RunConfig -> config.json and a checkpoint -> RunConfig -----


def section_fields(entry: registry.Entry) -> dict[str, SettingsSection[Any]]:
    """Each field a run of `entry` records, with the first section holding it (--seed: the GA's)."""
    fields: dict[str, SettingsSection[Any]] = {}
    for section in registry.run_sections(entry.name):
        for name in section.field_names:
            fields.setdefault(name, section)
    return fields


def within(bound: Bound, value: Any, values: Mapping[str, Any]) -> Any:
    """A value other than `value` that `bound` admits (`values`: the other fields' new ones)."""
    high = values[bound.high] if isinstance(bound.high, str) else bound.high
    if bound.integer:
        up = value + 1
        fits = high is None or up < high or (up == high and not bound.high_open)
        return up if fits else value - 1
    if high is not None:
        return (value + high) / 2
    return value * 1.5 if value else 1.0


def outside(bound: Bound) -> Any:
    """A value `bound` refuses."""
    if bound.integer:
        return bound.low - 1
    return float(bound.low) if bound.low_open else bound.low - 1.0


def changed_settings(entry: registry.Entry) -> dict[str, Any]:
    """A value for every field of the entry's sections other than the CartPole preset's.

    A switch that does not fit this algorithm (observation_norm beyond plain ES) must be
    refused naming it, and keeps its preset value.
    """
    kind = inspect_env_id("CartPole-v1")
    base = preset(kind, algorithm=entry.name)
    changed: dict[str, Any] = {}
    for name, section in section_fields(entry).items():
        value = getattr(base.sections[section.name], name)
        if isinstance(value, bool):
            try:
                preset(kind, algorithm=entry.name, **{name: not value})
            except ValueError as error:
                assert name in str(error), f"{name}: {error}"
                continue
            changed[name] = not value
            continue
        bound = bounds(section.settings).get(name)
        assert bound is not None, f"{section.name} settings: declare {name}'s bound (bounded)"
        changed[name] = within(bound, value, changed)
    return changed


def flag_argv(flag: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag.removeprefix("--")]
    return [f"{flag}={value!r}"]


def assert_changed(config: RunConfig, base: RunConfig, changed: Mapping[str, Any]) -> None:
    """Every section of `config` holds the changed values, each other than in `base`."""
    assert config.sections.keys() == base.sections.keys()
    for section, settings in config.sections.items():
        for name, value in changed.items():
            if hasattr(settings, name):
                before = getattr(base.sections[section], name)
                assert getattr(settings, name) == value != before, (section, name)


def test_settings_round_trip_from_the_command_line_through_config_json_and_a_checkpoint(
    entry, tmp_path
) -> None:
    changed = changed_settings(entry)
    flags = {setting.name: setting.flag for setting in _settings()}
    argv = ["--env", "CartPole-v1", "--algo", entry.name]
    for name, value in changed.items():
        if name in flags:
            argv += flag_argv(flags[name], value)
    parser = build_parser()
    from_flags, resume = _resolve_config(parser, parser.parse_args(argv), tmp_path / "new")
    assert resume is None
    given = {name: value for name, value in changed.items() if name in flags}
    kind = inspect_env_id("CartPole-v1")
    base = preset(kind, algorithm=entry.name)
    assert_changed(from_flags, base, given)
    assert from_flags == preset(kind, algorithm=entry.name, run_id=from_flags.run_id, **given)
    # The fields that are no flag (Adam's moments) change through the same preset.
    config = preset(kind, algorithm=entry.name, **changed)
    assert_changed(config, base, changed)
    directory = RunDirectory(tmp_path / "run")
    directory.write_config(config.to_dict())
    assert RunConfig.from_dict(json.loads(directory.config_path.read_text())) == config
    section = {"name": entry.name, "state": {"generation": 0}}
    save_checkpoint(directory.path, {"config": config.to_dict(), "algorithm": section})
    payload = load_checkpoint(directory.path)
    assert payload is not None and resume_config(payload) == config


def test_a_bad_value_of_each_setting_is_refused_naming_it(entry, tmp_path, capsys) -> None:
    kind = inspect_env_id("CartPole-v1")
    document = preset(kind, algorithm=entry.name).to_dict()
    flags = {setting.name: setting.flag for setting in _settings()}
    parser = build_parser()
    for name, section in section_fields(entry).items():
        bound = bounds(section.settings).get(name)
        if bound is None:
            continue  # a switch: changed_settings holds every other field to a bound
        bad = outside(bound)
        message = rf"^{name} must .*, got {re.escape(str(bad))}$"
        with pytest.raises(ValueError, match=message):
            preset(kind, algorithm=entry.name, **{name: bad})
        # As a checkpoint or a hand-edited config.json would hold it.
        saved = json.loads(json.dumps(document))
        saved[section.name][name] = bad
        with pytest.raises(ValueError, match=message):
            RunConfig.from_dict(saved)
        if name in flags:
            argv = ["--env", "CartPole-v1", "--algo", entry.name, *flag_argv(flags[name], bad)]
            with pytest.raises(SystemExit) as exit_info:
                _resolve_config(parser, parser.parse_args(argv), tmp_path / "new")
            assert exit_info.value.code == 2
            assert f"{name} must" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_each_section_name_is_one_section_and_every_section_is_registered() -> None:
    by_name: dict[str, SettingsSection[Any]] = {}
    for entry in registry.REGISTRY.values():
        for section in entry.sections:
            assert by_name.setdefault(section.name, section) is section, section.name
    assert tuple(by_name.values()) == registry.SECTIONS
    # What every run records comes first: config.json has held the GA's section since before
    # there were others, and its --seed is every section's.
    assert [section.every_run for section in registry.SECTIONS][:1] == [True]


# --- no I/O ----------------------------------------------------------------------------------


def test_no_algorithm_module_loads_the_noise_table_or_builds_an_env() -> None:
    """master.run.algorithm_setup hands the entries the table and the env's spaces.

    import-linter keeps env builders out of master.algorithms; neuro.noise, whose noise_offset
    the ES needs, cannot be kept out as a module, so its loader is looked for here by name.
    """
    loaders = {"load_noise_table", "NoiseTableSpec", "make_env", "default_cache_dir"}
    for path in sorted(Path(registry.__file__).parent.glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                names.update(alias.name for alias in node.names)
        assert not names & loaders, f"{path.name} uses {sorted(names & loaders)}"
