"""A run plays nothing ahead of the generation that spends its budget: those offspring would
be thrown away, and in a study the fleet would play them instead of other runs' tasks.

An in-process loop here is the only worker, leasing every task the master offers and scoring
each episode 10 frames, so that every phase spends the same frames and the run's end falls at
a known generation whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from master.config import inspect_env_id, preset
from master.fleet.fleet import Fleet
from master.fleet.phases import TaskOutcome
from master.run.rundir import read_metrics
from master.run.start import start_master

FRAMES_PER_EPISODE = 10
SETTINGS = {"population_size": 12, "truncation": 3, "elite_candidates": 3, "elite_episodes": 4,
            "generations": None, "target_score": None, "seed": 5}  # fmt: skip
GENERATION_FRAMES = (12 + 3 * 4) * FRAMES_PER_EPISODE


def _train(run_dir: Path, **budget: int) -> tuple[list[str], int]:
    """Trains with the overlap to the budget; returns every task id leased and how many tasks
    a phase found played ahead."""
    config = preset(inspect_env_id("CartPole-v1"), **SETTINGS, **budget)

    async def main() -> tuple[list[str], int]:
        master = await start_master(config, run_dir, out=None, overlap=True)
        fleet = master.trainer.fleet
        assert isinstance(fleet, Fleet)
        leased: list[str] = []
        training = asyncio.ensure_future(master.trainer.run())
        try:
            deadline = time.monotonic() + 60
            while not training.done():
                assert time.monotonic() < deadline
                tasks = fleet.lease("w", 256)
                leased += [task.task_id for task in tasks]
                fleet.report_many("w", [
                    TaskOutcome(task.task_id, (float(len(task.task_id)),) * task.episodes,
                                FRAMES_PER_EPISODE * task.episodes)
                    for task in tasks
                ])  # fmt: skip
                await asyncio.sleep(0.001)
            await training
        finally:
            training.cancel()
            await master.stop(0)
        return leased, fleet._phases.played_ahead

    return asyncio.run(main())


def test_no_offspring_are_played_ahead_of_the_generation_that_spends_the_frames(
    tmp_path: Path,
) -> None:
    leased, played_ahead = _train(tmp_path / "run", frames=3 * GENERATION_FRAMES)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["generation"] for r in records] == [0, 1, 2]
    assert records[-1]["frames"] == 3 * GENERATION_FRAMES
    # Generation 1 played generation 2's offspring ahead (all but the carried elite), so the
    # overlap was on; generation 2, the last, played none of a generation 3.
    assert played_ahead == 11
    assert [t for t in leased if t.startswith("g3/")] == []
