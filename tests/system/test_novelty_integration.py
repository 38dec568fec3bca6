"""Novelty search end to end: `neuro-master --algo ga-ns / ns-es / nsr-es` with real workers.

Real worker processes on loopback report behaviour characterisations; the master's archive
lives in the checkpoint's sidecar and survives a restart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from master.run.checkpoint import load_checkpoint, load_sidecar
from master.run.rundir import read_metrics
from tests.support.processes import REPO, worker_env

pytestmark = pytest.mark.slow
MAZE = "neuro/DeceptiveMaze-v0"


def run_master(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())",
               "--local-workers", "2", "--port", "0", "--quiet", *args]  # fmt: skip
    return subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def archive(run_dir: Path) -> tuple[dict, np.ndarray]:
    payload = load_checkpoint(run_dir)
    return payload["algorithm"]["state"], load_sidecar(run_dir, payload["sidecar"])


@pytest.mark.parametrize("algorithm", ["ns-es", "nsr-es"])
def test_novelty_es_runs_on_the_maze(tmp_path: Path, noise_cache, algorithm: str) -> None:
    run_dir = tmp_path / "run"
    done = run_master("--env", MAZE, "--algo", algorithm, "--run-dir", str(run_dir),
                      "--generations", "4", "--pairs", "5", "--eval-episodes", "1",
                      "--meta-population", "2", "--no-target")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["generation"] for r in records] == [0, 1, 2, 3]
    assert all(r["failed_evaluations"] == 0 for r in records)
    # One theta BC a generation; the members were visited in turn first.
    assert [r["archive_size"] for r in records] == [1, 2, 3, 4]
    state, arrays = archive(run_dir)
    assert state["format"] == "neuro.ns-es/1"
    assert np.isfinite(arrays).all()
    from worker import evaluate_policy

    assert len(evaluate_policy(run_dir, episodes=1)) == 1  # the elite replays


@pytest.mark.parametrize("algorithm", ["ns-es", "nsr-es"])
def test_novelty_es_runs_atari_with_the_papers_network_on_ram(
    tmp_path: Path, noise_cache, algorithm: str
) -> None:
    run_dir = tmp_path / "run"
    done = run_master("--env", "Frostbite-v4", "--algo", algorithm, "--run-dir", str(run_dir),
                      "--generations", "2", "--pairs", "1", "--eval-episodes", "1",
                      "--meta-population", "2", "--max-episode-steps", "40",
                      "--noise-table-size", str(2**23))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(run_dir / "metrics.jsonl")
    assert len(records) == 2 and all(r["failed_evaluations"] == 0 for r in records)
    _, arrays = archive(run_dir)
    assert json.loads((run_dir / "config.json").read_text())["architecture"] == "deepga"
    # The archive's two BCs are RAM snapshots: 128 bytes each, as values 0-255.
    ram = arrays[-2 * 128 :].reshape(2, 128)
    assert ram.min() >= 0 and ram.max() <= 255 and ram.any()


def test_ga_ns_resumes_with_its_archive_intact(tmp_path: Path, noise_cache) -> None:
    run_dir = tmp_path / "run"
    settings = ("--env", MAZE, "--algo", "ga-ns", "--run-dir", str(run_dir), "--population",
                "20", "--truncation", "5", "--elite-candidates", "2", "--elite-episodes", "1",
                "--archive-probability", "0.3", "--no-target")  # fmt: skip
    first = run_master(*settings, "--generations", "3")
    assert first.returncode == 0, first.stderr[-3000:]
    state, before = archive(run_dir)
    assert state["generation"] == 3 and len(before) > 0
    second = run_master(*settings, "--generations", "6")
    assert second.returncode == 0, second.stderr[-3000:]
    state, after = archive(run_dir)
    assert state["generation"] == 6
    # Far below the capacity, the archive only grows: the first run's is its prefix, exactly.
    assert len(after) > len(before) and np.array_equal(after[: len(before)], before)
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["generation"] for r in records] == list(range(6))
    assert [r["archive_size"] for r in records][2] == len(before)
