"""A study file: a named grid of runs (envs x seeds x settings), each checked into the RunConfig
it will run, the whole file before anything starts.

A study is TOML (docs/algorithms.md, "Studies"):

    name = "laptop"
    max_concurrent_runs = 2        # runs served at once; the rest wait their turn
    test_episodes = 10             # the final elite's fresh test episodes (default 30)

    [settings]                     # every run's, named as neuro-master's flags name them
    population_size = 40

    [budget]                       # every run's: generations, frames, target_score, no_target
    frames = 1_500_000

    [[grid]]                       # envs x seeds, each with these settings and budget on top
    envs = ["Frostbite-v4"]
    seeds = [0, 1]                 # or a count: seeds = 2 is [0, 1]
    label = "small"                # optional, part of the derived names
    settings = { truncation = 8 }
    budget = { frames = 1_000_000 }

    [[run]]                        # one run, named or derived
    env = "CartPole-v1"
    seed = 4

Settings go through master.config.checked_settings and preset, as the flags do, so the names,
bounds and errors are the flags'. Every error names the run (or the table) and the value.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from master.config import RunConfig, checked_settings, config_from_settings

MAX_STUDY_BYTES = 1 << 20
"""A study file is read only up to this size: a bigger one is refused before it is parsed."""
MAX_RUNS = 1000
"""Runs one study may hold (the paper's table is 65): each is a run dir and a queue entry."""
MAX_CONCURRENT_RUNS = 256
"""The most runs a study may serve at once (max_concurrent_runs)."""
DEFAULT_CONCURRENT_RUNS = 4
MAX_STUDY_EVALUATIONS = 1_000_000
"""Evaluations the runs served at once may ask for in one generation together: the master
keeps about 1 KB of bookkeeping for each (master.config.MAX_EVALUATIONS_PER_GENERATION), so
about 1 GB at most."""
MAX_FRAMES = 10**11
"""A run's frames budget at most: 100 times the paper's 1B."""
MAX_GENERATIONS = 10**6
MAX_TEST_EPISODES = 1000
DEFAULT_TEST_EPISODES = 30
"""The final elite's fresh test episodes (as the paper scores its table)."""
SEED_LIMIT = 2**63
"""Seeds are those of numpy's generators (master.algorithms.settings.SEED)."""

BUDGET_NAMES = ("generations", "frames", "target_score", "no_target")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""A study's or a run's name: a directory name on every filesystem."""
LABEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}")
READY_STUDIES = ("master", "studies")
"""Where the ready studies ship (the master package's data): `--study laptop` is laptop.toml."""

_STUDY_KEYS = {"name", "max_concurrent_runs", "test_episodes", "settings", "budget", "grid", "run"}
_GRID_KEYS = {"envs", "seeds", "label", "settings", "budget", "test_episodes"}
_RUN_KEYS = {"env", "seed", "name", "label", "settings", "budget", "test_episodes"}


class StudyError(ValueError):
    """A study file that cannot run, and why, naming the run or table and the value."""


@dataclass(frozen=True)
class StudyRun:
    """One run of a study: what study.json records of it, and the config it runs."""

    name: str
    env: str
    seed: int
    label: str
    """"" where the run has none."""
    settings: Mapping[str, Any]
    """Its settings as the file gives them (the study's, then its table's), by field name,
    typed and each in bounds; the seed and the budget are not among them."""
    budget: Mapping[str, Any]
    """generations, frames, target_score and no_target, as the file gives them."""
    test_episodes: int
    config: RunConfig = field(compare=False)
    """The run's config: settings, seed and budget through the flags' preset."""

    def record(self) -> dict[str, Any]:
        """The run as study.json records it (JSON values)."""
        settings = {k: list(v) if isinstance(v, tuple) else v for k, v in self.settings.items()}
        return {
            "name": self.name,
            "env": self.env,
            "seed": self.seed,
            "label": self.label,
            "settings": settings,
            "budget": dict(self.budget),
            "test_episodes": self.test_episodes,
        }


@dataclass(frozen=True)
class Study:
    """A checked study: its runs in the file's order (grids first, then the [[run]] tables)."""

    name: str
    max_concurrent_runs: int
    runs: tuple[StudyRun, ...]
    text: str
    """The file as given, which the study dir keeps a copy of."""
    origin: str
    """Where it was read from (a path, or the ready study's name)."""

    def run(self, name: str) -> StudyRun:
        """The run of this name; KeyError naming it otherwise."""
        for run in self.runs:
            if run.name == name:
                return run
        raise KeyError(f"study {self.name} has no run {name!r}")


def ready_studies() -> tuple[str, ...]:
    """The studies that ship with neuro, by name."""
    files = _ready_folder().iterdir()
    return tuple(sorted(p.name.removesuffix(".toml") for p in files if p.name.endswith(".toml")))


def _ready_folder() -> Traversable:
    package, folder = READY_STUDIES
    return resources.files(package).joinpath(folder)


def load_study(spec: str, batched: bool = False) -> Study:
    """The study a path or a ready study's name (`paper`, `laptop`) names, checked whole.

    `batched`: the run's workers are the batched (GPU) runner, as preset takes it. StudyError
    (a ValueError) naming the file, the run and the value if it cannot run.
    """
    path = Path(spec)
    if path.is_file():
        with path.open("rb") as handle:
            data = handle.read(MAX_STUDY_BYTES + 1)
        origin = str(path)
    elif spec in ready_studies():
        data = _ready_folder().joinpath(f"{spec}.toml").read_bytes()
        origin, path = spec, Path(f"{spec}.toml")
    else:
        ready = ", ".join(ready_studies())
        raise StudyError(f"no study file {spec!r}, and no ready study of that name ({ready})")
    if len(data) > MAX_STUDY_BYTES:
        raise StudyError(f"study {origin}: more than {MAX_STUDY_BYTES} bytes; is it a study?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise StudyError(f"study {origin}: not UTF-8 text ({error.reason})") from None
    return parse_study(text, origin, default_name=path.stem, batched=batched)


def parse_study(
    text: str, origin: str = "study.toml", default_name: str = "", batched: bool = False
) -> Study:
    """A study from its TOML text, every run checked into its RunConfig; StudyError naming
    `origin`, the run and the value otherwise. A study without a name is named `default_name`,
    else after `origin`'s file name."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise StudyError(f"study {origin}: not TOML: {error}") from None
    try:
        return _study(document, text, origin, default_name or Path(origin).stem, batched)
    except StudyError as error:
        raise StudyError(f"study {origin}: {error}") from None


def _study(
    document: dict[str, Any], text: str, origin: str, default_name: str, batched: bool
) -> Study:
    _known_keys(document, _STUDY_KEYS, "the study")
    name = document.get("name", default_name)
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise StudyError(f"name must be letters, digits, '.', '_' or '-' (at most 100), "
                         f"got {name!r}")  # fmt: skip
    concurrent = _integer(document, "max_concurrent_runs", DEFAULT_CONCURRENT_RUNS,
                          1, MAX_CONCURRENT_RUNS, "the study")  # fmt: skip
    test_episodes = _integer(document, "test_episodes", DEFAULT_TEST_EPISODES, 1,
                             MAX_TEST_EPISODES, "the study")  # fmt: skip
    settings = _table(document, "settings", "the study")
    budget = _table(document, "budget", "the study")
    _settings_only(settings, "the study's [settings]")
    _budget_only(budget, "the study's [budget]")
    grids = _tables(document, "grid")
    singles = _tables(document, "run")
    if not grids and not singles:
        raise StudyError("no runs: give a [[grid]] (envs x seeds) or a [[run]]")
    planned = _planned(grids, singles)
    defaults = _Defaults(settings, budget, test_episodes)
    runs = [_run(plan, defaults, batched) for plan in planned]
    _unique(runs)
    _fits_in_memory(runs, concurrent)
    return Study(name, concurrent, tuple(runs), text, origin)


@dataclass(frozen=True)
class _Defaults:
    settings: Mapping[str, Any]
    budget: Mapping[str, Any]
    test_episodes: int


@dataclass(frozen=True)
class _Plan:
    """One run as its table gives it, before it is checked."""

    where: str
    """The table, in words: "[[grid]] 2", "[[run]] 1"."""
    env: Any
    seed: Any
    table: Mapping[str, Any]
    name: Any = None


def _planned(grids: list[dict[str, Any]], singles: list[dict[str, Any]]) -> list[_Plan]:
    """Every run the tables name, counted before any is made: a grid of absurd size is
    refused before its runs are."""
    sizes = []
    for i, grid in enumerate(grids, 1):
        where = f"[[grid]] {i}"
        _known_keys(grid, _GRID_KEYS, where)
        envs = grid.get("envs")
        if isinstance(envs, str):
            envs = [envs]
        if not isinstance(envs, list) or not envs:
            raise StudyError(f"{where}: envs must be a list of env ids, got {envs!r}")
        seeds = _seeds(grid.get("seeds", 1), where)
        sizes.append((where, envs, seeds, grid))
    total = sum(len(envs) * len(seeds) for _, envs, seeds, _ in sizes) + len(singles)
    if total > MAX_RUNS:
        raise StudyError(f"{total} runs: a study holds at most {MAX_RUNS}")
    plans = [
        _Plan(where, env, seed, grid) for where, envs, seeds, grid in sizes
        for env in envs for seed in seeds
    ]  # fmt: skip
    for i, single in enumerate(singles, 1):
        where = f"[[run]] {i}"
        _known_keys(single, _RUN_KEYS, where)
        if "env" not in single:
            raise StudyError(f'{where}: give its env (env = "Frostbite-v4")')
        plans.append(_Plan(where, single["env"], single.get("seed", 0), single,
                           single.get("name")))  # fmt: skip
    return plans


def _seeds(value: Any, where: str) -> list[int]:
    if _is_int(value):
        if not 1 <= value <= MAX_RUNS:
            raise StudyError(f"{where}: seeds = N must be in [1, {MAX_RUNS}], got {value}")
        return list(range(value))
    if not isinstance(value, list) or not value or len(value) > MAX_RUNS:
        raise StudyError(f"{where}: seeds must be a list of 1 to {MAX_RUNS} seeds or a count, "
                         f"got {_short(value)}")  # fmt: skip
    for seed in value:
        if not _is_int(seed) or not 0 <= seed < SEED_LIMIT:
            raise StudyError(f"{where}: a seed must be an integer in [0, 2**63), got {seed!r}")
    if len(set(value)) != len(value):
        raise StudyError(f"{where}: seeds repeat: {value}")
    return value


def _run(plan: _Plan, defaults: _Defaults, batched: bool) -> StudyRun:
    table, where = plan.table, plan.where
    env = plan.env
    if not isinstance(env, str) or not env:
        raise StudyError(f"{where}: an env must be an env id, got {env!r}")
    label = table.get("label", "")
    if label != "" and (not isinstance(label, str) or not LABEL_PATTERN.fullmatch(label)):
        raise StudyError(f"{where}: label must be letters, digits, '_' or '-' (at most 40), "
                         f"got {label!r}")  # fmt: skip
    seed = plan.seed
    if not _is_int(seed) or not 0 <= seed < SEED_LIMIT:
        raise StudyError(f"{where}: seed must be an integer in [0, 2**63), got {seed!r}")
    name = plan.name if plan.name is not None else derived_name(env, label, seed)
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise StudyError(f"{where}: a run's name must be letters, digits, '.', '_' or '-' "
                         f"(at most 100), got {name!r}")  # fmt: skip
    run = f"run {name} ({where})"
    own_settings = _table(table, "settings", run)
    own_budget = _table(table, "budget", run)
    _settings_only(own_settings, f"{run}: its settings")
    _budget_only(own_budget, f"{run}: its budget")
    test_episodes = _integer(table, "test_episodes", defaults.test_episodes, 1,
                             MAX_TEST_EPISODES, run)  # fmt: skip
    budget = _merged_budget(defaults.budget, own_budget)
    try:
        settings = checked_settings({**defaults.settings, **own_settings})
        checked_budget = checked_settings(budget)
        _budget_bounds(checked_budget)
        config = config_from_settings(env, {**settings, **checked_budget, "seed": seed}, batched)
    except (ValueError, TypeError) as error:
        raise StudyError(f"{run}: {error}") from None
    return StudyRun(name, env, seed, label, settings, budget, test_episodes, config)


def derived_name(env: str, label: str, seed: int) -> str:
    """`<env-slug>-<label>-s<seed>` (`frostbite-v4-s0`, `ale-pong-v5-small-s2`)."""
    slug = re.sub(r"[^a-z0-9]+", "-", env.lower()).strip("-") or "env"
    return "-".join(part for part in (slug, label, f"s{seed}") if part)


def _merged_budget(study: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """The study's budget with the run's on top: a target or no_target replaces the other."""
    merged = dict(study)
    if "target_score" in own or "no_target" in own:
        merged.pop("target_score", None)
        merged.pop("no_target", None)
    merged.update(own)
    return merged


def _budget_bounds(budget: Mapping[str, Any]) -> None:
    for name, high in (("generations", MAX_GENERATIONS), ("frames", MAX_FRAMES)):
        value = budget.get(name)
        if value is not None and not 1 <= value <= high:
            raise ValueError(f"{name} must be in [1, {high:,}], got {value:,}")
    if "generations" not in budget and "frames" not in budget:
        raise ValueError(
            "no budget: give generations or frames (a target score alone may never be reached)"
        )
    if budget.get("no_target") and "target_score" in budget:
        raise ValueError("target_score and no_target = true contradict each other")


def _settings_only(settings: Mapping[str, Any], where: str) -> None:
    if "seed" in settings:
        raise StudyError(f"{where}: seed is the grid's (seeds = [...]) or the run's (seed = N)")
    budget = sorted(set(settings) & set(BUDGET_NAMES))
    if budget:
        raise StudyError(f"{where}: {budget} belong in the budget table, not the settings")


def _budget_only(budget: Mapping[str, Any], where: str) -> None:
    other = sorted(set(budget) - set(BUDGET_NAMES))
    if other:
        raise StudyError(f"{where}: {other} are no budget (a budget is {list(BUDGET_NAMES)})")


def _unique(runs: Sequence[StudyRun]) -> None:
    """Run names are directory names: unique, whatever the filesystem's case rule."""
    seen: dict[str, StudyRun] = {}
    for run in runs:
        other = seen.setdefault(run.name.lower(), run)
        if other is not run:
            raise StudyError(
                f"run {run.name}: the name is given twice (env {other.env} seed {other.seed} "
                f"and env {run.env} seed {run.seed}); give one a label or a name"
            )


def _fits_in_memory(runs: Sequence[StudyRun], concurrent: int) -> None:
    """The largest generations that may run at once must fit the master's bookkeeping."""
    sizes = sorted((run.config.evaluations_per_generation for run in runs), reverse=True)
    total = sum(sizes[:concurrent])
    if total > MAX_STUDY_EVALUATIONS:
        raise StudyError(
            f"max_concurrent_runs = {concurrent}: its largest runs' generations ask for "
            f"{total:,} evaluations at once, more than the master holds ({MAX_STUDY_EVALUATIONS:,}"
            ", about 1 KB each); serve fewer runs at once"
        )


def _known_keys(table: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise StudyError(f"{where}: unknown key {unknown[0]!r} (known: {sorted(known)})")


def _table(document: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = document.get(key, {})
    if not isinstance(value, dict):
        raise StudyError(f"{where}: {key} must be a table ({key} = {{ ... }}), got {value!r}")
    return value


def _tables(document: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = document.get(key, [])
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise StudyError(f"{key} must be tables ([[{key}]]), got {_short(value)}")
    return value


def _integer(
    table: Mapping[str, Any], key: str, default: int, low: int, high: int, where: str
) -> int:
    value = table.get(key, default)
    if not _is_int(value) or not low <= value <= high:
        raise StudyError(f"{where}: {key} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
