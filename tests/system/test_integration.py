"""End to end: a real grpc.aio master on loopback with real worker processes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from master.config import inspect_env_id, preset
from master.run.rundir import read_elite_seeds, read_metrics
from tests.support.harness import live_master
from tests.support.processes import REPO, spawn_worker, stop_processes, worker_env

pytestmark = pytest.mark.slow

METRIC_KEYS = {"generation", "frames", "evaluations", "wall_s", "score_mean", "score_max",
               "elite_score", "elite_sha256", "elite_length"}  # fmt: skip


def check_metrics_add_up(records: list[dict], per_generation: int) -> None:
    """Complete lines, consecutive generations, cumulative counters that add up exactly."""
    frames = evaluations = 0
    for expected_generation, record in enumerate(records):
        assert record.keys() >= METRIC_KEYS
        assert record["generation"] == expected_generation
        assert record["generation_evaluations"] == per_generation
        frames += record["generation_frames"]
        evaluations += record["generation_evaluations"]
        assert record["frames"] == frames
        assert record["evaluations"] == evaluations
        assert record["elite_length"] >= 1


def test_one_command_trains_cartpole_to_the_threshold(tmp_path: Path, noise_cache: Path) -> None:
    """`neuro-master --env CartPole-v1 --local-workers 2`: the one-machine mode, via gRPC."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())",
               "--env", "CartPole-v1", "--local-workers", "2", "--port", "0",
               "--run-dir", str(run_dir), "--generations", "20", "--seed", "1"]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    if len(os.sched_getaffinity(0)) >= 2:  # two per-core workers, one CPU each
        cpus = sorted(os.sched_getaffinity(0))
        pinned = re.findall(r"worker local-\d+-\d+ pinned to CPU (\d+)", done.stderr)
        assert len(set(pinned)) == 2 and {int(cpu) for cpu in pinned} <= set(cpus)
    records = read_metrics(run_dir / "metrics.jsonl")
    config = json.loads((run_dir / "config.json").read_text())
    ga = config["ga"]
    assert (ga["elite_candidates"], ga["elite_episodes"]) == (3, 30)
    check_metrics_add_up(records, ga["population_size"] + 3 * 30)
    # The target is the env's threshold: the elite's mean over its 30 re-evaluation episodes.
    assert records[-1]["elite_score"] >= 475.0
    assert len(records) <= 20
    # Piped, the progress is one JSON object per generation, the same as metrics.jsonl.
    progress = [json.loads(line) for line in done.stdout.splitlines()]
    assert [p["generation"] for p in progress] == [r["generation"] for r in records]
    # The saved genome replays on its own, on episodes the run never saw.
    from worker import evaluate_policy

    scores = evaluate_policy(run_dir / "best_genome.json", episodes=30, env_seed=12345)
    assert sum(scores) / 30 >= 475.0
    best = json.loads((run_dir / "best_genome.json").read_text())
    assert best["seeds"] == read_elite_seeds(run_dir, records[-1])


async def _train_with_a_worker_killed(tmp_path: Path) -> tuple[list, list[int], int]:
    config = preset(
        inspect_env_id("CartPole-v1"),
        # Enough individuals that generation 1 lasts long enough (a few hundred ms of CartPole)
        # for the 5 ms poll below to find the victim holding leases in it.
        population_size=200,
        truncation=5,
        elite_candidates=2,
        elite_episodes=5,
        generations=3,
        target_score=None,
        lease_seconds=2.0,
        seed=3,
    )
    async with live_master(config, tmp_path / "run", train=False) as live:
        # Slow the victim down so it holds leases long enough to be killed mid-generation.
        workers = [spawn_worker(live.port, "victim", "--prefetch", "4"),
                   spawn_worker(live.port, "survivor")]  # fmt: skip
        training = live.start_training()
        fleet = live.trainer.fleet
        killed_holding = 0
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not training.done():
                held = fleet.tasks_leased_to("victim")
                if live.trainer.algorithm.generation == 1 and held:
                    killed_holding = len(held)
                    os.kill(workers[0].pid, signal.SIGKILL)
                    break
                await asyncio.sleep(0.005)
            records = await asyncio.wait_for(training, 120)
            # The master must keep serving while the survivor learns that the run is complete.
            return records, [await _exit_code(w, 30) for w in workers], killed_holding
        finally:
            stop_processes(workers)


async def _exit_code(process: subprocess.Popen, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return process.poll()


def test_a_worker_killed_mid_generation_does_not_stall_the_run(
    tmp_path: Path, noise_cache: Path
) -> None:
    records, exit_codes, killed_holding = asyncio.run(_train_with_a_worker_killed(tmp_path))
    assert killed_holding > 0, "the victim was never caught holding a lease"
    assert exit_codes[0] == -signal.SIGKILL and exit_codes[1] == 0
    assert [r.generation for r in records] == [0, 1, 2]
    # Its leases lapsed and were re-issued; every individual was still scored exactly once.
    # (Not necessarily all it held: a result can be reported in the instant before the kill.)
    assert records[1].leases_reissued >= 1
    per_generation = 200 + 2 * 5
    check_metrics_add_up(read_metrics(tmp_path / "run/metrics.jsonl"), per_generation)
    assert all(r.failed_evaluations == 0 for r in records)


def test_short_frostbite_run_with_the_papers_network(tmp_path: Path, noise_cache: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-c", "import sys; from master.cli import main; sys.exit(main())",
               "--env", "Frostbite-v4", "--local-workers", "2", "--port", "0",
               "--run-dir", str(run_dir), "--generations", "2", "--population", "4",
               "--truncation", "2", "--elite-candidates", "2", "--elite-episodes", "2",
               "--max-episode-steps", "150", "--noise-table-size", str(2**24)]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["architecture"], config["atari_dynamics"]) == ("deepga", "paper")
    assert config["inference_dtype"] == "int8-static"  # the Atari default on CPU workers
    records = read_metrics(run_dir / "metrics.jsonl")
    check_metrics_add_up(records, 4 + 2 * 2)
    # Episodes are capped at 150 agent steps = 600 frames; the paper counts 4 frames a step.
    for record in records:
        assert record["generation_frames"] % 4 == 0
        assert 0 < record["generation_frames"] <= (4 + 2 * 2) * 600
    best = json.loads((run_dir / "best_genome.json").read_text())
    assert best["architecture"] == "deepga" and len(best["seeds"]) in (1, 2)
