"""bench/gpu_host.py, the one command that measures a GPU host, run tiny on a CPU: ceiling,
training frames/s, their ratio, GPU use and hours per 1B frames in one consistent JSON; a
window of a generation too long to wait for; a dead worker failing the run by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.gpu_host import TARGET_RATIO
from bench.gpu_sampling import GpuSampler
from tests.support.processes import REPO, worker_env

TINY = ["--device", "cpu", "--envs", "4", "--emulator-seconds", "0.5", "--workers", "2",
        "--noise-table-size", str(2**23)]  # fmt: skip


def gpu_host(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """Runs the command as its user would: exit code, JSON, stdout."""
    out = tmp_path / "gpu-host.json"
    command = [sys.executable, "-m", "bench.gpu_host", *args, "--json", str(out)]
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert out.exists(), done.stderr[-3000:]
    return done.returncode, json.loads(out.read_text()), done.stdout


def check_figures(result: dict[str, Any]) -> None:
    """The headline figures are positive and follow from the stages' own measurements."""
    summary, ceiling, training = result["summary"], result["ceiling"], result["training"]
    assert ceiling["before"]["processes"] == ceiling["after"]["processes"] == 2
    bracket = ceiling["bracket"]["frames_per_s_per_core"]
    assert bracket == pytest.approx(
        (ceiling["before"]["frames_per_s_per_core"] + ceiling["after"]["frames_per_s_per_core"]) / 2
    )
    assert summary["ceiling_frames_per_s"] == pytest.approx(bracket * 2) and bracket > 0
    rate = summary["training_frames_per_s"]
    assert rate == training["frames_per_s"] > 0
    assert summary["ratio"] == pytest.approx(rate / summary["ceiling_frames_per_s"])
    assert summary["hours_per_1b_frames"] == pytest.approx(1e9 / rate / 3600)
    assert summary["target_ratio"] == TARGET_RATIO
    assert summary["meets_target"] == (summary["ratio"] >= TARGET_RATIO)
    assert training["batched_envs"] == 4 and training["device"] == "cpu"
    assert training["breakdown"]["samples_per_forward"] > 1  # several genomes per pass
    gpu = training["gpu"]
    if gpu["source"] is None:  # no NVIDIA driver here: none sampled, and why
        assert summary["gpu_utilisation_percent"] is None and gpu["samples"] == 0
        assert summary["gpu_utilisation_reason"] == gpu["reason"] and gpu["reason"]
    else:
        assert 0 <= summary["gpu_utilisation_percent"] <= 100
    assert result["host"]["torch"] and result["host"]["cpus"] >= 1
    assert result["error"] is None and result["failed_stage"] is None


@pytest.mark.slow
def test_a_whole_generation_on_a_tiny_cpu_host(tmp_path: Path, noise_cache: Path) -> None:
    code, result, stdout = gpu_host(tmp_path, *TINY, "--population", "6", "--elite-episodes",
                                    "2", "--max-episode-steps", "30",
                                    "--training-seconds", "0")  # fmt: skip
    assert code == 0
    check_figures(result)
    training = result["training"]
    assert training["complete"] and result["summary"]["complete_generation"]
    assert training["evaluations"] == 6 + 2 and training["frames_per_s_source"] == "master"
    assert training["frames_per_s"] == pytest.approx(training["frames"] / training["wall_s"])
    assert set(training["phases"]) == {"offspring", "elite"}
    # The human summary comes last, after the JSON.
    labels = [line.split(":")[0] for line in stdout.strip().splitlines()[-6:]]
    assert labels == ["host", "ceiling", "training", "ratio", "GPU", "1B frames"]


@pytest.mark.slow
def test_a_generation_longer_than_the_window_is_measured_over_it(
    tmp_path: Path, noise_cache: Path
) -> None:
    code, result, _ = gpu_host(tmp_path, *TINY, "--population", "40", "--max-episode-steps",
                               "400", "--training-seconds", "3")  # fmt: skip
    assert code == 0
    check_figures(result)
    training = result["training"]
    assert not training["complete"] and training["frames_per_s_source"] == "workers"
    assert 3.0 <= training["wall_s"] < 5.0  # the window, and the master's poll after it
    # The frames the worker played over the window (until it was stopped, just after it).
    played_over = training["played_frames"] / training["frames_per_s"]
    assert 3.0 <= played_over < 3.0 + 5.0
    assert 0 <= training["frames"] <= training["played_frames"]


@pytest.mark.slow
def test_a_dead_worker_fails_the_run_naming_its_exit_code(tmp_path: Path) -> None:
    started = time.monotonic()
    code, result, stdout = gpu_host(tmp_path, *TINY, "--population", "6",
                                    "--worker-arg=--no-such-flag")  # fmt: skip
    assert code == 1 and time.monotonic() - started < 120  # failed at once, no hang
    assert result["failed_stage"] == "training"
    assert result["error"] == "every worker exited before its first lease (exit codes [2])"
    assert result["summary"]["ceiling_frames_per_s"] > 0  # what ran before is kept
    assert "training_frames_per_s" not in result["summary"] and result["training"] is None
    assert stdout.strip().splitlines()[-1].startswith("FAILED in training: every worker exited")


def test_the_gpu_sampler_reads_utilisation_and_memory_from_its_query() -> None:
    # Two GPUs: the mean of their utilisation, the sum of their memory.
    query = [sys.executable, "-c", "print('37, 1024'); print('41, 2048')"]
    sampler = GpuSampler(interval_s=0.05, query=query)
    sampler.start()
    deadline = time.monotonic() + 30
    while sampler.summary()["samples"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sampler.stop() == pytest.approx(39.0)
    summary = sampler.summary()
    assert summary["samples"] >= 2 and summary["memory_used_mib_max"] == 3072
    assert summary["utilisation_percent_max"] == pytest.approx(39.0)
    assert summary["source"] == "command" and summary["reason"] is None


def test_a_gpu_sampler_with_no_answer_says_why() -> None:
    sampler = GpuSampler(interval_s=0.05, query=[sys.executable, "-c", "raise SystemExit(3)"])
    sampler.start()
    time.sleep(0.3)
    assert sampler.stop() is None
    summary = sampler.summary()
    assert summary["samples"] == 0 and summary["utilisation_percent_mean"] is None
    assert summary["reason"].startswith("no sample answered: CalledProcessError")
    if shutil.which("nvidia-smi") is None:
        probed = GpuSampler()
        assert probed.source is None or probed.source == "torch.cuda.utilization"
        assert (probed.reason is None) == (probed.source is not None)
