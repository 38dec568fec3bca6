"""ES end to end: `neuro-master --algo es` with real local worker processes on loopback."""

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


def run_master(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())",
               "--algo", "es", "--local-workers", "2", "--port", "0", *args]  # fmt: skip
    return subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def check_counters(records: list[dict], pairs: int, eval_episodes: int) -> None:
    per_update = 2 * pairs + eval_episodes
    frames = evaluations = 0
    for generation, record in enumerate(records):
        assert record["generation"] == generation
        assert record["generation_evaluations"] == per_update
        frames += record["generation_frames"]
        evaluations += record["generation_evaluations"]
        assert (record["frames"], record["evaluations"]) == (frames, evaluations)
        assert record["population"] == 2 * pairs
        assert record["theta_rank"] is None or 0 <= record["theta_rank"] <= record["population"]


def test_es_solves_cartpole_on_two_local_workers(tmp_path: Path, noise_cache: Path) -> None:
    run_dir = tmp_path / "run"
    settings = ("--pairs", "20", "--sigma", "0.1", "--learning-rate", "0.03", "--seed", "1")
    done = run_master("--env", "CartPole-v1", "--run-dir", str(run_dir), "--generations", "40",
                      *settings)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(run_dir / "metrics.jsonl")
    check_counters(records, 20, 30)
    # The target is the threshold, met by the unperturbed parameters' mean over 30 episodes.
    assert records[-1]["elite_score"] >= 475.0 and len(records) < 40
    assert all("theta_rank" in r for r in records)
    # The run dir's best parameters replay on their own, on episodes the run never saw.
    from worker import evaluate_policy

    scores = evaluate_policy(run_dir, episodes=30, env_seed=12345)
    assert sum(scores) / 30 >= 475.0
    # The checkpoint's arrays are a sidecar whose sha256 it records; theta moved on once more.
    payload = load_checkpoint(run_dir)
    arrays = load_sidecar(run_dir, payload["sidecar"])
    assert payload["algorithm"]["state"]["generation"] == len(records)
    best = np.load(run_dir / "best_params.npy")
    assert arrays.shape == (3, best.size) and not np.array_equal(arrays[0], best)


def test_short_atari_es_run_fetches_parameters_above_the_message_limit(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    done = run_master("--env", "Frostbite-v4", "--run-dir", str(run_dir), "--generations", "1",
                      "--pairs", "2", "--eval-episodes", "1", "--max-episode-steps", "50",
                      "--noise-table-size", str(2**24), "--quiet")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(run_dir / "metrics.jsonl")
    check_counters(records, 2, 1)
    assert records[0]["failed_evaluations"] == 0
    best = json.loads((run_dir / "elite_genome.json").read_text())
    assert best["architecture"] == "deepga"
    theta = np.load(run_dir / best["parameters"]["file"])
    assert theta.nbytes > 4 * 2**20  # more than one gRPC message may carry


def test_an_es_run_resumes_from_its_checkpoint(tmp_path: Path, noise_cache: Path) -> None:
    run_dir = tmp_path / "run"
    settings = ("--env", "CartPole-v1", "--run-dir", str(run_dir), "--pairs", "5",
                "--eval-episodes", "2", "--no-target", "--quiet")  # fmt: skip
    done = run_master(*settings, "--generations", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    first = read_metrics(run_dir / "metrics.jsonl")
    payload = load_checkpoint(run_dir)
    theta_after_two = load_sidecar(run_dir, payload["sidecar"])[0].copy()
    done = run_master(*settings, "--generations", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming {run_dir} at generation 2" in done.stderr
    records = read_metrics(run_dir / "metrics.jsonl")
    assert records[:2] == first
    check_counters(records, 5, 2)
    resumed = load_checkpoint(run_dir)
    assert resumed["algorithm"]["state"]["generation"] == 4
    # Two more updates moved theta on from where the first process left it.
    theta_after_four = load_sidecar(run_dir, resumed["sidecar"])[0]
    assert theta_after_four.shape == theta_after_two.shape
    assert not np.array_equal(theta_after_four, theta_after_two)


def test_an_es_run_mirrored_to_s3_resumes_on_a_new_machine(
    aws_endpoint: str, tmp_path: Path, noise_cache: Path
) -> None:
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="runs-bucket")
    uri = "s3://runs-bucket/es"
    first, second = tmp_path / "first", tmp_path / "second"
    settings = ("--env", "CartPole-v1", "--pairs", "5", "--eval-episodes", "2", "--no-target",
                "--quiet", "--s3-uri", uri)  # fmt: skip
    done = run_master(*settings, "--run-dir", str(first), "--generations", "4")
    assert done.returncode == 0, done.stderr[-3000:]

    def stored() -> set[str]:
        listing = s3.list_objects_v2(Bucket="runs-bucket", Prefix="es/").get("Contents", [])
        return {item["Key"][len("es/") :] for item in listing}

    local_arrays = {path.name for path in first.glob("*.npy")}
    assert {"best_params.npy", "elite_params.npy"} <= local_arrays
    # Every array the run dir holds is in S3, and none the trainer has rotated out.
    assert {name for name in stored() if name.endswith(".npy")} == local_arrays
    # A new machine: an empty run dir restores from S3 (arrays included) and goes on.
    done = run_master(*settings, "--run-dir", str(second), "--generations", "6")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming {second} at generation 4" in done.stderr
    records = read_metrics(second / "metrics.jsonl")
    assert records[:4] == read_metrics(first / "metrics.jsonl")
    check_counters(records, 5, 2)
    assert {name for name in stored() if name.endswith(".npy")} == {
        path.name for path in second.glob("*.npy")
    }
