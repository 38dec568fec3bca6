"""What `neuro-deploy estimate --study FILE` prices: a study file's runs, their budgets and
generations, read with the standard library's tomllib.

deploy/ imports nothing of the master, so this reads only what pricing needs (envs, seeds,
each run's budget, its population and elite settings, the cap on runs at once) by the rules
docs/algorithms.md ("Studies") gives the file: the study's [settings] and [budget] under each
[[grid]]'s and [[run]]'s own. The master checks the whole file (`neuro-master --study FILE
--dry-run`); the bounds here are its own (tests/deploy/test_study_pricing.py holds them equal).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.stack import DeployError

MAX_STUDY_BYTES = 1 << 20
MAX_RUNS = 1000
MAX_CONCURRENT_RUNS = 256
DEFAULT_CONCURRENT_RUNS = 4
MAX_FRAMES = 10**11
MAX_GENERATIONS = 10**6
MAX_TEST_EPISODES = 1000
DEFAULT_TEST_EPISODES = 30
MAX_POPULATION = 1_000_000
MAX_ELITE = 100_000
ATARI_GENERATION = {"population_size": 1000, "elite_candidates": 10, "elite_episodes": 30}
"""The paper's GA, the master's Atari default, where a study does not set its own."""
SETTING_NAMES = {"population_size": ("population_size", "population"),
                 "elite_candidates": ("elite_candidates",),
                 "elite_episodes": ("elite_episodes",)}  # fmt: skip
"""The settings pricing reads, under each name a study may give them (the field's, the flag's)."""


@dataclass(frozen=True)
class PricedRun:
    """One run of a study, as far as its price goes."""

    name: str
    env: str
    frames: int | None
    generations: int | None
    population: int
    elite_candidates: int
    elite_episodes: int
    test_episodes: int

    @property
    def tasks_per_generation(self) -> int:
        """One-episode evaluations a generation takes: the offspring and the elite's."""
        return self.population + self.elite_candidates * self.elite_episodes

    def budget_frames(self, episode_steps: float | None) -> float:
        """Training frames of its budget: its frames, or its generations at `episode_steps`
        agent steps an episode (4 frames each), whichever ends it first."""
        limits = [] if self.frames is None else [float(self.frames)]
        if self.generations is not None:
            if episode_steps is None:
                raise DeployError(
                    f"run {self.name}: its budget is {self.generations:,} generations; "
                    "pass --episode-steps (mean agent steps an episode) to count its frames"
                )
            limits.append(self.generations * self.tasks_per_generation * episode_steps * 4)
        return min(limits)

    def test_frames(self, episode_steps: float | None) -> float:
        """Frames of its final test (not in the budget); 0 where the episode length is unknown."""
        return 0.0 if episode_steps is None else self.test_episodes * episode_steps * 4


@dataclass(frozen=True)
class PricedStudy:
    name: str
    max_concurrent_runs: int
    runs: tuple[PricedRun, ...]


def read_study(path: str) -> PricedStudy:
    """The study file at `path`; DeployError naming the run (or table) and the value."""
    file = Path(path)
    if not file.is_file():
        raise DeployError(f"--study {path}: no such file (a study file, e.g. paper.toml)")
    with file.open("rb") as handle:
        data = handle.read(MAX_STUDY_BYTES + 1)
    if len(data) > MAX_STUDY_BYTES:
        raise DeployError(f"--study {path}: more than {MAX_STUDY_BYTES} bytes; is it a study?")
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise DeployError(f"--study {path}: not a TOML file: {error}") from None
    try:
        return _study(document, file.stem)
    except DeployError as error:
        raise DeployError(f"--study {path}: {error}") from None


