"""ES with observation normalisation: the running sums, their versions, and runs end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from master.algorithms.es import ESState
from master.config import inspect_env_id, preset
from master.run.algorithm_setup import create_algorithm, restore_algorithm
from master.run.checkpoint import load_checkpoint
from master.run.rundir import read_metrics
from neuro.observation_stats import INITIAL_COUNT, ObservationStats
from tests.support.processes import REPO, worker_env


def es_with_norm(env_id: str = "Pendulum-v1", **settings):
    config = preset(inspect_env_id(env_id), algorithm="es", observation_norm=True, pairs=3,
                    eval_episodes=2, hidden_sizes=(8,), noise_table_size=2**16,
                    **settings)  # fmt: skip
    return config, create_algorithm(config)


def answers(es) -> dict[str, list[float]]:
    return {r.key: [float(i)] * r.episodes for i, r in enumerate(es.ask())}


def test_each_version_normalises_with_every_observation_seen_before_it(noise_cache) -> None:
    _, es = es_with_norm()
    assert es.needs_observation_stats
    prior = ObservationStats.prior(3)
    first = es.parameters()
    assert first.observation_norm is not None
    for got, want in zip(first.observation_norm, prior.normaliser(), strict=True):
        assert np.array_equal(got, want)
    rng = np.random.default_rng(0)
    seen = [ObservationStats.of(rng.normal(1.0, 2.0, (40, 3))) for _ in range(2)]
    summary = es.tell(answers(es), observation_stats=seen[0])
    # The version just evaluated keeps the normaliser its workers used.
    assert summary.elite.observation_norm is first.observation_norm
    assert summary.metrics()["observation_count"] == INITIAL_COUNT + 40
    es.tell(answers(es), observation_stats=seen[1])
    expected = (prior + seen[0] + seen[1]).normaliser()
    for got, want in zip(es.parameters().observation_norm, expected, strict=True):
        assert np.array_equal(got, want)


def test_a_phase_with_no_observations_leaves_the_sums_as_they_were(noise_cache) -> None:
    _, es = es_with_norm()
    before = es.state.observations
    es.tell(answers(es))  # every evaluation failed: no sums came
    assert es.state.observations is before


def test_sums_of_the_wrong_size_are_refused_and_change_nothing(noise_cache) -> None:
    _, es = es_with_norm()
    before = json.dumps(es.state_dict())
    with pytest.raises(ValueError, match="observation sums of size 5"):
        es.tell(answers(es), observation_stats=ObservationStats.zeros(5))
    assert json.dumps(es.state_dict()) == before


def test_the_sums_survive_a_checkpoint_exactly(noise_cache) -> None:
    config, es = es_with_norm()
    rng = np.random.default_rng(1)
    es.tell(answers(es), observation_stats=ObservationStats.of(rng.normal(0, 1, (33, 3)) / 3))
    document = json.loads(json.dumps(es.state_dict()))
    again = restore_algorithm(config, document, es.arrays())
    assert again.state.observations.count == es.state.observations.count
    assert np.array_equal(again.state.observations.total, es.state.observations.total)
    assert np.array_equal(again.state.observations.squares, es.state.observations.squares)
    stats = ObservationStats.of(rng.normal(0, 1, (7, 3)))
    es.tell(answers(es), observation_stats=stats)
    again.tell(answers(again), observation_stats=stats)
    assert np.array_equal(es.arrays(), again.arrays())
    assert all(np.array_equal(a, b) for a, b in zip(es.parameters().observation_norm,
                                                    again.parameters().observation_norm,
                                                    strict=True))  # fmt: skip


def test_a_state_without_sums_does_not_pass_for_a_normalised_run(noise_cache) -> None:
    config, es = es_with_norm()
    document = es.state_dict()
    document["observations"] = None
    with pytest.raises(ValueError, match="lacks observation sums"):
        restore_algorithm(config, document, es.arrays())
    assert ESState.from_dict(document, es.arrays()).observations is None


def test_atari_frames_are_not_normalised(noise_cache) -> None:
    with pytest.raises(ValueError, match="not Atari frames"):
        preset(inspect_env_id("Frostbite-v4"), algorithm="es", observation_norm=True,
               pairs=1, noise_table_size=2**23)  # fmt: skip


def run_master(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())",
               "--algo", "es", "--observation-norm", "--local-workers", "2", "--port", "0",
               "--quiet", *args]  # fmt: skip
    return subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_every_observation_workers_fed_is_counted_once(tmp_path: Path, noise_cache) -> None:
    """Pendulum: one observation per agent step, frames = steps, so the sums' count is exact."""
    run_dir = tmp_path / "run"
    done = run_master("--env", "Pendulum-v1", "--run-dir", str(run_dir), "--generations", "3",
                      "--pairs", "4", "--eval-episodes", "2", "--hidden", "16",
                      "--noise-table-size", str(2**18))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["observation_count"] for r in records] == [
        INITIAL_COUNT + r["frames"] for r in records
    ]
    state = load_checkpoint(run_dir)["algorithm"]["state"]
    assert state["observations"]["count"] == records[-1]["observation_count"]
    elite = json.loads((run_dir / "elite_genome.json").read_text())
    assert elite["observation_size"] == 3
    # Replay normalises as training did: the saved vector ends with the version's mean and std.
    from worker import evaluate_policy

    scores = evaluate_policy(run_dir, episodes=2, env_seed=5)
    assert len(scores) == 2 and all(math.isfinite(s) for s in scores)


@pytest.mark.slow
def test_es_with_observation_normalisation_runs_hopper_end_to_end(tmp_path: Path, noise_cache):
    run_dir = tmp_path / "run"
    done = run_master("--env", "Hopper-v5", "--run-dir", str(run_dir), "--generations", "2",
                      "--pairs", "3", "--eval-episodes", "1", "--max-episode-steps", "200",
                      "--noise-table-size", str(2**20))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(run_dir / "metrics.jsonl")
    assert len(records) == 2 and all(r["failed_evaluations"] == 0 for r in records)
    assert records[-1]["observation_count"] == INITIAL_COUNT + records[-1]["frames"]
    elite = json.loads((run_dir / "elite_genome.json").read_text())
    assert elite["observation_size"] == 11
    vector = np.load(run_dir / elite["parameters"]["file"])
    std = vector[-11:]
    assert np.all(std > 0) and not np.allclose(std, std[0])  # learnt from Hopper's states


def test_novelty_es_refuses_observation_normalisation_it_would_ignore() -> None:
    with pytest.raises(ValueError, match="observation_norm is an --algo es setting, not ns-es"):
        preset(inspect_env_id("Pendulum-v1"), algorithm="ns-es", observation_norm=True)


def test_observation_normalisation_on_atari_frames_is_refused_at_parse_time(tmp_path, capsys):
    """Refused by the config, so the command line says so (exit 2), not a traceback from
    building the algorithm."""
    from master.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--env", "Frostbite-v4", "--algo", "es", "--observation-norm", "--port", "0",
              "--run-dir", str(tmp_path / "run"), "--quiet"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "observation_norm is for vector observations, not Atari frames (Frostbite-v4)" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "run").exists()
