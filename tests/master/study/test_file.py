"""Study files: parsing, the grid's runs and their names, every refusal naming the run and the
value, and the ready studies."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from master.cli import _settings
from master.config import inspect_env_id, preset, setting_aliases, setting_types
from master.study.file import (
    MAX_RUNS,
    StudyError,
    derived_name,
    load_study,
    parse_study,
    ready_studies,
)

REPO = Path(__file__).resolve().parents[3]

EXAMPLE = """
name = "example"
max_concurrent_runs = 2
test_episodes = 12

[settings]
population_size = 30
truncation = 5

[budget]
generations = 4

[[grid]]
envs = ["CartPole-v1", "ALE/Pong-v5"]
seeds = [3, 7]
label = "wide"
settings = { truncation = 10, hidden = [16, 16] }
budget = { frames = 200_000 }

[[grid]]
envs = "neuro/Memorize-K10-v0"
seeds = 2
budget = { target_score = 0 }

[[run]]
env = "CartPole-v1"
seed = 11
name = "cartpole-es"
settings = { algorithm = "es", pairs = 8 }
test_episodes = 3
"""


def study_with(body: str, head: str = "") -> str:
    """A small study: `head` at the top, then one grid of CartPole's two seeds with `body`."""
    return f'{head}\n[budget]\ngenerations = 2\n[[grid]]\nenvs = ["CartPole-v1"]\nseeds = 2\n{body}'


def test_a_study_file_becomes_its_runs_each_with_its_config() -> None:
    study = parse_study(EXAMPLE, "example.toml")
    assert (study.name, study.max_concurrent_runs, study.text) == ("example", 2, EXAMPLE)
    names = [run.name for run in study.runs]
    # Grids in order, envs x seeds, then the [[run]] tables.
    assert names == [
        "cartpole-v1-wide-s3", "cartpole-v1-wide-s7", "ale-pong-v5-wide-s3", "ale-pong-v5-wide-s7",
        "neuro-memorize-k10-v0-s0", "neuro-memorize-k10-v0-s1", "cartpole-es",
    ]  # fmt: skip
    wide = study.run("cartpole-v1-wide-s7")
    assert (wide.env, wide.seed, wide.label, wide.test_episodes) == ("CartPole-v1", 7, "wide", 12)
    # The study's settings, the grid's on top; names as the fields', values typed.
    assert wide.settings == {"population_size": 30, "truncation": 10, "hidden_sizes": (16, 16)}
    assert wide.budget == {"generations": 4, "frames": 200_000}
    config = wide.config
    assert (config.ga.population_size, config.ga.truncation) == (30, 10)
    assert config.hidden_sizes == (16, 16)
    assert (config.seed, config.generations, config.frames) == (7, 4, 200_000)
    assert config.target_score == 475.0  # the env's, as the flags leave it
    pong = study.run("ale-pong-v5-wide-s3").config
    assert pong.atari and pong.architecture == "deepga" and pong.ga.population_size == 30
    memorize = study.run("neuro-memorize-k10-v0-s1")
    assert memorize.budget == {"generations": 4, "target_score": 0}
    assert memorize.config.target_score == 0.0 and memorize.config.seed == 1
    es = study.run("cartpole-es")
    assert es.config.algorithm == "es" and es.config.es.pairs == 8 and es.config.seed == 11
    assert es.test_episodes == 3 and es.label == ""


def test_settings_become_the_config_the_flags_would_make() -> None:
    """The same preset and checks as neuro-master's flags: equal configs but for the run id."""
    study = parse_study(study_with('settings = { mutation_power = 0.1, policy = "mlp" }'))
    run = study.runs[1]
    flags = preset(inspect_env_id("CartPole-v1"), mutation_power=0.1, architecture="mlp",
                   generations=2, seed=1, run_id=run.config.run_id)  # fmt: skip
    assert run.config == flags


@pytest.mark.parametrize(
    ("env", "label", "seed", "name"),
    [
        ("Frostbite-v4", "", 0, "frostbite-v4-s0"),
        ("ALE/Frostbite-v5", "paper", 4, "ale-frostbite-v5-paper-s4"),
        ("neuro/MemorizeUntilMistake-K32-D8-S3-v0", "", 12,
         "neuro-memorizeuntilmistake-k32-d8-s3-v0-s12"),
    ],
)  # fmt: skip
def test_derived_names(env: str, label: str, seed: int, name: str) -> None:
    assert derived_name(env, label, seed) == name


