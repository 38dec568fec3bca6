"""The batched worker (--envs N, or a CUDA device): tasks of different genomes stepped together.

On CPU here: the runner agrees with the per-genome PerGenomeRunner task by task; a real worker
process with --device cpu --envs 8 trains Frostbite through the real CLIs with every
evaluation recorded, and drains on SIGTERM with many tasks in flight.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from neuro.noise import NoiseTableSpec
from tests.support.harness import live_master
from tests.support.processes import REPO, spawn_worker, stop_processes, worker_env
from tests.support.runners import run_all
from tests.support.tiny import long_elite_tasks
from worker.cli import worker_parser, worker_settings
from worker.evaluation.evaluator import Evaluator
from worker.evaluation.spec import EvaluationSpec
from worker.runners.batched import BatchedRunner
from worker.runners.per_genome import PerGenomeRunner

TABLE = NoiseTableSpec(size=2**16)


def _spec(seeds: tuple[int, ...], env_seed: int, **overrides) -> EvaluationSpec:
    fields = {"episodes": 2, "max_episode_steps": 200, "env_seed": env_seed}
    return EvaluationSpec("CartPole-v1", seeds, 0.5, TABLE, "mlp", (16,), **{**fields, **overrides})


def test_batched_runner_scores_every_task_as_the_per_genome_runner(noise_cache: Path) -> None:
    specs = {f"t{i}": _spec(tuple(range(i + 1)), 1000 + i) for i in range(7)}
    evaluator = Evaluator(str(noise_cache))
    reference = run_all(PerGenomeRunner(evaluator, 1), specs)
    runner = BatchedRunner(evaluator, 4, "cpu")
    forward_calls = runner.timers.forward_calls
    batched = run_all(runner, specs)
    assert batched == reference
    assert len({tuple(returns) for returns, _ in reference.values()}) > 1  # genomes differ
    # Four different genomes at a time in one forward pass: far fewer passes than steps.
    assert runner.timers.forward_calls - forward_calls < runner.timers.steps / 2
    assert runner.free == 4 and not runner.busy


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_genomes_decoded_on_the_device_score_as_decoded_on_the_host(
    noise_cache: Path, device: str
) -> None:
    """Seeds decoded on the device (from its own copy of the noise table) are the host's
    parameters bit for bit, so every task scores the same."""
    specs = {f"t{i}": _spec(tuple(range(3 * i, 3 * i + i + 1)), 2000 + i) for i in range(6)}
    evaluator = Evaluator(str(noise_cache))
    on_host = run_all(BatchedRunner(evaluator, 3, device, decode_on_device=False), specs)
    runner = BatchedRunner(evaluator, 3, device, decode_on_device=True)
    assert runner.decode_on_device and runner.device == device
    assert run_all(runner, specs) == on_host
    if device == "cuda":
        assert BatchedRunner(evaluator, 2, device).decode_on_device  # the default there
    decoders = list(evaluator.decoders._device_decoders.values())
    assert len(decoders) == 1 and decoders[0].device.type == device
    seeds = specs["t3"].seeds
    network = runner._groups[specs["t3"].network_key].network
    host = evaluator.parameters(specs["t3"], network)
    assert np.array_equal(decoders[0].decode(seeds).cpu().numpy(), host)


def test_batched_runner_refuses_reduced_precision_by_name(noise_cache: Path) -> None:
    runner = BatchedRunner(Evaluator(str(noise_cache)), 2, "cpu")
    with pytest.raises(ValueError, match="'int8'"):
        runner.start("t", _spec((1,), 1, inference_dtype="int8"))
    assert runner.free == 2


def test_a_dropped_task_frees_its_slot_for_the_next(noise_cache: Path) -> None:
    runner = BatchedRunner(Evaluator(str(noise_cache)), 2, "cpu")
    runner.start("a", _spec((1,), 1))
    runner.start("b", _spec((2,), 2))
    runner.step()
    assert runner.drop("a") is not None and runner.drop("a") is None
    runner.start("c", _spec((3,), 3))
    assert sorted(runner.task_ids()) == ["b", "c"]
    done = {task_id for task_id, *_ in _drain(runner)}
    assert done == {"b", "c"}


def _drain(runner) -> list:
    finished = []
    while runner.busy:
        finished += runner.step()
    return finished


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--envs", "-1"], "--envs (or NEURO_ENVS) must be >= 0, got -1"),
        (["--device", "gpu"], "'gpu'"),
    ],
)
def test_bad_device_and_envs_flags_are_refused_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = worker_parser()
    with pytest.raises(SystemExit) as exit_info:
        worker_settings(parser, parser.parse_args(argv))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_device_and_envs_settings() -> None:
    parser = worker_parser()
    settings = worker_settings(parser, parser.parse_args(["--device", "cpu", "--envs", "8"]))
    assert (settings.device, settings.envs) == ("cpu", 8)
    per_genome = worker_settings(parser, parser.parse_args(["--device", "cpu"]))
    assert per_genome.envs == 0  # the per-genome worker, as before


@pytest.mark.slow
def test_frostbite_trains_on_one_batched_cpu_worker_through_the_clis(
    tmp_path: Path, noise_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    population, candidates, episodes = 10, 2, 2
    command = [sys.executable, "-m", "master", "--env", "Frostbite-v4", "--local-workers", "1",
               "--worker-arg=--device", "--worker-arg=cpu", "--worker-arg=--envs",
               "--worker-arg=8", "--port", "0", "--population", str(population),
               "--truncation", "3", "--elite-candidates", str(candidates), "--elite-episodes",
               str(episodes), "--generations", "2", "--max-episode-steps", "40",
               "--noise-table-size", str(2**23), "--quiet", "--run-dir", str(run_dir)]  # fmt: skip
    done = subprocess.run(command, env=worker_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["generation"] for line in lines] == [0, 1]
    for line in lines:
        # Every evaluation recorded, none failed: N offspring + K candidates x E episodes.
        assert line["generation_evaluations"] == population + candidates * episodes
        assert line["failed_evaluations"] == 0
        assert np.isfinite(line["elite_score"])


async def _sigterm_with_many_tasks_in_flight(tmp_path: Path) -> dict:
    # 6 candidates x 300 CartPole episodes in tasks of 50: the batched worker leases 8 + 1.
    config = long_elite_tasks(
        lease_seconds=60.0, population_size=8, elite_candidates=6, episodes_per_task=50
    )
    async with live_master(config, tmp_path / "run") as live:
        fleet = live.trainer.fleet
        first = spawn_worker(live.port, "batched", "--device", "cpu", "--envs", "8")
        second = None
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                held = fleet.tasks_leased_to("batched")
                if sum("/e/" in t for t in held) >= 4:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the batched worker never held 4 elite tasks at once")
            held_before = len(held)
            first.send_signal(signal.SIGTERM)
            while first.poll() is None and time.monotonic() < deadline + 15:
                await asyncio.sleep(0.02)
            after = fleet.counters()
            second = spawn_worker(live.port, "second", "--device", "cpu", "--envs", "8")
            records = await asyncio.wait_for(live.training, 180)
            return {"exit": first.returncode, "held_before": held_before, "after": after,
                    "records": records}  # fmt: skip
        finally:
            stop_processes([p for p in (first, second) if p is not None])


@pytest.mark.slow
def test_sigterm_hands_back_every_task_in_flight(tmp_path: Path, noise_cache: Path) -> None:
    outcome = asyncio.run(_sigterm_with_many_tasks_in_flight(tmp_path))
    assert outcome["exit"] == 0
    assert outcome["held_before"] >= 4
    # Handed back at once with Release, not left to lapse after 60 s.
    assert outcome["after"].leased == 0 and outcome["after"].pending >= 4
    (record,) = outcome["records"]
    assert record.generation_evaluations == 8 + 6 * 300
    assert record.leases_reissued == 0 and record.failed_evaluations == 0


async def _batched_worker_joins_an_int8_run(tmp_path: Path) -> dict:
    config = long_elite_tasks(inference_dtype="int8", population_size=8)
    async with live_master(config, tmp_path / "run") as live:
        fleet = live.trainer.fleet
        worker = spawn_worker(live.port, "batched", "--device", "cpu", "--envs", "4",
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            _, stderr = await asyncio.to_thread(worker.communicate, timeout=60)
            counters = fleet.counters()
            table = fleet._phases.table
            attempts = [r.attempts for r in table._records.values()] if table else []
            return {"exit": worker.returncode, "stderr": stderr, "counters": counters,
                    "attempts": attempts}  # fmt: skip
        finally:
            stop_processes([worker])


def test_a_batched_worker_hands_back_a_run_it_cannot_play_and_stops(tmp_path: Path) -> None:
    # Failing each task instead would spend the tasks' attempts (NaN after max_task_attempts)
    # on a worker that can run none of them.
    outcome = asyncio.run(_batched_worker_joins_an_int8_run(tmp_path))
    assert outcome["exit"] == 2
    assert "float32 only" in outcome["stderr"] and "'int8'" in outcome["stderr"]
    assert outcome["counters"].leased == 0 and outcome["counters"].pending == 8
    assert outcome["attempts"] and not any(outcome["attempts"])
