"""Checkpoint writes that fail (a full disk, no file descriptor left) are logged, tried again
and survived: the run goes on, and its files catch up once writes succeed again."""

from __future__ import annotations

import asyncio
import errno
import json
import time
from pathlib import Path

import pytest

from master.run import trainer as trainer_module
from master.run.checkpoint import CURRENT, load_checkpoint
from master.run.rundir import read_metrics
from master.run.trainer import CheckpointNotWritten
from tests.support.fleet_calls import lease, report, result
from tests.support.harness import live_master
from tests.support.tiny import tiny_cartpole

GENERATIONS = 4
TEST_S = 60.0


class Disk:
    """The run dir's writes as the trainer makes them, failing with ENOSPC while `full`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, run_dir) -> None:
        self.full = False
        self.failed: dict[str, int] = {"checkpoint": 0, "metrics": 0}
        save_checkpoint = trainer_module.save_checkpoint
        append_metrics = run_dir.append_metrics

        def checkpoint(path: Path, payload: dict) -> None:
            self._check("checkpoint")
            save_checkpoint(path, payload)

        def metrics(record) -> None:
            self._check("metrics")
            append_metrics(record)

        monkeypatch.setattr(trainer_module, "save_checkpoint", checkpoint)
        monkeypatch.setattr(run_dir, "append_metrics", metrics)

    def _check(self, what: str) -> None:
        if self.full:
            self.failed[what] += 1
            raise OSError(errno.ENOSPC, "No space left on device")


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + TEST_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {TEST_S} s"
        await asyncio.sleep(0.01)


async def work(stub, training: asyncio.Future) -> None:
    """A well-behaved worker: plays every task it gets until the run is over."""
    while not training.done():
        response = await lease(stub, "w", 64)
        if response.run_complete:
            return
        if response.tasks:
            await report(stub, [result(task) for task in response.tasks], "w")
        else:
            await asyncio.sleep(0.01)


def test_a_full_disk_for_a_while_is_survived_and_the_checkpoint_catches_up(
    tmp_path, monkeypatch, caplog
):
    """The issue's reproduction: the run dir's disk is full while the master waits for
    workers, then stays full over two generations' ends, then is freed."""
    monkeypatch.setattr(trainer_module, "RETRY_FIRST_S", 0.05)
    config = tiny_cartpole(generations=GENERATIONS, population_size=8, elite_episodes=2,
                           target_score=None)  # fmt: skip
    run_dir = tmp_path / "run"

    async def main() -> list:
        async with live_master(config, run_dir, train=False, checkpoint_seconds=0.2) as live:
            trainer = live.trainer
            disk = Disk(monkeypatch, trainer.run_dir)
            disk.full = True
            training = live.start_training()
            # Waiting for workers, the periodic checkpoint fails, and fails again.
            await until(lambda: trainer.write_failures >= 3, "failed periodic writes")
            worker = asyncio.ensure_future(work(live.stub(), training))
            await until(lambda: len(trainer.records) >= 2 or training.done(), "2 generations")
            assert not training.done()
            assert disk.failed["metrics"] >= 1  # a generation's files failed too
            disk.full = False
            records = await asyncio.wait_for(training, TEST_S)
            await worker
            assert trainer.write_failures == 0
            return records

    records = asyncio.run(main())
    assert [r.generation for r in records] == list(range(GENERATIONS))
    # Every generation's line, once each and in order, and a checkpoint of the end.
    lines = read_metrics(run_dir / "metrics.jsonl")
    assert [line["generation"] for line in lines] == list(range(GENERATIONS))
    assert load_checkpoint(run_dir)["algorithm"]["state"]["generation"] == GENERATIONS
    assert "No space left on device" in caplog.text and "the run goes on" in caplog.text
    assert "checkpoint written again after" in caplog.text


def test_a_last_checkpoint_that_cannot_be_written_is_an_error_naming_why(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "RETRY_FIRST_S", 0.01)
    config = tiny_cartpole(generations=1, population_size=4, elite_episodes=1,
                           elite_candidates=1, target_score=None)  # fmt: skip
    run_dir = tmp_path / "run"

    async def main() -> None:
        async with live_master(config, run_dir, train=False, checkpoint_seconds=3600) as live:
            disk = Disk(monkeypatch, live.trainer.run_dir)
            # Full from the start, not from the generation's end: a fast machine would write
            # the last checkpoint before a test that waited for the generation filled the disk.
            disk.full = True
            training = asyncio.ensure_future(live.trainer.run())  # its error is this test's
            worker = asyncio.ensure_future(work(live.stub(), training))
            with pytest.raises(CheckpointNotWritten, match="No space left on device"):
                await asyncio.wait_for(training, TEST_S)
            worker.cancel()
            # Each of the last tries failed on the disk (the generation's files go first).
            assert sum(disk.failed.values()) >= trainer_module.FINAL_TRIES

    asyncio.run(main())
    # The run dir holds no checkpoint of a run it could not save: nothing half-written.
    assert not (run_dir / CURRENT).exists() or json.loads((run_dir / CURRENT).read_text())
