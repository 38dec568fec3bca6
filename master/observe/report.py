"""The report's numbers: each run's outcome read from its run dir, aggregated per env (and
setting label) over seeds, beside Such et al. 2017's Table 1. Reads files, writes none.

A study dir holds study.json (the resolved runs) and runs/<name>/, each a normal run dir;
plain run dirs are read the same way. A run dir that is empty, half-written or without its
final test is reported as such, never a reason to fail: only a path that is neither a study
dir nor a run dir is refused.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from master.observe.published import Published, load_published
from neuro.runfiles import (
    CONFIG,
    FINAL_TEST,
    FINAL_TEST_FORMAT,
    METRICS,
    STUDY_JSON,
    STUDY_RUNS,
)

FINAL_TEST_SOURCE = "final test"
LAST_ELITE_SOURCE = "last elite"
"""Where a run's score comes from: its final test, or (without one) its last generation's
elite score, the mean of its re-evaluation episodes during training."""
THROUGHPUT_TABLE = ("deploy", "throughput.json")
"""The measured frames/s per vCPU that neuro-deploy prices runs with; a run dir without
worker_s gets its core-hours estimated from its frames at the figure for its net and dtype."""
INTERQUARTILE_FROM_RUNS = 4
"""With this many runs or more a curve's band is the interquartile range, else min to max."""


class ReportError(Exception):
    """A path the report cannot read as a study dir or run dir; the message names it."""


@dataclass(frozen=True)
class RunEntry:
    """One run to report: its run dir and what the study says of it (None: nothing)."""

    name: str
    path: Path
    env_id: str | None = None
    seed: int | None = None
    label: str | None = None
    state: str | None = None


@dataclass(frozen=True)
class RunOutcome:
    """What one run dir shows: its progress, its score and where it comes from, its cost."""

    name: str
    path: Path
    env_id: str | None
    seed: int | None
    label: str | None
    state: str | None
    generations: int
    """Complete generation lines in metrics.jsonl."""
    frames: int | None
    score: float | None
    score_source: str | None
    """FINAL_TEST_SOURCE, LAST_ELITE_SOURCE, or None without a score."""
    test_episodes: int | None
    core_hours: float | None
    core_hours_estimated: bool
    curve: tuple[tuple[float, float], ...]
    """(frames, elite score) per generation that has an elite score."""
    mean_curve: tuple[tuple[float, float], ...]
    """(frames, the population's mean score) per generation that has one: learning shows in it
    where the elite is at a task's cap from the first generation (CartPole)."""
    problems: tuple[str, ...]
    """What is missing or damaged in the run dir, one phrase each."""


@dataclass(frozen=True)
class Band:
    """A learning curve over seeds: median and spread of the elite score on a frames grid."""

    frames: tuple[float, ...]
    median: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    runs: tuple[int, ...]
    """How many runs reach each grid point (no run is extrapolated past its last frame)."""
    spread: str
    """"interquartile" or "min-max"."""


@dataclass(frozen=True)
class EnvSummary:
    """The runs of one env and setting label, aggregated over seeds."""

    env_id: str | None
    label: str | None
    game: str | None
    """The published table's game, or None where the env is not one of the paper's."""
    published: dict[str, float] | None
    runs: tuple[RunOutcome, ...]

    @property
    def scored(self) -> list[RunOutcome]:
        return [run for run in self.runs if run.score is not None]

    @property
    def scores(self) -> list[float]:
        return [run.score for run in self.scored if run.score is not None]

    @property
    def from_final_test(self) -> int:
        return sum(run.score_source == FINAL_TEST_SOURCE for run in self.runs)

    @property
    def from_last_elite(self) -> int:
        return sum(run.score_source == LAST_ELITE_SOURCE for run in self.runs)

    @property
    def frames(self) -> list[int]:
        return [run.frames for run in self.runs if run.frames is not None]

    @property
    def core_hours(self) -> float | None:
        """Summed over the runs that have a figure; None where none has."""
        hours = [run.core_hours for run in self.runs if run.core_hours is not None]
        return math.fsum(hours) if hours else None

    @property
    def core_hours_estimated(self) -> bool:
        return any(run.core_hours_estimated for run in self.runs)

    @property
    def core_hours_missing(self) -> int:
        """Runs with frames but no core-hours figure: the total leaves them out."""
        return sum(run.frames is not None and run.core_hours is None for run in self.runs)

    @property
    def generations(self) -> list[int]:
        return [run.generations for run in self.runs if run.generations > 0]

    def band(self, points: int = 200) -> Band | None:
        return curve_band([run.curve for run in self.runs], points)

    def mean_band(self, points: int = 200) -> Band | None:
        """The population's mean score over seeds, as band() the elite's."""
        return curve_band([run.mean_curve for run in self.runs], points)


