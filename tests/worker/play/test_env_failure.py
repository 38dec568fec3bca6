"""A worker that cannot build the run's env reports it, keeps running, and is passed over."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

import worker.play.envs
from tests.support.harness import live_master
from tests.support.processes import spawn_worker, stop_processes
from tests.support.tiny import tiny_cartpole
from worker.client import WorkerClient
from worker.evaluation.evaluator import Evaluator

pytestmark = pytest.mark.slow


async def _run(tmp_path: Path, broken: WorkerClient) -> tuple[list, dict]:
    config = tiny_cartpole(population_size=8, target_score=None)
    async with live_master(config, tmp_path / "run") as live:
        broken.address = live.address
        thread = threading.Thread(target=broken.run, daemon=True)
        thread.start()
        # The broken worker asks first and fails its tasks; then a working one joins.
        deadline = time.monotonic() + 30
        while broken.counters.tasks_failed == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        failed_before_help = broken.counters.tasks_failed
        good = spawn_worker(live.port, "good")
        try:
            records = await asyncio.wait_for(live.training, 120)
        finally:
            broken.stop()
            stop_processes([good])
    await asyncio.to_thread(thread.join, 15)
    return records, {"failed_before_help": failed_before_help, "alive": thread.is_alive()}


def test_env_build_failures_are_reported_and_the_env_is_not_handed_to_that_worker_again(
    tmp_path: Path, noise_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cannot_build(env_id, dynamics="paper"):
        raise RuntimeError(f"no emulator for {env_id} on this host")

    monkeypatch.setattr(worker.play.envs, "make_env", cannot_build)
    broken = WorkerClient("unset", "broken", Evaluator(), prefetch=1)
    records, outcome = asyncio.run(_run(tmp_path, broken))
    assert outcome["failed_before_help"] >= 1 and not outcome["alive"]
    # It failed what it first leased (at most slots + prefetch tasks), then got no more.
    assert broken.counters.tasks_failed <= 2 and broken.counters.tasks_done == 0
    assert "CartPole-v1" in broken.held.unsupported_envs
    # Its failures were retried elsewhere: every evaluation of the run has a real score.
    assert [r.generation for r in records] == [0, 1]
    assert all(r.failed_evaluations == 0 and r.generation_evaluations == 8 + 2 * 2 for r in records)
