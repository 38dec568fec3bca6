"""A real master, a real worker, and beside them a worker that fails every task it gets: the
run completes with every evaluation scored, and the broken worker shows in the worker table."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time

from tests.support.harness import live_master
from tests.support.processes import REPO, spawn_worker, stop_processes, worker_env
from tests.support.tiny import tiny_cartpole

TOKEN = "failing-worker-test-token-3c81"
GENERATIONS = 3


async def until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds} s")
        await asyncio.sleep(0.05)


def test_a_worker_failing_every_task_beside_a_real_one_costs_the_run_no_evaluation(tmp_path):
    config = tiny_cartpole(generations=GENERATIONS, population_size=24, truncation=4,
                           elite_candidates=2, elite_episodes=4, target_score=None,
                           lease_seconds=30.0, seed=3)  # fmt: skip
    env = {"NEURO_TOKEN": TOKEN}

    async def scenario() -> tuple[list, dict]:
        async with live_master(config, tmp_path / "run", train=False, token=TOKEN) as live:
            fleet = live.trainer.fleet
            worker = spawn_worker(live.port, "healthy", env=env)
            broken = subprocess.Popen(
                [sys.executable, "-m", "tests.support.failing_worker", "--master", live.address,
                 "--worker-id", "broken", "--give-up-after", "120"],
                env={**worker_env(), **env}, cwd=REPO, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                # Both ask for work before the first phase opens, as a fleet's workers do.
                await until(lambda: {"healthy", "broken"} <= {w.worker_id for w in
                                                              fleet.worker_stats()},
                            60, "both workers")  # fmt: skip
                records = await asyncio.wait_for(live.start_training(), 120)
                stats = {w.worker_id: w for w in fleet.worker_stats()}
                out, _ = await asyncio.to_thread(broken.communicate, timeout=30)
            finally:
                stop_processes([worker, broken])
        return records, {"stats": stats, "out": out}

    records, seen = asyncio.run(scenario())
    assert [r.generation for r in records] == list(range(GENERATIONS))
    for record in records:
        assert record.failed_evaluations == 0, record
        assert math.isfinite(record.score_mean) and math.isfinite(record.elite_score), record
    broken, healthy = seen["stats"]["broken"], seen["stats"]["healthy"]
    # It did get tasks (or copies) and failed them, and none of them cost a result.
    assert broken.tasks_failed >= 1 and seen["out"].strip() == f"failed {broken.tasks_failed}"
    assert broken.evaluations == 0
    assert healthy.evaluations == records[-1].evaluations