def median_range(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(median, min, max), or None for no values."""
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


# -- reading ------------------------------------------------------------------------------------


def is_study_dir(paths: Sequence[str | Path]) -> bool:
    """Whether `paths` is one study dir (a folder holding study.json)."""
    return len(paths) == 1 and (Path(paths[0]) / STUDY_JSON).exists()


def report_entries(paths: Sequence[str | Path]) -> tuple[str | None, list[RunEntry]]:
    """The runs to report: a study dir's (one path holding study.json), or plain run dirs.

    Returns the study's name (None for run dirs) and the runs; ReportError names a path that
    is neither.
    """
    if not paths:
        raise ReportError("give a study dir or one or more run dirs")
    if is_study_dir(paths):
        return read_study(Path(paths[0]))
    entries = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise ReportError(f"{str(path)!r} is not a directory (expected a study dir or run dir)")
        if (path / STUDY_JSON).exists():
            raise ReportError(f"{str(path)!r} is a study dir: report it on its own")
        if not ((path / CONFIG).exists() or (path / METRICS).exists()):
            raise ReportError(
                f"{str(path)!r} is neither a study dir (no {STUDY_JSON}) nor a run dir "
                f"(no {CONFIG} or {METRICS})"
            )
        entries.append(RunEntry(path.resolve().name, path))
    return None, entries


def read_study(study_dir: Path) -> tuple[str | None, list[RunEntry]]:
    """A study dir's name and runs from its study.json; ReportError if it cannot be read."""
    where = study_dir / STUDY_JSON
    try:
        document = json.loads(where.read_text())
    except OSError as error:
        raise ReportError(f"cannot read {where}: {error.strerror}") from None
    except ValueError as error:
        raise ReportError(f"{where} is not JSON ({error}): not a study dir") from None
    runs = document.get("runs") if isinstance(document, dict) else None
    if isinstance(runs, dict):
        runs = [{"name": name, **entry} for name, entry in runs.items() if isinstance(entry, dict)]
    if not isinstance(runs, list) or not all(isinstance(entry, dict) for entry in runs):
        raise ReportError(f'{where} lists no runs (expected "runs": a list of objects)')
    entries = []
    for number, entry in enumerate(runs, 1):
        name = entry.get("name")
        if not isinstance(name, str) or not _is_dir_name(name):
            raise ReportError(f"{where}: run {number}'s name {name!r} is not a directory name")
        entries.append(
            RunEntry(
                name,
                study_dir / STUDY_RUNS / name,
                env_id=_text(entry.get("env", entry.get("env_id"))),
                seed=_integer(entry.get("seed")),
                label=_text(entry.get("label")) or None,
                state=_text(entry.get("state")),
            )
        )
    name = document.get("name")
    return (name if isinstance(name, str) else None), entries


def _is_dir_name(name: str) -> bool:
    # study.json names the dirs read: a name that climbs out of runs/ is refused.
    return name not in ("", ".", "..") and not any(c in name for c in "/\\\0")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """A finite number from JSON, or None (null, text, NaN, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def read_run(entry: RunEntry, throughput: dict[str, float] | None = None) -> RunOutcome:
    """One run's outcome; whatever is missing or damaged is a problem on it, never an error.

    `throughput`: frames/s per core by 'network/dtype', for the core-hours of runs without
    worker_s (None: read the measured table).
    """
    problems: list[str] = []
    path = entry.path
    readable = _listed(path, problems)
    config = _read_config(path, problems) if readable else {}
    records = _read_metrics(path / METRICS, problems) if readable else []
    last = records[-1] if records else {}
    frames = _integer(last.get("frames"))
    tested = bool(records) or (readable and (path / FINAL_TEST).exists())
    final_test = _read_final_test(path / FINAL_TEST, problems) if tested else None
    score, source, episodes = None, None, None
    if final_test is not None:
        score, source, episodes = final_test
    elif (elite := _number(last.get("elite_score"))) is not None:
        score, source = elite, LAST_ELITE_SOURCE
    core_hours, estimated = _core_hours(
        last, config, frames, problems, throughput if throughput is not None else throughputs()
    )
    curve, mean_curve = _curve(records, "elite_score"), _curve(records, "score_mean")
    return RunOutcome(
        name=entry.name,
        path=path,
        env_id=entry.env_id or _text(config.get("env_id")),
        seed=entry.seed if entry.seed is not None else _config_seed(config),
        label=entry.label,
        state=entry.state,
        generations=len(records),
        frames=frames,
        score=score,
        score_source=source,
        test_episodes=episodes,
        core_hours=core_hours,
        core_hours_estimated=estimated,
        curve=curve,
        mean_curve=mean_curve,
        problems=tuple(problems),
    )


def _curve(records: Sequence[dict[str, Any]], key: str) -> tuple[tuple[float, float], ...]:
    """(frames, records' `key`) for each record that has both."""
    return tuple(
        (float(record["frames"]), value)
        for record in records
        if (value := _number(record.get(key))) is not None
        and _number(record.get("frames")) is not None
    )


def _listed(path: Path, problems: list[str]) -> bool:
    """Whether the run dir holds files to read; a problem says why not."""
    try:
        if any(path.iterdir()):
            return True
        problems.append("empty run dir")
    except FileNotFoundError:
        problems.append("no run dir yet")
    except OSError as error:
        problems.append(f"run dir unreadable ({error.strerror})")
    return False


def _read_config(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        config = json.loads((path / CONFIG).read_text())
    except FileNotFoundError:
        problems.append(f"no {CONFIG}")
        return {}
    except (OSError, ValueError):
        problems.append(f"{CONFIG} unreadable")
        return {}
    return config if isinstance(config, dict) else {}


def _config_seed(config: dict[str, Any]) -> int | None:
    """The run seed from config.json: the first algorithm section that has one (ga, es)."""
    for section in config.values():
        if isinstance(section, dict) and (seed := _integer(section.get("seed"))) is not None:
            return seed
    return None


def _read_metrics(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The complete generation lines; a truncated last line (a run writing, or killed while it
    wrote) and any damaged line are skipped, each a problem."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        problems.append(f"no {METRICS}: no generation finished")
        return []
    except OSError as error:
        problems.append(f"{METRICS} unreadable ({error.strerror})")
        return []
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline, as complete files do
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if (record := _metrics_record(line)) is None:
            problems.append(f"{METRICS} line {number} is damaged: skipped")
        else:
            records.append(record)
    if tail.strip():
        if (record := _metrics_record(tail)) is None:
            problems.append(f"{METRICS}: half-written last line {len(lines) + 1} skipped")
        else:
            records.append(record)
    if not records and not problems:
        problems.append(f"{METRICS} holds no generation yet")
    return records


def _metrics_record(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or _integer(record.get("generation")) is None:
        return None
    frames = _integer(record.get("frames"))
    return record if frames is not None and frames >= 0 else None


def _read_final_test(path: Path, problems: list[str]) -> tuple[float, str, int | None] | None:
    """(mean score, FINAL_TEST_SOURCE, episodes) from final_test.json, or None (a problem)."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        problems.append(f"no {FINAL_TEST}: score is the last elite's")
        return None
    except (OSError, ValueError):
        problems.append(f"{FINAL_TEST} unreadable: score is the last elite's")
        return None
    if not isinstance(document, dict) or document.get("format") != FINAL_TEST_FORMAT:
        found = document.get("format") if isinstance(document, dict) else None
        problems.append(
            f"{FINAL_TEST} has format {found!r}, not {FINAL_TEST_FORMAT}: score is the last elite's"
        )
        return None
    mean = _number(document.get("mean"))
    if mean is None:
        problems.append(f"{FINAL_TEST} has no mean score: score is the last elite's")
        return None
    return mean, FINAL_TEST_SOURCE, _integer(document.get("episodes"))


def _core_hours(
    last: dict[str, Any],
    config: dict[str, Any],
    frames: int | None,
    problems: list[str],
    throughput: dict[str, float],
) -> tuple[float | None, bool]:
    """(core-hours, estimated): the fleet's worker-seconds on the run, else its frames at the
    measured rate for its net and dtype; (None, False) where neither is known."""
    worker_s = _number(last.get("worker_s"))
    if worker_s is not None:
        return worker_s / 3600.0, False
    if frames is None:
        return None, False
    key = f"{config.get('architecture')}/{config.get('inference_dtype')}"
    rate = throughput.get(key)
    if rate is None:
        problems.append(f"no worker_s and no measured throughput for {key}: core-hours unknown")
        return None, False
    return frames / (rate * 3600.0), True


def throughputs() -> dict[str, float]:
    """Measured frames/s per core by 'network/dtype' (neuro-deploy's table); {} without it."""
    package, name = THROUGHPUT_TABLE
    try:
        table = json.loads(resources.files(package).joinpath(name).read_text())
        return {
            key: float(figure["frames_per_s_per_vcpu"])
            for key, figure in table["figures"].items()
            if float(figure["frames_per_s_per_vcpu"]) > 0
        }
    except (ImportError, OSError, ValueError, KeyError, TypeError):
        return {}


# -- aggregating --------------------------------------------------------------------------------


def summarise(runs: Sequence[RunOutcome], published: Published) -> list[EnvSummary]:
    """The runs grouped by env and setting label, in the order each group first appears."""
    groups: dict[tuple[str | None, str | None], list[RunOutcome]] = {}
    for run in runs:
        groups.setdefault((run.env_id, run.label), []).append(run)
    summaries = []
    for (env_id, label), members in groups.items():
        game = published.game(env_id)
        members.sort(key=lambda run: (run.seed is None, run.seed or 0, run.name))
        summaries.append(
            EnvSummary(
                env_id, label, game, published.games.get(game) if game else None, tuple(members)
            )
        )
    return summaries


def curve_band(curves: Sequence[Sequence[tuple[float, float]]], points: int = 200) -> Band | None:
    """Median and spread over runs of a score against frames, each run interpolated linearly
    onto a common grid of frames it reached; None where no run has a curve."""
    curves = [sorted(curve) for curve in curves if curve]
    if not curves:
        return None
    start = min(curve[0][0] for curve in curves)
    stop = max(curve[-1][0] for curve in curves)
    grid = np.linspace(start, stop, points) if stop > start else np.array([start])
    rows = []
    for curve in curves:
        x = np.array([point[0] for point in curve])
        y = np.array([point[1] for point in curve])
        inside = (grid >= x[0]) & (grid <= x[-1])
        rows.append(np.where(inside, np.interp(grid, x, y), np.nan))
    values = np.array(rows)
    counts = np.sum(~np.isnan(values), axis=0)
    keep = counts > 0
    values, grid, counts = values[:, keep], grid[keep], counts[keep]
    interquartile = len(curves) >= INTERQUARTILE_FROM_RUNS
    low_q, high_q = (25, 75) if interquartile else (0, 100)
    return Band(
        frames=tuple(grid.tolist()),
        median=tuple(np.nanmedian(values, axis=0).tolist()),
        low=tuple(np.nanpercentile(values, low_q, axis=0).tolist()),
        high=tuple(np.nanpercentile(values, high_q, axis=0).tolist()),
        runs=tuple(int(c) for c in counts),
        spread="interquartile" if interquartile else "min-max",
    )


@dataclass(frozen=True)
class Report:
    """Everything the report shows."""

    study_dir: Path | None
    """The study dir, or None for plain run dirs."""
    study: str | None
    """The study's name from study.json, where it has one."""
    runs: list[RunOutcome]
    envs: list[EnvSummary]
    published: Published


def read_report(paths: Sequence[str | Path], throughput: dict[str, float] | None = None) -> Report:
    """Reads a study dir (or run dirs) into the report's numbers; ReportError names a path that
    is neither. `throughput`: as read_run's."""
    name, entries = report_entries(paths)
    rates = throughputs() if throughput is None else throughput
    runs = [read_run(entry, rates) for entry in entries]
    published = load_published()
    study_dir = Path(paths[0]) if is_study_dir(paths) else None
    return Report(study_dir, name, runs, summarise(runs, published), published)
