"""A cancel that arrives just as the awaited thing happens is never lost.

On Python 3.11, asyncio.wait_for returns the inner result when the cancel and the result land
in the same loop iteration, and drops the cancel. Each test below sets up exactly that
moment: the run's own end (a checkpoint just before the mirror closes; a SIGTERM as the last
result comes in) must still stop what it cancels.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import boto3
import pytest

from master.algorithms.ga import EvaluationRequest, Genome
from master.fleet.fleet import Fleet
from master.fleet.phases import FleetSettings, TaskOutcome
from master.run.s3_mirror import MirrorLoop, RunDirMirror

WAIT_S = 10.0
"""Longer than any of these steps takes; shorter than the mirror's 60 s interval."""


def mirror_loop(run_dir: Path) -> MirrorLoop:
    boto3.client("s3").create_bucket(Bucket="runs")
    run_dir.mkdir()
    (run_dir / "checkpoint.json").write_text("{}")
    return MirrorLoop(RunDirMirror("s3://runs/r"), run_dir, lambda: {"generation": 1}, 60.0)


async def first_sync(syncer: MirrorLoop) -> None:
    syncer.start()
    async with asyncio.timeout(WAIT_S):
        while syncer.syncs < 1:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)  # back in its wait for the next request


def test_the_mirror_closes_when_a_checkpoint_lands_just_before(
    aws_endpoint: str, tmp_path: Path
) -> None:
    async def main() -> None:
        syncer = mirror_loop(tmp_path / "run")
        await first_sync(syncer)
        task = syncer._task
        assert task is not None
        # The run's last checkpoint asks for a sync; the master closes the mirror at once.
        syncer.checkpointed()
        async with asyncio.timeout(WAIT_S):
            assert await syncer.close(5.0)
        assert task.done()
        assert syncer.syncs == 2  # the first and the final one, no periodic one after

    asyncio.run(main())


def test_a_cancelled_close_of_the_mirror_stays_cancelled(aws_endpoint: str, tmp_path: Path) -> None:
    async def main() -> None:
        syncer = mirror_loop(tmp_path / "run")
        await first_sync(syncer)
        closing = asyncio.ensure_future(syncer.close(5.0))
        await asyncio.sleep(0)  # close() has cancelled the loop and waits for it to end
        closing.cancel()  # e.g. the process is told to stop right then
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(WAIT_S):
                await closing
        assert syncer.syncs == 1  # no final sync ran after the cancel

    asyncio.run(main())


def test_a_cancel_as_the_phase_completes_stops_the_phase() -> None:
    async def main() -> None:
        fleet = Fleet(FleetSettings(run_id="r", run_seed=1, lease_seconds=30.0))
        request = EvaluationRequest("k0", Genome((1,)), 1)
        phase = asyncio.ensure_future(fleet.evaluate([request]))
        await asyncio.sleep(0)
        (task,) = fleet.lease("w", 1)
        # The last result and a SIGTERM in the same loop iteration: the cancel wins.
        fleet.report_many("w", [TaskOutcome(task.task_id, (1.0,), 10)])
        phase.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(WAIT_S):
                await phase

    asyncio.run(main())