# Each refusal: the study text, and what the error must say (run, table and value).
REFUSALS = {
    "unknown env": (
        'budget = { generations = 2 }\n[[grid]]\nenvs = ["Frostbit-v4"]',
        r"run frostbit-v4-s0 \(\[\[grid\]\] 1\): unknown env id 'Frostbit-v4'",
    ),
    "bad setting value": (
        study_with("settings = { population_size = 1 }"),
        r"run cartpole-v1-s0 \(\[\[grid\]\] 1\): population_size must be >= 2, got 1$",
    ),
    "bad setting type": (
        study_with('settings = { population_size = "50" }'),
        r"run cartpole-v1-s0 .*: population_size must be an integer, got '50'",
    ),
    "bad bound of the run's own": (
        study_with("settings = { lease_seconds = 0 }"),
        r"run cartpole-v1-s0 .*: lease_seconds must be a positive, finite .*got 0.0",
    ),
    "unknown setting": (
        study_with("settings = { populaton = 50 }"),
        r"run cartpole-v1-s0 .*: unknown setting 'populaton' \(did you mean population",
    ),
    "another algorithm's setting": (
        study_with("settings = { pairs = 8 }"),
        r"run cartpole-v1-s0 .*: \['pairs'\] are ES settings",
    ),
    "a setting twice": (
        study_with("settings = { population = 8, population_size = 9 }"),
        r"population_size is given twice \(as population and as population_size\)",
    ),
    "duplicate run name": (
        study_with('[[run]]\nenv = "CartPole-v1"\nseed = 1'),
        r"run cartpole-v1-s1: the name is given twice \(env CartPole-v1 seed 1 and env "
        r"CartPole-v1 seed 1\)",
    ),
    "names equal but for case": (
        study_with('[[run]]\nenv = "CartPole-v1"\nname = "CARTPOLE-V1-S0"'),
        r"run CARTPOLE-V1-S0: the name is given twice",
    ),
    "too many seeds": (study_with("", "").replace("seeds = 2", "seeds = 2000"),
                       r"\[\[grid\]\] 1: seeds = N must be in \[1, 1000\], got 2000"),
    "too many runs": (
        study_with("").replace("seeds = 2", f"seeds = {MAX_RUNS}").replace(
            '["CartPole-v1"]', '["CartPole-v1", "Acrobot-v1"]'),
        r"2000 runs: a study holds at most 1000",
    ),
    "too many at once": (study_with("", "max_concurrent_runs = 10_000"),
                         r"the study: max_concurrent_runs must be an integer in \[1, 256\], "
                         r"got 10000"),
    "none at once": (study_with("", "max_concurrent_runs = 0"),
                     r"max_concurrent_runs must be an integer in \[1, 256\], got 0"),
    "too much at once": (
        study_with("settings = { population_size = 200_000, elite_candidates = 1, "
                   "elite_episodes = 1 }", "max_concurrent_runs = 20")
        .replace("seeds = 2", "seeds = 6"),
        r"max_concurrent_runs = 20: its largest runs' generations ask for 1,200,006 evaluations",
    ),
    "too many frames": (
        study_with("budget = { frames = 1_000_000_000_000 }"),
        r"run cartpole-v1-s0 .*: frames must be in \[1, 100,000,000,000\], got "
        r"1,000,000,000,000",
    ),
    "no generations": (study_with("budget = { generations = 0 }"),
                       r"run cartpole-v1-s0 .*: generations must be in \[1, 1,000,000\], got 0"),
    "no budget": (
        'budget = { target_score = 400 }\n[[grid]]\nenvs = ["CartPole-v1"]',
        r"run cartpole-v1-s0 .*: no budget: give generations or frames",
    ),
    "a bad target": (study_with('budget = { target_score = "high" }'),
                     r"run cartpole-v1-s0 .*: target_score must be a number, got 'high'"),
    "too many test episodes": (study_with("test_episodes = 5000"),
                               r"run cartpole-v1-s0 .*: test_episodes must be an integer in "
                               r"\[1, 1000\], got 5000"),
    "seed in settings": (study_with("settings = { seed = 3 }"),
                         r"run cartpole-v1-s0 .*: seed is the grid's"),
    "budget in settings": (
        study_with("", "[settings]\nframes = 3"),
        r"the study's \[settings\]: \['frames'\] belong in the budget table",
    ),
    "a bad seed": (study_with("").replace("seeds = 2", "seeds = [1, -2]"),
                   r"\[\[grid\]\] 1: a seed must be an integer in \[0, 2\*\*63\), got -2"),
    "repeated seeds": (study_with("").replace("seeds = 2", "seeds = [1, 1]"),
                       r"\[\[grid\]\] 1: seeds repeat: \[1, 1\]"),
    "a bad label": (study_with('label = "a/b"'), r"\[\[grid\]\] 1: label must be .*got 'a/b'"),
    "a path as a name": (
        'budget = { generations = 2 }\n[[run]]\nenv = "CartPole-v1"\nname = "../escape"',
        r"\[\[run\]\] 1: a run's name must be .*got '../escape'",
    ),
    "unknown key": (study_with("", "grids = 3"), r"the study: unknown key 'grids'"),
    "unknown grid key": (study_with("env = 'x'"), r"\[\[grid\]\] 1: unknown key 'env'"),
    "no runs": ('name = "empty"', r"no runs: give a \[\[grid\]\]"),
    "not TOML": ("envs = [", r"not TOML"),
    "a study name that is no dir name": (study_with("", 'name = "a b"'),
                                         r"name must be letters, .*got 'a b'"),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSALS)