def _study(document: dict[str, Any], default_name: str) -> PricedStudy:
    name = document.get("name", default_name)
    cap = _integer(document, "max_concurrent_runs", DEFAULT_CONCURRENT_RUNS, 1,
                   MAX_CONCURRENT_RUNS, "the study")  # fmt: skip
    test_episodes = _integer(document, "test_episodes", DEFAULT_TEST_EPISODES, 1,
                             MAX_TEST_EPISODES, "the study")  # fmt: skip
    settings = _table(document, "settings", "the study")
    budget = _table(document, "budget", "the study")
    planned: list[tuple[str, Any, Any, Mapping[str, Any], Any]] = []
    for i, grid in enumerate(_tables(document, "grid"), 1):
        where = f"[[grid]] {i}"
        envs = grid.get("envs")
        envs = [envs] if isinstance(envs, str) else envs
        if not isinstance(envs, list) or not envs:
            raise DeployError(f"{where}: envs must be a list of env ids, got {envs!r}")
        seeds = _seeds(grid.get("seeds", 1), where)
        if len(planned) + len(envs) * len(seeds) > MAX_RUNS:
            raise DeployError(f"more than {MAX_RUNS} runs: a study holds at most {MAX_RUNS}")
        planned += [(where, env, seed, grid, None) for env in envs for seed in seeds]
    for i, single in enumerate(_tables(document, "run"), 1):
        where = f"[[run]] {i}"
        if "env" not in single:
            raise DeployError(f'{where}: give its env (env = "Frostbite-v4")')
        planned.append((where, single["env"], single.get("seed", 0), single, single.get("name")))
    if not planned:
        raise DeployError("no runs: give a [[grid]] (envs x seeds) or a [[run]]")
    if len(planned) > MAX_RUNS:
        raise DeployError(f"{len(planned)} runs: a study holds at most {MAX_RUNS}")
    runs = [
        _run(where, env, seed, table, given, settings, budget, test_episodes)
        for where, env, seed, table, given in planned
    ]
    return PricedStudy(str(name), cap, tuple(runs))


def _run(
    where: str, env: Any, seed: Any, table: Mapping[str, Any], given: Any,
    settings: Mapping[str, Any], budget: Mapping[str, Any], test_episodes: int,
) -> PricedRun:  # fmt: skip
    if not isinstance(env, str) or not env:
        raise DeployError(f"{where}: an env must be an env id, got {env!r}")
    label = table.get("label", "")
    name = given if isinstance(given, str) else derived_name(env, str(label), seed)
    run = f"run {name} ({where})"
    merged = {**settings, **_table(table, "settings", run)}
    own_budget = _table(table, "budget", run)
    merged_budget = {**budget, **own_budget}
    generation = {}
    for field, names in SETTING_NAMES.items():
        high = MAX_POPULATION if field == "population_size" else MAX_ELITE
        value = next((merged[n] for n in names if n in merged), ATARI_GENERATION[field])
        if not _is_int(value) or not 1 <= value <= high:
            raise DeployError(f"{run}: {field} must be an integer in [1, {high:,}], got {value!r}")
        generation[field] = value
    frames = merged_budget.get("frames")
    generations = merged_budget.get("generations")
    for key, value, high in (("frames", frames, MAX_FRAMES),
                             ("generations", generations, MAX_GENERATIONS)):  # fmt: skip
        if value is not None and (not _is_int(value) or not 1 <= value <= high):
            raise DeployError(f"{run}: {key} must be an integer in [1, {high:,}], got {value!r}")
    if frames is None and generations is None:
        raise DeployError(f"{run}: no budget: give generations or frames")
    return PricedRun(
        name=name,
        env=env,
        frames=frames,
        generations=generations,
        population=generation["population_size"],
        elite_candidates=generation["elite_candidates"],
        elite_episodes=generation["elite_episodes"],
        test_episodes=_integer(table, "test_episodes", test_episodes, 1, MAX_TEST_EPISODES, run),
    )


def derived_name(env: str, label: str, seed: Any) -> str:
    """A run's derived name, as the master derives it: `<env-slug>-<label>-s<seed>`."""
    slug = re.sub(r"[^a-z0-9]+", "-", env.lower()).strip("-") or "env"
    return "-".join(part for part in (slug, label, f"s{seed}") if part)


def _seeds(value: Any, where: str) -> list[Any]:
    if _is_int(value):
        if not 1 <= value <= MAX_RUNS:
            raise DeployError(f"{where}: seeds = N must be in [1, {MAX_RUNS}], got {value}")
        return list(range(value))
    if not isinstance(value, list) or not value or len(value) > MAX_RUNS:
        raise DeployError(f"{where}: seeds must be a list of 1 to {MAX_RUNS} seeds or a count")
    return value


def _integer(
    table: Mapping[str, Any], key: str, default: int, low: int, high: int, where: str
) -> int:
    value = table.get(key, default)
    if not _is_int(value) or not low <= value <= high:
        raise DeployError(f"{where}: {key} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _table(document: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = document.get(key, {})
    if not isinstance(value, dict):
        raise DeployError(f"{where}: {key} must be a table, got {value!r}")
    return value


def _tables(document: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    value = document.get(key, [])
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise DeployError(f"{key} must be tables ([[{key}]])")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
