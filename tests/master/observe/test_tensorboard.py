"""TensorBoard scalars: real CartPole runs, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from master.algorithms.ga import GeneticAlgorithm
from master.config import inspect_env_id, preset
from master.fleet.fleet import Fleet
from master.fleet.phases import FleetSettings
from master.observe.progress import GenerationStats
from master.observe.tensorboard import (
    TensorBoardObserver,
    frame_scalars,
    generation_scalars,
    last_generation_written,
)
from master.run.rundir import GenerationRecord, RunDirectory, read_metrics
from master.run.trainer import Budget, Trainer
from tests.support.processes import REPO, worker_env
from tests.support.tiny import LOCAL_CARTPOLE_ARGS

MASTER = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())"]
SMALL_RUN = [*LOCAL_CARTPOLE_ARGS, "--seed", "2", "--population", "10", "--quiet"]
# Each tag and the metrics.jsonl field it plots.
BY_GENERATION = {"score/mean": "score_mean", "score/max": "score_max",
                 "score/elite": "elite_score", "frames": "frames",
                 "fleet/leases_reissued": "leases_reissued"}  # fmt: skip
BY_FRAMES = {"by_frames/score/mean": "score_mean", "by_frames/score/max": "score_max",
             "by_frames/score/elite": "elite_score"}  # fmt: skip
THROUGHPUT = ("throughput/evals_per_s", "throughput/frames_per_s", "fleet/workers")


def record(**fields: object) -> GenerationRecord:
    values: dict[str, object] = dict(
        generation=4, frames=52_000, evaluations=70, wall_s=9.5, score_mean=61.7,
        score_max=500.0, elite_score=487.25, elite_seeds=[7], generation_evaluations=14,
        generation_frames=9000, failed_evaluations=0, leases_reissued=3,
    )  # fmt: skip
    values.update(fields)
    return GenerationRecord(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "stats", "expected"),
    [
        ({}, GenerationStats(14.0, 9000.0, 2, 30.0),
         {"score/mean": 61.7, "score/max": 500.0, "score/elite": 487.25,
          "throughput/evals_per_s": 14.0, "throughput/frames_per_s": 9000.0,
          "fleet/workers": 2.0, "fleet/leases_reissued": 3.0, "frames": 52_000.0}),
        # Every evaluation failed, and no time was measured: those points are left out.
        ({"score_mean": math.nan, "score_max": math.nan, "elite_score": math.nan},
         GenerationStats(None, None, 0, None),
         {"fleet/workers": 0.0, "fleet/leases_reissued": 3.0, "frames": 52_000.0}),
        # ES adds its own figures; a missing rank and non-numbers are left out.
        ({"score_mean": math.nan, "score_max": math.nan, "elite_score": math.nan,
          "extra": {"theta_rank": 3, "grad_norm": 2.5, "population": 40, "note": "x",
                    "flag": True}},
         GenerationStats(None, None, 0, None),
         {"fleet/workers": 0.0, "fleet/leases_reissued": 3.0, "frames": 52_000.0,
          "algo/theta_rank": 3.0, "algo/grad_norm": 2.5, "algo/population": 40.0}),
        ({"score_mean": math.nan, "score_max": math.nan, "elite_score": math.nan,
          "extra": {"theta_rank": None}},
         GenerationStats(None, None, 0, None),
         {"fleet/workers": 0.0, "fleet/leases_reissued": 3.0, "frames": 52_000.0}),
        # Novelty search: the archive's size and the offspring's novelty.
        ({"score_mean": math.nan, "score_max": math.nan, "elite_score": math.nan,
          "extra": {"archive_size": 120, "archive_added": 2, "novelty_mean": 0.25,
                    "novelty_max": 0.75}},
         GenerationStats(None, None, 0, None),
         {"fleet/workers": 0.0, "fleet/leases_reissued": 3.0, "frames": 52_000.0,
          "algo/archive_size": 120.0, "algo/archive_added": 2.0, "algo/novelty_mean": 0.25,
          "algo/novelty_max": 0.75}),
    ],
)  # fmt: skip
def test_the_scalars_of_a_generation(
    fields: dict, stats: GenerationStats, expected: dict[str, float]
) -> None:
    assert generation_scalars(record(**fields), stats) == expected
    by_frames = {f"by_frames/{tag}": v for tag, v in expected.items() if tag.startswith("score/")}
    assert frame_scalars(record(**fields)) == by_frames


def test_an_empty_or_missing_directory_has_no_step_written(tmp_path: Path) -> None:
    assert last_generation_written(tmp_path) is None
    assert last_generation_written(tmp_path / "missing") is None


def run(run_dir: Path, generations: int) -> subprocess.CompletedProcess:
    command = [*MASTER, *SMALL_RUN, "--run-dir", str(run_dir), "--generations", str(generations)]
    return subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every scalar event, per tag, as TensorBoard reads them."""
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