def test_a_study_that_cannot_run_is_refused_naming_the_run_and_the_value(case: str) -> None:
    text, message = REFUSALS[case]
    with pytest.raises(StudyError, match=r"^study bad\.toml: .*" + message) as error:
        parse_study(text, "bad.toml")
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize(
    ("name", "value"),
    [("population_size", 1), ("mutation_power", -0.5), ("elite_episodes", 0),
     ("noise_table_size", 0), ("max_episode_steps", -1), ("episodes_per_task", 0)],
)  # fmt: skip
def test_a_bad_value_is_refused_with_the_words_the_flags_use(name: str, value: float) -> None:
    kind = inspect_env_id("CartPole-v1")
    with pytest.raises(ValueError) as flags:
        preset(kind, **{name: value})
    with pytest.raises(StudyError) as study:
        parse_study(study_with(f"settings = {{ {name} = {value} }}"))
    assert str(study.value).endswith(f"run cartpole-v1-s0 ([[grid]] 1): {flags.value}")


def test_a_file_too_big_to_be_a_study_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "huge.toml"
    path.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(StudyError, match=r"huge.toml: more than 1048576 bytes"):
        load_study(str(path))


def test_a_study_is_named_by_its_path_or_as_a_ready_one(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(study_with(""))
    study = load_study(str(path))
    assert (study.name, study.origin) == ("mine", str(path))  # a file without a name: its stem
    with pytest.raises(StudyError, match=r"no study file 'nosuch', and no ready study of that "
                       r"name \(laptop, paper\)"):  # fmt: skip
        load_study("nosuch")


PAPER_GAMES = ("Amidar", "Assault", "Asterix", "Asteroids", "Atlantis", "Enduro", "Frostbite",
               "Gravitar", "Kangaroo", "Seaquest", "Skiing", "Venture", "Zaxxon")  # fmt: skip
"""Such et al. (2017), Table 1."""


def test_the_paper_study_is_the_papers_table() -> None:
    study = load_study("paper")
    assert len(study.runs) == 13 * 5
    assert {run.env for run in study.runs} == {f"{game}-v4" for game in PAPER_GAMES}
    assert {run.seed for run in study.runs} == set(range(5))
    for run in study.runs:
        config = run.config
        assert config.atari and config.architecture == "deepga" and config.algorithm == "ga"
        ga = config.ga
        assert (ga.population_size, ga.truncation, ga.mutation_power) == (1000, 20, 0.002)
        assert (ga.elite_candidates, ga.elite_episodes) == (10, 30)
        assert (config.frames, config.generations, config.target_score) == (10**9, None, None)
        assert config.max_episode_steps == 5000 and run.test_episodes == 30


def test_the_laptop_study_is_small() -> None:
    study = load_study("laptop")
    assert 2 <= len({run.env for run in study.runs}) <= 3 < len(study.runs)
    atari = [run.config for run in study.runs if run.config.atari]
    assert atari and all(c.frames is not None and c.frames <= 3_000_000 for c in atari)
    assert all(c.ga.population_size <= 100 for c in atari)
    others = [run.config for run in study.runs if not run.config.atari]
    assert all(c.generations is not None and c.generations <= 100 for c in others)


def test_the_ready_studies_ship_as_package_data() -> None:
    assert set(ready_studies()) == {"laptop", "paper"}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["master"]
    shipped = {p.name for pattern in patterns for p in (REPO / "master").glob(pattern)}
    assert {f"{name}.toml" for name in ready_studies()} <= shipped
    for name in ready_studies():  # every ready study checks out as given
        text = (REPO / "master" / "studies" / f"{name}.toml").read_text()
        assert re.search(rf'^name = "{name}"$', text, re.MULTILINE)
        assert parse_study(text).name == name


def test_a_study_names_its_settings_as_the_flags_do() -> None:
    """Every flag that sets a run's setting is a study setting, by its field's name and by the
    flag's own where they differ; no other name is."""
    flags = {setting.name: setting.flag for setting in _settings()}
    assert set(setting_types()) == set(flags)
    spelled = {flag.removeprefix("--").replace("-", "_"): name for name, flag in flags.items()}
    assert setting_aliases() == {alias: name for alias, name in spelled.items() if alias != name}


def test_the_documented_example_is_a_study() -> None:
    text = (REPO / "docs" / "algorithms.md").read_text()
    section = text[text.index("### The study file") :]
    example = section[section.index("```toml") + len("```toml") : section.index("```\n", 10)]
    study = parse_study(example, "docs.toml")
    assert study.name == "frostbite-sweep" and len(study.runs) == 2 * 3 + 3 + 1
    assert study.run("frostbite-v4-t10-s2").config.frames == 20_000_000
    assert study.run("frostbite-v4-t40-s0").config.ga.truncation == 40
    assert study.run("frostbite-long").config.frames == 200_000_000
