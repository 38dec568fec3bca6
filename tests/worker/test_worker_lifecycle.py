"""A real worker process: SIGTERM hands its tasks back; it waits for a master that is away."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.harness import live_master
from tests.support.processes import free_port, spawn_worker, stop_processes
from tests.support.tiny import long_elite_tasks, tiny_cartpole

pytestmark = pytest.mark.slow


async def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _sigterm_mid_task(tmp_path: Path) -> dict:
    async with live_master(long_elite_tasks(lease_seconds=60.0), tmp_path / "run") as live:
        fleet = live.trainer.fleet
        first = spawn_worker(live.port, "first")
        second = None
        try:

            def first_holds_elite_tasks() -> bool:
                return any("/e/" in t for t in fleet.tasks_leased_to("first"))

            await wait_for(first_holds_elite_tasks, 60, "the worker to lease an elite task")
            await asyncio.sleep(0.3)  # well inside a 300-episode task
            held_before = fleet.counters().leased
            first.send_signal(signal.SIGTERM)
            await wait_for(lambda: first.poll() is not None, 15, "the worker to exit")
            after = fleet.counters()
            second = spawn_worker(live.port, "second")
            records = await asyncio.wait_for(live.training, 120)
            return {
                "exit_code": first.returncode,
                "held_before": held_before,
                "after": after,
                "records": records,
            }
        finally:
            stop_processes([p for p in (first, second) if p is not None])


def test_sigterm_hands_tasks_back_and_exits(tmp_path: Path, noise_cache: Path) -> None:
    outcome = asyncio.run(_sigterm_mid_task(tmp_path))
    assert outcome["exit_code"] == 0
    assert outcome["held_before"] >= 1
    # Nothing stays leased to the departed worker: its tasks are pending again at once,
    # not after a 60 s lease lapse.
    assert outcome["after"].leased == 0 and outcome["after"].pending >= 1
    (record,) = outcome["records"]
    assert record.generation_evaluations == 4 + 2 * 300
    assert record.leases_reissued == 0 and record.failed_evaluations == 0
    assert record.workers_lost == 0  # it said goodbye: handed back, then closed its presence


async def _sigkill_mid_task(tmp_path: Path) -> dict:
    async with live_master(long_elite_tasks(lease_seconds=60.0), tmp_path / "run") as live:
        fleet = live.trainer.fleet
        first = spawn_worker(live.port, "first")
        second = None
        try:

            def first_holds_elite_tasks() -> bool:
                return any("/e/" in t for t in fleet.tasks_leased_to("first"))

            await wait_for(first_holds_elite_tasks, 60, "the worker to lease an elite task")
            await wait_for(lambda: fleet.workers_attached() == 1, 10, "the worker's presence")
            await asyncio.sleep(0.3)  # well inside a 300-episode task
            killed = time.monotonic()
            first.kill()  # no goodbye: only its closed connection tells the master
            await wait_for(lambda: fleet.counters().leased == 0, 10, "its leases to end")
            noticed = time.monotonic() - killed
            second = spawn_worker(live.port, "second")
            records = await asyncio.wait_for(live.training, 120)
            return {"noticed": noticed, "records": records}
        finally:
            stop_processes([p for p in (first, second) if p is not None])


def test_a_killed_worker_s_tasks_go_to_others_at_once_not_when_its_lease_lapses(
    tmp_path: Path, noise_cache: Path
) -> None:
    outcome = asyncio.run(_sigkill_mid_task(tmp_path))
    assert outcome["noticed"] < 5.0  # the lease was 60 s
    (record,) = outcome["records"]
    assert record.generation_evaluations == 4 + 2 * 300 and record.failed_evaluations == 0
    assert record.workers_lost == 1 and record.leases_reissued >= 1


async def _master_comes_up_late(tmp_path: Path) -> tuple[int, int | None]:
    port = free_port()
    worker = spawn_worker(port, "early")
    try:
        await asyncio.sleep(2.0)  # the worker retries with backoff meanwhile
        assert worker.poll() is None, "the worker gave up on a master that was away"
        config = tiny_cartpole(target_score=None)
        async with live_master(config, tmp_path / "run", train=False, port=port) as live:
            records = await asyncio.wait_for(live.trainer.run(), 120)
            deadline = time.monotonic() + 30
            while worker.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return len(records), worker.poll()
    finally:
        stop_processes([worker])


def test_a_worker_started_before_its_master_waits_and_then_works(
    tmp_path: Path, noise_cache: Path
) -> None:
    generations, exit_code = asyncio.run(_master_comes_up_late(tmp_path))
    assert generations == 2
    assert exit_code == 0  # it left on its own when the run completed


def test_the_master_imports_and_serves_without_torch(tmp_path: Path) -> None:
    script = f"""
import asyncio, sys
sys.modules["torch"] = None  # any import of torch now fails
from master.cli import main
from master.config import inspect_env_id, preset
from master.run.start import start_master

async def serve():
    config = preset(inspect_env_id("Frostbite-v4"), generations=1)
    master = await start_master(config, {str(tmp_path / "run")!r}, port=0, out=None)
    await master.stop(0)
    return master.port

assert asyncio.run(serve()) > 0
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