@pytest.mark.slow
def test_each_generation_is_one_point_per_tag_and_a_resume_appends(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    first = run(run_dir, 2)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout == ""  # --quiet
    assert set(scalars(run_dir / "tensorboard")) == {*BY_GENERATION, *BY_FRAMES, *THROUGHPUT}
    # The same directory, a longer budget: a new event file, and only the new step in it.
    second = run(run_dir, 3)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming" in second.stderr and second.stdout == ""
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m["generation"] for m in metrics] == [0, 1, 2]
    found = scalars(run_dir / "tensorboard")
    assert set(found) == {*BY_GENERATION, *BY_FRAMES, *THROUGHPUT}
    for tag, field in BY_GENERATION.items():
        assert found[tag] == [(m["generation"], pytest.approx(m[field])) for m in metrics], tag
    for tag, field in BY_FRAMES.items():
        assert found[tag] == [(m["frames"], pytest.approx(m[field])) for m in metrics], tag
    for tag in THROUGHPUT:
        assert [step for step, _ in found[tag]] == [0, 1, 2], tag
        assert all(value > 0 for _, value in found[tag]), tag
    assert last_generation_written(run_dir / "tensorboard") == 2


@pytest.mark.slow
def test_a_run_that_cannot_write_events_warns_once_and_goes_on(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tensorboard").write_text("a file where the directory should be")
    done = run(run_dir, 3)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [m["generation"] for m in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2]
    warnings = [line for line in done.stderr.splitlines() if "TensorBoard" in line]
    assert len(warnings) == 1, done.stderr[-3000:]
    assert "WARNING" in warnings[0] and str(run_dir / "tensorboard") in warnings[0]


def test_a_replayed_generation_keeps_the_point_first_written(tmp_path: Path) -> None:
    """A run resumed from an older checkpoint plays generations again; TensorBoard has each once."""
    directory = tmp_path / "tensorboard"
    first = TensorBoardObserver(directory)
    first.started(trainer(tmp_path).snapshot)
    for generation in (0, 1):
        first.generation(record(generation=generation, **position(generation)), 2)
    first.stopped()
    second = TensorBoardObserver(directory)  # a new process, resumed at generation 1
    second.started(trainer(tmp_path).snapshot)
    for generation in (1, 2):
        second.generation(record(generation=generation, **position(generation), score_mean=-1.0), 2)
    second.stopped()
    found = scalars(directory)
    assert found["score/mean"] == [(0, pytest.approx(61.7)), (1, pytest.approx(61.7)), (2, -1.0)]
    assert found["by_frames/score/mean"] == [(1000, pytest.approx(61.7)),
                                             (2000, pytest.approx(61.7)), (3000, -1.0)]  # fmt: skip
    assert all(len(points) == 3 for points in found.values())
    assert last_generation_written(directory) == 2


def position(generation: int) -> dict[str, float]:
    return {"frames": 1000 * (generation + 1), "wall_s": 2.0 * (generation + 1)}


def trainer(run_dir: Path) -> Trainer:
    """A trainer that never trains: what an observer reads when the run starts."""
    config = preset(inspect_env_id("CartPole-v1"))
    fleet = Fleet(FleetSettings(run_id="r", run_seed=0))
    return Trainer(GeneticAlgorithm(config.ga), fleet, Budget(), RunDirectory(run_dir),
                   config.genome_document, config.env_id)  # fmt: skip
